"""Runner throughput, CPU per turn and memory at 100 concurrent episodes (a benchmark, not a test).

Starts `ncpbench mock-server --latency-ms 50` in its own process (its CPU is not counted), then
runs, each in a fresh process, 100 films x 10 turns at concurrency 100 through `run_batch`
(LLM player, narrator and the staged auditor against the mock; every committed turn
checkpointed) and reports turns/s, the runner process's CPU ms per turn (time.process_time) and
its peak RSS (resource.getrusage). With `--reference CMD` the published reference runner is run
the same way, side by side (CMD is a shell command with {base_url}, {films}, {turns},
{concurrency} and {out} placeholders; its turn count is taken as films x turns, its CPU and peak
RSS from RUSAGE_CHILDREN). Without it, ours is reported alone.

`--profile` adds one more batch under cProfile (timer: process CPU time, so waiting is not
counted), prints the top 25 functions by cumulative and by own time, and the runner's own CPU
grouped by where it goes (C builtins are charged to the Python function that called them).

    .venv/bin/python benchmarks/bench_throughput.py --profile
    .venv/bin/python benchmarks/bench_throughput.py --transports sdk direct
    .venv/bin/python benchmarks/bench_throughput.py --reference "python ref/run.py --base-url {base_url} ..."
"""

from __future__ import annotations

import argparse
import asyncio
import io
import pstats
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))  # finds _common under `python -m benchmarks.X` too
from _common import emit, mock_server, peak_rss_mb, run_child, table_head, table_row, timed


def batch(url: str, films: int, turns: int, concurrency: int, out: str, profile: str | None,
          transport: str = "auto") -> None:
    """Child process: one batch, then a JSON line with the measurements."""
    from ncpbench.models.config import RoleConfig, RunConfig
    from ncpbench.registry import bundled_slugs
    from ncpbench.runner import run_batch

    role = RoleConfig(model="mock/default", base_url=url, concurrency=max(64, concurrency * 2),
                      transport=transport)
    config = RunConfig(narrator=role, player=role, auditor=role)
    envs = bundled_slugs()[:films]
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile(time.process_time)
        prof.enable()
    with timed() as t:
        result = asyncio.run(run_batch(out, config, envs=envs, replicates=1, max_turns=turns, concurrency=concurrency))
    if prof is not None:
        prof.disable()
        prof.dump_stats(str(profile))
    steps = result.progress.turns  # every committed step, the openings included
    n_turns = sum(r.turns for r in result.records)
    outcomes: dict[str, int] = defaultdict(int)
    for r in result.records:
        outcomes[r.outcome.value] += 1
    emit({"episodes": len(result.records), "turns": n_turns, "steps": steps, "seconds": round(t.wall_s, 2),
          "cpu_s": round(t.cpu_s, 2), "calls": result.call_stats["calls"], "outcomes": outcomes,
          "peak_rss_mb": peak_rss_mb()})


def run_ours(url: str, args: argparse.Namespace, profile: str | None = None, transport: str = "auto") -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        return run_child(__file__, "--child", url, Path(tmp) / "run", "--films", args.films, "--turns", args.turns,
                         "--concurrency", args.concurrency, "--child-transport", transport,
                         *(["--child-profile", profile] if profile else []))


