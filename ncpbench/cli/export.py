"""`ncpbench export RUN --format sft|preference --out FILE`: training data from run folders.

See `ncpbench.export` for the formats.
"""

from __future__ import annotations

import argparse
import sys

from ncpbench.export import FORMATS, ExportError, export


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("export", help="training data (JSONL) from a run folder or episode records")
    p.add_argument("run", help="a run folder, an episodes.jsonl, a record JSON, or (preference) a branches.jsonl")
    p.add_argument("--format", required=True, choices=FORMATS,
                   help="sft: chat examples of replies that passed the audit; "
                        "preference: passed/failed reply pairs from branch searches (branches.jsonl)")
    p.add_argument("--out", required=True, help="the JSONL file to write")
    p.add_argument("--dataset", help="spec folder the records were played on (default: bundled)")
    p.add_argument("--skip-opening", action="store_true", help="sft: leave out the openings (turn 0)")
    p.add_argument("--no-metadata", action="store_true", help="write only the training fields, no metadata")
    p.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    try:
        n = export(args.run, args.format, args.out, dataset=args.dataset, include_opening=not args.skip_opening,
                   metadata=not args.no_metadata)
    except ExportError as e:
        print(f"ncpbench export: {e}", file=sys.stderr)
        return 1
    kind = "examples" if args.format == "sft" else "pairs"
    print(f"wrote {n} {args.format} {kind} to {args.out}")
    if n == 0:
        print("note: nothing to export" + (" (no branch search had both a passing and a failing reply)"
                                           if args.format == "preference" else " (no committed replies)"),
              file=sys.stderr)
    return 0

