"""Turns/s of the local executor next to the Ray executor with 1 and 2 workers (a benchmark, not a test).

Starts `ncpbench mock-server --latency-ms L` in its own process, then runs the same batch (the
first EPISODES bundled films, TURNS turns, the scripted player, --concurrency C) once per executor,
each in a fresh process. Ray's start-up (`ray.init(num_cpus=2)`) is outside the timed part.

    .venv/bin/python benchmarks/bench_ray.py --latency-ms 50 --episodes 32 --turns 5 --concurrency 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench_runner import free_port  # type: ignore[import-not-found]


def one(url: str, executor: str, workers: int, episodes: int, turns: int, concurrency: int, out: str) -> None:
    from ncpbench.models.config import RoleConfig, RunConfig
    from ncpbench.registry import bundled_slugs
    from ncpbench.runner import run_batch

    if executor == "ray":
        import ray

        ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    role = RoleConfig(model="mock/default", base_url=url, concurrency=64)
    config = RunConfig(narrator=role, player=role, auditor=role, player_mode="scripted")
    started = time.perf_counter()
    result = asyncio.run(run_batch(out, config, envs=bundled_slugs()[:episodes], max_turns=turns,
                                   concurrency=concurrency, executor=executor,
                                   ray_workers=workers if executor == "ray" else None))
    wall = time.perf_counter() - started
    print(json.dumps({"turns": result.progress.turns, "seconds": round(wall, 2),
                      "turns_per_s": round(result.progress.turns / wall, 1)}))


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
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "ncpbench", "mock-server", "--port", str(port),
                               "--latency-ms", str(args.latency_ms)], stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"{url}/models", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        print(f"mock server latency {args.latency_ms} ms; {args.episodes} episodes x {args.turns} turns; "
              f"concurrency {args.concurrency}")
        print("| executor | turns | seconds | turns/s |")
        print("|---|---:|---:|---:|")
        for executor, workers in (("local", 0), ("ray", 1), ("ray", 2)):
            with tempfile.TemporaryDirectory() as tmp:
                proc = subprocess.run([sys.executable, __file__, "--episodes", str(args.episodes), "--turns",
                                       str(args.turns), "--concurrency", str(args.concurrency), "--child", url,
                                       executor, str(workers), str(Path(tmp) / "run")],
                                      capture_output=True, text=True, check=True)
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            name = "local" if executor == "local" else f"ray, {workers} worker{'s' * (workers > 1)}"
            print(f"| {name} | {r['turns']} | {r['seconds']} | {r['turns_per_s']} |", flush=True)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
