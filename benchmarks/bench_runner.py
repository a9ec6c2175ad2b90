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
import json
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    started_cpu = time.process_time()
    started = time.perf_counter()
    result = asyncio.run(run_batch(out, config, envs=envs, replicates=replicates, max_turns=turns,
                                   concurrency=concurrency))
    wall = time.perf_counter() - started
    cpu = time.process_time() - started_cpu
    n_turns = result.progress.turns
    # At concurrency 1 nothing else runs while a call is in flight, so the CPU spent inside model
    # calls (the openai client: request building, HTTP, JSON) can be told apart from ours.
    outside = (cpu - result.client_cpu_s) / n_turns * 1000 if concurrency == 1 else None
    print(json.dumps({"concurrency": concurrency, "episodes": len(result.records), "turns": n_turns,
                      "seconds": round(wall, 2), "turns_per_s": round(n_turns / wall, 1),
                      "cpu_ms_per_turn": round(cpu / n_turns * 1000, 2),
                      "cpu_ms_outside_calls": round(outside, 2) if outside is not None else None,
                      "calls": result.call_stats["calls"],
                      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))


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
        print(f"mock server latency {args.latency_ms} ms per call; {args.turns} turns per episode")
        print("| concurrency | episodes | steps | seconds | steps/s | CPU ms/step (whole runner) "
              "| CPU ms/step outside model calls | peak RSS MB |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        base = None
        for c in args.concurrency:
            with tempfile.TemporaryDirectory() as tmp:
                proc = subprocess.run([sys.executable, __file__, "--turns", str(args.turns), "--child", url, str(c),
                                       str(Path(tmp) / "run")], capture_output=True, text=True, check=True)
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            base = base or r["turns_per_s"]
            print(f"| {c} | {r['episodes']} | {r['turns']} | {r['seconds']} | {r['turns_per_s']} "
                  f"(x{r['turns_per_s'] / base:.1f}) | {r['cpu_ms_per_turn']} | {r['cpu_ms_outside_calls'] or '—'} "
                  f"| {r['peak_rss_mb']} |", flush=True)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
