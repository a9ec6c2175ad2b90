"""`ncpbench run --envs ... --out runs/NAME` (batch, resumable) and `ncpbench merge`."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table

from ncpbench.models.config import load_config_file
from ncpbench.pricing import Price, parse_prices
from ncpbench.runner import BatchResult, Budget, Progress, RunError, merge_runs, run_batch


def _shard(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise SystemExit(f"ncpbench: --shard takes i/n, e.g. 0/4 (got {text!r})") from None
    if not 0 <= i < n:
        raise SystemExit(f"ncpbench: --shard {text}: need 0 <= i < n")
    return i, n


def _prices(path: str | None) -> dict[str, Price]:
    if not path:
        return {}
    try:
        return parse_prices(load_config_file(path))
    except ValueError as e:
        raise SystemExit(f"ncpbench: --prices {path}: {e}") from None


def progress_table(p: Progress, budget: Budget) -> Table:
    t = Table(show_header=False, box=None)
    cost = budget.cost(p.by_model)
    t.add_row("episodes", f"{p.done}/{p.total} done ({p.skipped} from before), {p.alive} alive")
    t.add_row("outcomes", f"{p.conflicts} conflicts, {p.errors} errors")
    t.add_row("turns", str(p.turns))
    share = p.cached_share()
    t.add_row("tokens", f"{p.tokens:,}" + (f"  ({share:.0%} of prompt cached)" if share is not None else "")
              + (f"  (~${cost:.4f})" if cost is not None else ""))
    if p.stopped_by_budget:
        t.add_row("budget", "reached: no new work is started")
    return t


def cmd_batch(args: argparse.Namespace) -> int:
    from ncpbench.cli.run import config_from_args, local_note

    config = config_from_args(args)
    budget = Budget(args.max_total_tokens, args.max_cost, _prices(args.prices))
    if args.max_cost is not None and not budget.prices:
        raise SystemExit("ncpbench: --max-cost needs --prices")
    console = Console(stderr=True, highlight=False)
    note = local_note(config)
    if note:
        console.print(f"[yellow]{note}[/]")
    show = not args.no_progress and not args.quiet and sys.stderr.isatty()
    live = Live(console=console, refresh_per_second=4, transient=False) if show else None

    def on_change(p: Progress) -> None:
        if live is not None:
            live.update(progress_table(p, budget))

    async def go() -> BatchResult:
        return await run_batch(args.out, config, envs=args.envs, replicates=args.replicates,
                               max_turns=args.turns or 100, concurrency=args.concurrency, seed=args.seed,
                               shard=_shard(args.shard), dataset=args.dataset, retry_errors=args.retry_errors,
                               max_total_tokens=args.max_total_tokens, max_cost_usd=args.max_cost,
                               prices=budget.prices, on_change=on_change, turn_timeout_s=args.turn_timeout)

    try:
        if live is not None:
            with live:
                result = asyncio.run(go())
        else:
            result = asyncio.run(go())
    except RunError as e:
        print(f"ncpbench: {e}", file=sys.stderr)
        return 3
    p = result.progress
    console.print(progress_table(p, budget))
    state = "stopped by the budget" if p.stopped_by_budget else ("complete" if p.done == p.total else "partial")
    print(f"{result.out}: {p.done}/{p.total} episodes ({state}); {len(result.records)} finished now; "
          f"{p.conflicts} conflicts, {p.errors} errors; calls {result.call_stats.get('calls', 0)}, "
          f"retried {result.call_stats.get('retried', 0)}, failed {result.call_stats.get('failed', 0)}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("merge", help="join the shard folders of one run")
    p.add_argument("shards", nargs="+", help="run folders written with --shard i/n")
    p.add_argument("--out", required=True, help="the merged run folder")
    p.set_defaults(func=cmd_merge)


def cmd_merge(args: argparse.Namespace) -> int:
    try:
        merged = merge_runs([Path(s) for s in args.shards], Path(args.out))
    except RunError as e:
        print(f"ncpbench: {e}", file=sys.stderr)
        return 3
    print(f"{args.out}: merged {len(args.shards)} shards; status {merged['status']}")
    return 0
