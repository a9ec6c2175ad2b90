"""`ncpbench rescore RUN --auditor MODEL --out RUN2`: re-audit a finished run with another auditor."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ncpbench.cli.audit_eval import AUDITOR_FLAGS, auditor_role
from ncpbench.models.config import PROFILES, PROTOCOLS
from ncpbench.protocol import PUBLISHED


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("rescore", help="replay a finished run's replies and actions through another auditor",
                       description="Replays the narrator's replies and the player's actions of a finished run "
                                   "through a different auditor (no narrator or player model is called) and writes "
                                   "a normal run folder; `ncpbench report RUN RUN2` then shows auditor agreement.")
    p.add_argument("run", metavar="RUN", help="the finished run folder")
    p.add_argument("--auditor", metavar="MODEL", help="the new auditor, provider/model or module:attr")
    for flag, typ in AUDITOR_FLAGS.items():
        p.add_argument(f"--auditor-{flag}", type=typ,
                       help="auditor endpoint, e.g. http://localhost:8000/v1" if flag == "base-url" else argparse.SUPPRESS)
    p.add_argument("--profile", default=None, choices=sorted(PROFILES),
                   help="sampling defaults (default: what `ncpbench run` uses for the original run's protocol, "
                        "paper under published)")
    p.add_argument("--config", help="run config file; only its auditor section is used")
    p.add_argument("--mock", action="store_true", help="a dry run: without --auditor, use mock/default")
    p.add_argument("--concurrency", type=int, default=8, help="episodes at once (default 8)")
    p.add_argument("--skip-preflight", action="store_true",
                   help="do not probe the auditor's endpoint first (its key is checked all the same)")
    p.add_argument("--out", required=True, help="the new run folder")
    p.set_defaults(func=cmd_rescore)


def _original_protocol(run: str) -> str:
    """The protocol the original run was played under (published when run.json cannot say; a run
    folder that is not one is refused by the rescore itself, with its own message)."""
    try:
        config = json.loads((Path(run) / "run.json").read_text(encoding="utf-8")).get("config") or {}
    except (OSError, ValueError, AttributeError):
        return PUBLISHED.name
    protocol = config.get("protocol") if isinstance(config, dict) else None
    return protocol if isinstance(protocol, str) and protocol in PROTOCOLS else PUBLISHED.name


def cmd_rescore(args: argparse.Namespace) -> int:
    from ncpbench.cli.batch import batch_exit_code, breaker_message
    from ncpbench.preflight import EXIT_BREAKER, EXIT_REFUSED, check_number, check_out
    from ncpbench.rescore import rescore
    from ncpbench.runner import BREAKER_DEFAULT, RunError

    # Preflight as `ncpbench run` does: options, the auditor, --out here; its key and endpoint in
    # run_batch, before the folder exists (a missing key is exit 2 with nothing written).
    check_number("--concurrency", args.concurrency, ge=1, fix="give --concurrency at least 1 (0 would wait forever)")
    role = auditor_role(args, _original_protocol(args.run))
    check_out(args.out, "folder")
    try:
        result = rescore(args.run, role, args.out, concurrency=args.concurrency, probe=not args.skip_preflight)
    except RunError as e:
        print(f"ncpbench: {e}: check RUN and --out", file=sys.stderr)
        return EXIT_REFUSED
    p = result.progress
    code = batch_exit_code(p)
    if code == EXIT_BREAKER:
        print(breaker_message(p, BREAKER_DEFAULT), file=sys.stderr)
        return code
    print(f"re-audited {p.done} episode(s) of {args.run} with {role.model} into {args.out} "
          f"({p.conflicts} CONFLICT, {p.errors} ERROR)")
    print(f"compare: ncpbench report {args.run} {args.out} --out REPORT")
    return code
