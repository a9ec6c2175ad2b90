import sys

from ncpbench.cli import main

sys.exit(main())
