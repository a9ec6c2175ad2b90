"""The `ncpbench` command: a thin face over the Python API, one module per sub-command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ncpbench.cli import audit_eval, batch, build, catalog, export, lint, mock, play, report, run, validate
from ncpbench.logs import configure


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ncpbench", description="Narrative Commitment Preservation benchmark")
    parser.add_argument("--log-level", default="WARNING", help="structlog level (default WARNING)")
    parser.add_argument("--log-json", action="store_true", help="log JSON lines to stderr")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (catalog, validate, lint, run, batch, play, mock, report, build, export, audit_eval):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from ncpbench.validation import SpecError

    parser = build_parser()
    args = parser.parse_args(argv)
    configure(args.log_level, args.log_json)
    try:
        return int(args.func(args) or 0)
    except SpecError as e:
        for f in e.findings:
            print(f, file=sys.stderr)
        return 1
    except KeyError as e:
        print(f"ncpbench: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ncpbench: interrupted", file=sys.stderr)
        return 130