def run_reference(url: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = args.reference.format(base_url=url, films=args.films, turns=args.turns, concurrency=args.concurrency,
                                    out=str(Path(tmp) / "ref"))
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        with timed() as t:
            proc = subprocess.run(shlex.split(cmd), capture_output=True, text=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        sys.exit(f"reference runner failed:\n{proc.stderr[-3000:]}")
    return {"episodes": args.films, "turns": args.films * args.turns, "seconds": round(t.wall_s, 2),
            "cpu_s": round((after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime), 2),
            "peak_rss_mb": peak_rss_mb(resource.RUSAGE_CHILDREN)}


# -- where the CPU goes -----------------------------------------------------------------------------

GROUPS = [
    ("openai SDK (request building, response parsing)", ("/openai/",)),
    ("HTTP stack (httpx2, httpcore2, h11, anyio)", ("/httpx", "/httpcore", "/h11/", "/anyio/", "/sniffio/", "/certifi/")),
    ("direct transport (models/transport.py)", ("models/transport.py",)),
    ("pydantic (validation, model_copy, dumps)", ("/pydantic/", "/pydantic_core/")),
    ("json (stdlib)", ("/json/",)),
    ("asyncio event loop, sockets, selectors", ("/asyncio/", "selectors.py", "socket.py", "ssl.py")),
    ("auditor prompts (auditors/prompts.py)", ("auditors/prompts.py",)),
    ("agent prompts (agents/prompts.py)", ("agents/prompts.py",)),
    ("audit pipeline + schemas (auditors/)", ("auditors/",)),
    ("model client (ncpbench/models/client.py)", ("models/client.py",)),
    ("call log + redaction (models/calllog.py, models/redaction.py)", ("models/calllog.py", "models/redaction.py")),
    ("runner + checkpoints (runner.py, jsonl.py)", ("ncpbench/runner.py", "ncpbench/jsonl.py")),
    ("env, protocol, state, ledger, views", ("ncpbench/env.py", "ncpbench/protocol.py", "ncpbench/state.py",
                                             "ncpbench/ledger.py", "ncpbench/commitments.py", "ncpbench/views.py",
                                             "ncpbench/trajectory.py", "ncpbench/episode.py", "ncpbench/record.py",
                                             "ncpbench/verdict.py", "ncpbench/rewards.py")),
    ("networkx", ("/networkx/",)),
    ("spec loading (PyYAML, validation, dataset; once per batch)", ("/yaml/", "ncpbench/validation.py",
                                                                  "ncpbench/dataset.py", "ncpbench/spec.py",
                                                                  "ncpbench/registry.py")),
    ("logging (structlog, logging)", ("/structlog/", "/logging/")),
    ("other ncpbench / agents", ("ncpbench/", "agents/")),
]


OTHER = "other (stdlib, imports)"


def group_of(key: tuple[str, int, str]) -> str:
    path = key[0].replace("\\", "/")
    for name, needles in GROUPS:
        if any(n in path for n in needles):
            return name
    return OTHER


def breakdown(stats: pstats.Stats) -> dict[str, float]:
    """Own time per group. C builtins and stdlib helpers (typing, abc, copy, re, ...) are charged to
    the groups of their callers, up the call graph (weighted by the time each caller spent in them)."""
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    memo: dict[Any, dict[str, float]] = {}

    def dist(key: Any, depth: int) -> dict[str, float]:
        group = group_of(key)
        callers = raw[key][4] if key in raw else {}
        if group != OTHER or depth == 0 or not callers:
            return {group: 1.0}
        if key in memo:
            return memo[key]
        memo[key] = {group: 1.0}  # a cycle ends here
        total = sum(edge[3] for edge in callers.values()) or 1.0
        out: dict[str, float] = defaultdict(float)
        for caller, edge in callers.items():
            for g, w in dist(caller, depth - 1).items():
                out[g] += w * edge[3] / total
        memo[key] = dict(out)
        return memo[key]

    groups: dict[str, float] = defaultdict(float)
    for key, (_cc, _nc, tt, _ct, _callers) in raw.items():
        for g, w in dist(key, 6).items():
            groups[g] += tt * w
    return dict(groups)


def show_profile(path: str, cpu_ms_per_turn: float) -> None:
    for order in ("cumulative", "tottime"):
        buf = io.StringIO()
        pstats.Stats(path, stream=buf).strip_dirs().sort_stats(order).print_stats(25)
        text = buf.getvalue()
        print(f"\n### top 25 by {order}\n")
        print(text[text.find("   ncalls"):].rstrip())
    groups = breakdown(pstats.Stats(path))
    total = sum(groups.values())
    print(f"\n### runner CPU by where it goes (profiled CPU {total:.1f} s; ms/turn scaled to the unprofiled "
          f"{cpu_ms_per_turn:.2f} ms/turn)\n")
    print(table_head("where", "share", "ms/turn"))
    for name, t in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(table_row(name, f"{t / total:.1%}", f"{cpu_ms_per_turn * t / total:.2f}"))


def head(first: str) -> str:
    """The head of a table of `line` rows; `first` names its first column."""
    return table_head(first, "episodes", "turns", "seconds", "turns/s", "CPU ms/turn (runner process)", "peak RSS MB")


def line(name: str, r: dict[str, Any], base: dict[str, Any] | None) -> str:
    if not r["turns"]:
        return table_row(name, r["episodes"], 0, r["seconds"], f"no turn completed (outcomes {r.get('outcomes')})",
                         "—", "—")
    tps = r["turns"] / r["seconds"]
    ratio = f" (x{tps / (base['turns'] / base['seconds']):.1f})" if base else ""
    return table_row(name, r["episodes"], r["turns"], r["seconds"], f"{tps:.1f}{ratio}",
                     f"{r['cpu_s'] / r['turns'] * 1000:.2f}", r["peak_rss_mb"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--latency-ms", type=float, default=50)
    ap.add_argument("--films", type=int, default=100)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=100)
    ap.add_argument("--advance-every", type=int, default=3, help="the mock completes a plot node every N turns")
    ap.add_argument("--reference", help="command line of the published reference runner (see the docstring)")
    ap.add_argument("--profile", action="store_true", help="profile one more batch with cProfile")
    ap.add_argument("--keep-profile", help="with --profile: also save the pstats file here")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--child-profile", help=argparse.SUPPRESS)
    ap.add_argument("--child-transport", default="auto", help=argparse.SUPPRESS)
    ap.add_argument("--transports", nargs="*", default=[], choices=("sdk", "direct", "auto"),
                    help="also run the batch with each of these transports, then the default (auto) again")
    args = ap.parse_args()
    if args.child:
        batch(args.child[0], args.films, args.turns, args.concurrency, args.child[1], args.child_profile,
              args.child_transport)
        return
    with mock_server(args.latency_ms, "--advance-every", str(args.advance_every)) as url:
        print(f"{args.films} films x {args.turns} turns at concurrency {args.concurrency}; one loopback mock "
              f"endpoint, {args.latency_ms:g} ms per call")
        ours = run_ours(url, args)
        ref = run_reference(url, args) if args.reference else None
        print(head("runner"))
        if ref:
            print(line("reference", ref, None))
        print(line("ncpbench", ours, ref))
        print(f"ncpbench: {ours['steps']} steps (openings included), {ours['calls']} model calls, "
              f"outcomes {ours['outcomes']}")
        if not ref:
            print("no --reference given: the reference runner was not run; ncpbench alone")
        if args.transports:
            print("\nthe same batch per transport (RoleConfig.transport), then the default again; CPU ratio to "
                  "the first default batch:")
            print(head("transport"))
            print(line("auto (default)", ours, None))
            for transport in [*args.transports, "auto"]:
                r = run_ours(url, args, transport=transport)
                ratio = f" CPU x{r['cpu_s'] / r['turns'] / (ours['cpu_s'] / ours['turns']):.2f}" if r["turns"] else ""
                print(line(transport, r, None) + ratio, flush=True)
        if args.profile:
            with tempfile.TemporaryDirectory() as tmp:
                path = str(Path(tmp) / "batch.prof")
                prof = run_ours(url, args, profile=path)
                print(f"\nprofiled batch: {prof['turns']} turns in {prof['seconds']} s, CPU {prof['cpu_s']} s "
                      f"(profiler overhead included)")
                show_profile(path, ours["cpu_s"] / ours["turns"] * 1000)
                if args.keep_profile:
                    import shutil

                    shutil.copy(path, args.keep_profile)


if __name__ == "__main__":
    main()
