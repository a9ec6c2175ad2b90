"""Turns/s of the local executor next to the Ray executor with 1 and 2 workers (a benchmark, not a test).

Starts `ncpbench mock-server --latency-ms L` in its own process, then runs the same batch (the
first EPISODES bundled films, TURNS turns, the scripted player, --concurrency C) once per executor,
each in a fresh process. Ray's start-up (`ray.init(num_cpus=2)`) is outside the timed part.

    .venv/bin/python benchmarks/bench_ray.py --latency-ms 50 --episodes 32 --turns 5 --concurrency 32
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # finds _common under `python -m benchmarks.X` too
from _common import emit, mock_server, run_child, table_head, table_row, timed


def one(url: str, executor: str, workers: int, episodes: int, turns: int, concurrency: int, out: str) -> None:
    from ncpbench.models.config import RoleConfig, RunConfig
    from ncpbench.registry import bundled_slugs
    from ncpbench.runner import run_batch

    if executor == "ray":
        import ray

        ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    role = RoleConfig(model="mock/default", base_url=url, concurrency=64)
    config = RunConfig(narrator=role, player=role, auditor=role, player_mode="scripted")
    with timed() as t:
        result = asyncio.run(run_batch(out, config, envs=bundled_slugs()[:episodes], max_turns=turns,
                                       concurrency=concurrency, executor=executor,
                                       ray_workers=workers if executor == "ray" else None))
    emit({"turns": result.progress.turns, "seconds": round(t.wall_s, 2),
          "turns_per_s": round(result.progress.turns / t.wall_s, 1)})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--latency-ms", type=float, default=50)
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        url, executor, workers, out = args.child
        one(url, executor, int(workers), args.episodes, args.turns, args.concurrency, out)
        return
    with mock_server(args.latency_ms) as url:
        print(f"mock server latency {args.latency_ms} ms; {args.episodes} episodes x {args.turns} turns; "
              f"concurrency {args.concurrency}")
        print(table_head("executor", "turns", "seconds", "turns/s"))
        for executor, workers in (("local", 0), ("ray", 1), ("ray", 2)):
            with tempfile.TemporaryDirectory() as tmp:
                r = run_child(__file__, "--episodes", args.episodes, "--turns", args.turns, "--concurrency",
                              args.concurrency, "--child", url, executor, workers, Path(tmp) / "run")
            name = "local" if executor == "local" else f"ray, {workers} worker{'s' * (workers > 1)}"
            print(table_row(name, r["turns"], r["seconds"], r["turns_per_s"]), flush=True)


if __name__ == "__main__":
    main()
