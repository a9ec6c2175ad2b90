"""The `ncpbench` command: a thin face over the Python API, one module per sub-command.

`main` is the one error boundary: every user error becomes one line on stderr,
`ncpbench: what is wrong: how to fix`, with the exit code ncpbench.preflight documents; a
traceback appears only with `--debug`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from ncpbench.cli import (
    audit_eval,
    batch,
    build,
    catalog,
    export,
    lint,
    mock,
    play,
    report,
    rescore,
    run,
    validate,
)
from ncpbench.logs import configure
from ncpbench.preflight import EXIT_FINDINGS, EXIT_IO, EXIT_REFUSED, EXIT_SIGINT, EXIT_USAGE


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line with the way out, not the whole usage block."""

    def error(self, message: str) -> NoReturn:
        print(f"ncpbench: {message}: see `{self.prog} --help`", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="ncpbench", description="Narrative Commitment Preservation benchmark")
    parser.add_argument("--log-level", default="WARNING", help="structlog level (default WARNING)")
    parser.add_argument("--log-json", action="store_true", help="log JSON lines to stderr")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error (for bug reports)")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (catalog, validate, lint, run, batch, play, mock, report, rescore, build, export, audit_eval):
        module.register(sub)
    return parser


def fail(what: str, fix: str, code: int = EXIT_USAGE) -> int:
    print(f"ncpbench: {what}: {fix}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    from ncpbench.cli.run import Stopped
    from ncpbench.models.config import ConfigError
    from ncpbench.preflight import PreflightError
    from ncpbench.runner import RunError, RunIOError
    from ncpbench.validation import SpecError

    parser = build_parser()
    raw = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in raw  # accepted anywhere on the line, not only before the sub-command
    try:
        args = parser.parse_args([a for a in raw if a != "--debug"])
    except SystemExit as e:  # --help (0) or a usage error already printed as one line (2)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    args.debug = debug
    if args.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        return fail(f"--log-level {args.log_level!r} is not a level", "use DEBUG, INFO, WARNING, ERROR or CRITICAL")
    configure(args.log_level, args.log_json)
    try:
        return int(args.func(args) or 0)
    except SpecError as e:
        for f in e.findings:
            print(f, file=sys.stderr)
        return EXIT_FINDINGS
    except PreflightError as e:
        if args.debug:
            raise
        return fail(e.what, e.fix, e.code)
    except ConfigError as e:
        if args.debug:
            raise
        return fail(e.what, e.fix)
    except RunError as e:
        if args.debug:
            raise
        print(f"ncpbench: {e}", file=sys.stderr)
        return EXIT_REFUSED
    except RunIOError as e:
        if args.debug:
            raise
        print(f"ncpbench: {e}", file=sys.stderr)
        return EXIT_IO
    except KeyError as e:  # an unknown slug from the dataset: its message already says what to do
        if args.debug:
            raise
        print(f"ncpbench: {e.args[0] if e.args else e}", file=sys.stderr)
        return EXIT_USAGE
    except Stopped as e:
        print("ncpbench: stopped; rerun the same command to resume", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print("ncpbench: stopped; rerun the same command to resume", file=sys.stderr)
        return EXIT_SIGINT
    except OSError as e:
        if args.debug:
            raise
        where = f" {e.filename}" if e.filename else ""
        return fail(f"cannot use{where}: {e.strerror or e}", "check the path and its permissions", EXIT_IO)
    except Exception as e:
        if args.debug:
            raise
        from ncpbench.models.client import redact

        first = redact(str(e)).splitlines()[0] if str(e) else ""
        return fail(f"internal error: {type(e).__name__}: {first}",
                    "rerun with --debug for the traceback and report it", EXIT_FINDINGS)
