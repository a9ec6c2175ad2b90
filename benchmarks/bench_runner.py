"""Runner throughput against the loopback mock server (a benchmark, not a test).

Starts `ncpbench mock-server --latency-ms L` in its own process (so its CPU is not ours), then
for each concurrency runs a batch of max(concurrency, 8) episodes x TURNS turns in a fresh
process and reports turns/s, this process's CPU time per turn (everything outside the model
server: env, audit pipeline, client, checkpoints) and its peak RSS.

    .venv/bin/python benchmarks/bench_runner.py --latency-ms 50 --concurrency 1 8 32 128
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # finds _common under `python -m benchmarks.X` too
from _common import emit, mock_server, peak_rss_mb, run_child, table_head, table_row, timed


def one(url: str, concurrency: int, turns: int, out: str) -> None:
    """Child process: one batch, then a JSON line with the measurements."""
    from ncpbench.models.config import RoleConfig, RunConfig
    from ncpbench.registry import bundled_slugs
    from ncpbench.runner import run_batch

    role = RoleConfig(model="mock/default", base_url=url, concurrency=max(64, concurrency * 2))
    config = RunConfig(narrator=role, player=role, auditor=role)
    slugs = bundled_slugs()
    episodes = max(concurrency, 8)
    envs = slugs[: min(len(slugs), episodes)]
    replicates = -(-episodes // len(envs))
    with timed() as t:
        result = asyncio.run(run_batch(out, config, envs=envs, replicates=replicates, max_turns=turns,
                                       concurrency=concurrency))
    n_turns = result.progress.turns
    # At concurrency 1 nothing else runs while a call is in flight, so the CPU spent inside model
    # calls (the openai client: request building, HTTP, JSON) can be told apart from ours.
    outside = (t.cpu_s - result.client_cpu_s) / n_turns * 1000 if concurrency == 1 else None
    emit({"concurrency": concurrency, "episodes": len(result.records), "turns": n_turns,
          "seconds": round(t.wall_s, 2), "turns_per_s": round(n_turns / t.wall_s, 1),
          "cpu_ms_per_turn": round(t.cpu_s / n_turns * 1000, 2),
          "cpu_ms_outside_calls": round(outside, 2) if outside is not None else None,
          "calls": result.call_stats["calls"], "peak_rss_mb": peak_rss_mb()})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--latency-ms", type=float, default=50)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        url, conc, out = args.child
        one(url, int(conc), args.turns, out)
        return
    with mock_server(args.latency_ms) as url:
        print(f"mock server latency {args.latency_ms} ms per call; {args.turns} turns per episode")
        print(table_head("concurrency", "episodes", "steps", "seconds", "steps/s", "CPU ms/step (whole runner)",
                         "CPU ms/step outside model calls", "peak RSS MB", left=0))
        base = None
        for c in args.concurrency:
            with tempfile.TemporaryDirectory() as tmp:
                r = run_child(__file__, "--turns", args.turns, "--child", url, c, Path(tmp) / "run")
            base = base or r["turns_per_s"]
            print(table_row(c, r["episodes"], r["turns"], r["seconds"],
                            f"{r['turns_per_s']} (x{r['turns_per_s'] / base:.1f})", r["cpu_ms_per_turn"],
                            r["cpu_ms_outside_calls"] or "—", r["peak_rss_mb"]), flush=True)


if __name__ == "__main__":
    main()
