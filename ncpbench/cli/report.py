"""`ncpbench report RUN [RUN...] --out DIR`: tables, survival plot and HTML report of run folders."""

from __future__ import annotations

import argparse
import sys

from ncpbench.metrics import DEFAULT_RESAMPLES


def _turns(text: str) -> list[int]:
    try:
        turns = sorted({int(t) for t in text.split(",") if t.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated turns, e.g. 5,10,20 (got {text!r})") from None
    if not turns or turns[0] <= 0:
        raise argparse.ArgumentTypeError("turns must be positive")
    return turns


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("report", help="metrics, survival plot and HTML report of run folders")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folders (run.json + episodes.jsonl)")
    p.add_argument("--out", required=True, help="output folder (index.html, tables, plots, metrics.json)")
    p.add_argument("--at", type=_turns, help="turns to report survival at, e.g. 5,10,20 "
                   "(default: 5,10,20,50,100 up to the turn limit, and the limit)")
    p.add_argument("--resamples", type=int, default=DEFAULT_RESAMPLES, help="bootstrap resamples (default 2000)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--title", default="ncpbench report", help="report title")
    p.add_argument("--prices", help="YAML/JSON price table {MODEL: [usd_per_1M_prompt, usd_per_1M_completion"
                   "(, usd_per_1M_cached_prompt)]}: adds estimated cost to the usage table")
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from ncpbench.cli.batch import load_prices
    from ncpbench.reports import RunFormatError, build_report

    prices = load_prices(args.prices)
    try:
        index = build_report(args.runs, args.out, at=args.at, resamples=args.resamples, seed=args.seed,
                             title=args.title, prices=prices)
    except (RunFormatError, OSError) as e:
        print(f"ncpbench report: {e}", file=sys.stderr)
        return 2
    import json

    from ncpbench.reports import MOCK_NOTICE

    metrics = json.loads((index.parent / "metrics.json").read_text(encoding="utf-8"))
    mocked = [r["name"] for r in metrics.get("runs", []) if not r.get("benchmark_result", True)]
    if mocked:
        print(f"note: {MOCK_NOTICE} ({', '.join(mocked)})", file=sys.stderr)
    for warning in metrics.get("warnings", []):
        if not warning.startswith(MOCK_NOTICE):
            print(f"warning: {warning}", file=sys.stderr)
    print(f"wrote {index.parent}/ (index.html, headline.md/.csv, comparison.md/.csv, genres.md/.csv, envs.md/.csv, "
          f"usage.md/.csv, survival.png/.svg, metrics.json)")
    print(f"open {index.resolve().as_uri()}")
    return 0
