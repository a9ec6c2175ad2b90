"""`ncpbench run --envs ... --out runs/NAME` (batch, resumable) and `ncpbench merge`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from ncpbench.models.config import ConfigError, load_config_file
from ncpbench.preflight import (
    EXIT_BREAKER,
    EXIT_BUDGET,
    EXIT_ERRORS,
    EXIT_OK,
    EXIT_REFUSED,
    PreflightError,
    check_number,
    check_out,
)
from ncpbench.pricing import Price, parse_prices
from ncpbench.runner import BatchResult, Budget, Progress, RunError, merge_runs, run_batch


def _shard(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise PreflightError(f"--shard {text!r} is not i/n", "write --shard i/n, e.g. 0/4") from None
    if not 0 <= i < n:
        raise PreflightError(f"--shard {text} is out of range", "need 0 <= i < n, e.g. 0/4 … 3/4")
    return i, n


def load_prices(path: str | None) -> dict[str, Price]:
    """The `--prices` file (YAML/JSON) as a price table; {} without one; ConfigError naming the flag."""
    if not path:
        return {}
    try:
        return parse_prices(load_config_file(path))
    except ValueError as e:
        raise ConfigError(f"--prices {path}: {e}",
                          "write `MODEL: [usd_per_1M_prompt, usd_per_1M_completion]` (optionally a cached price)") from None


def check_batch_options(args: argparse.Namespace) -> None:
    """Every numeric batch option in range, before anything is created."""
    check_number("--replicates", args.replicates, ge=1, fix="give --replicates a count of at least 1")
    check_number("--concurrency", args.concurrency, ge=1, fix="give --concurrency at least 1 (0 would wait forever)")
    check_number("--max-total-tokens", args.max_total_tokens, ge=1)
    check_number("--max-cost", args.max_cost, gt=0)
    check_number("--circuit-breaker", args.circuit_breaker, ge=0, fix="give --circuit-breaker N >= 1, or 0 to turn it off")
    check_number("--ray-workers", getattr(args, "ray_workers", None), ge=1)
    if getattr(args, "executor", "local") == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise ConfigError("--executor ray needs Ray, which is not installed", "pip install 'ncpbench[ray]'")
    elif getattr(args, "ray_address", None) or getattr(args, "ray_workers", None):
        raise ConfigError("--ray-address and --ray-workers need --executor ray", "add --executor ray")


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


def batch_exit_code(progress: Progress) -> int:
    """The exit code of a batch that ran (`ncpbench run --envs`, `ncpbench rescore`): the circuit
    breaker 6, the budget 5, any ERROR record 4, else 0. One function, so the commands cannot drift."""
    if progress.stopped_by_breaker:
        return EXIT_BREAKER
    if progress.stopped_by_budget:
        return EXIT_BUDGET
    if progress.errors:
        return EXIT_ERRORS
    return EXIT_OK


def breaker_message(progress: Progress, breaker: int) -> str:
    return (f"ncpbench: stopped: {breaker} episodes in a row failed with the same infrastructure error "
            f"({progress.stopped_by_breaker}): fix the endpoint or its key, then rerun the same command to resume "
            "(those episodes were not recorded)")


def cmd_batch(args: argparse.Namespace) -> int:
    from ncpbench.cli.run import (
        check_common,
        config_from_args,
        local_note,
        mock_note,
        preflight_roles,
        run_stoppable,
    )
    from ncpbench.dataset import load
    from ncpbench.runner import select_envs

    # Preflight, in order of cost: numbers, config and roles, environments, the folder, the endpoints.
    check_common(args)
    check_batch_options(args)
    shard = _shard(args.shard)
    config = config_from_args(args)
    budget = Budget(args.max_total_tokens, args.max_cost, load_prices(args.prices))
    if args.max_cost is not None and not budget.prices:
        raise PreflightError("--max-cost needs prices", "pass --prices prices.yaml ({MODEL: [usd_in, usd_out]})")
    select_envs(load(args.dataset), args.envs)
    check_out(args.out, "folder")
    preflight_roles(args, config)

    console = Console(stderr=True, highlight=False)
    for note in (local_note(config), mock_note(config)):
        if note:
            console.print(f"[yellow]{escape(note)}[/]", soft_wrap=True)
    show = not args.no_progress and not args.quiet and sys.stderr.isatty()
    live = Live(console=console, refresh_per_second=4, transient=False) if show else None

    def on_change(p: Progress) -> None:
        if live is not None:
            live.update(progress_table(p, budget))

    async def go() -> BatchResult:
        return await run_batch(args.out, config, envs=args.envs, replicates=args.replicates,
                               max_turns=100 if args.turns is None else args.turns, concurrency=args.concurrency,
                               seed=args.seed, shard=shard, dataset=args.dataset, retry_errors=args.retry_errors,
                               max_total_tokens=args.max_total_tokens, max_cost_usd=args.max_cost,
                               prices=budget.prices, on_change=on_change, turn_timeout_s=args.turn_timeout,
                               breaker=args.circuit_breaker, executor=args.executor, ray_address=args.ray_address,
                               ray_workers=args.ray_workers, probe=False)  # probed above, or --skip-preflight

    if live is not None:
        with live:
            result = run_stoppable(go())
    else:
        result = run_stoppable(go())
    p = result.progress
    if show:
        console.print(progress_table(p, budget))
    code = batch_exit_code(p)
    if code == EXIT_BREAKER:
        print(breaker_message(p, args.circuit_breaker), file=sys.stderr)
        return code
    state = "stopped by the budget" if p.stopped_by_budget else ("complete" if p.done == p.total else "partial")
    print(f"{result.out}: {p.done}/{p.total} episodes ({state}); {len(result.records)} finished now; "
          f"{p.conflicts} conflicts, {p.errors} errors; calls {result.call_stats.get('calls', 0)}, "
          f"retried {result.call_stats.get('retried', 0)}, failed {result.call_stats.get('failed', 0)}")
    if code == EXIT_BUDGET:
        print("ncpbench: stopped by the budget: rerun without --max-total-tokens / --max-cost to finish",
              file=sys.stderr)
    elif code == EXIT_ERRORS:
        print(f"ncpbench: {p.errors} episode(s) ended as ERROR (infrastructure; not scored): "
              "rerun with --retry-errors to retry them", file=sys.stderr)
    return code


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
        return EXIT_REFUSED
    print(f"{args.out}: merged {len(args.shards)} shards; status {merged['status']}")
    return 0
