"""Only what pyproject.toml cannot say: ship `ncpbench-gymnasium.pth` at the top of site-packages.

The .pth file starts the Gymnasium plugin hook (`ncpbench_gym_hook.py`), since Gymnasium 1.x no
longer loads entry-point plugins itself. Everything else is in pyproject.toml.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "ncpbench-gymnasium.pth"


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(str(Path(__file__).parent / PTH), str(Path(self.build_lib) / PTH), preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib) / PTH)]


setup(cmdclass={"build_py": BuildPyWithPth})
