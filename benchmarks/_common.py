"""Scaffolding the benchmark scripts share (not a benchmark itself).

Each script runs as `python benchmarks/bench_x.py`, which puts this folder first on sys.path, so
`from _common import ...` finds this file; the scripts also insert the folder themselves, so
`python -m benchmarks.bench_x` works as well.

- `mock_server(latency_ms, *extra_args)`: `ncpbench mock-server` in its own process (its CPU is
  not the benchmark's), yielding its base URL once `GET {url}/models` answers;
- `run_child(script, *args)` and `emit(result)`: a measurement in a fresh process, which prints
  its result as the last line of its stdout, one JSON object;
- `timed()` and `peak_rss_mb()`: wall time, process CPU time and peak RSS of a measurement;
- `table_head(...)` and `table_row(...)`: markdown table lines.
"""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def free_port() -> int:
    """A loopback TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until_up(url: str, server: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """Poll `GET {url}/models` until it answers; raise if the server exits or stays silent."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=1):
                return
        except OSError:
            if server.poll() is not None:
                raise RuntimeError(f"mock server exited with code {server.returncode} before answering") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"mock server at {url} did not answer within {timeout_s:g} s") from None
            time.sleep(0.1)


@contextmanager
def mock_server(latency_ms: float, *extra_args: str) -> Iterator[str]:
    """Run `ncpbench mock-server --latency-ms L EXTRA...` on a free port; yield its base URL (`.../v1`).

    The server is terminated (and reaped) when the block ends, however it ends.
    """
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "ncpbench", "mock-server", "--port", str(port),
                               "--latency-ms", str(latency_ms), *extra_args], stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_until_up(url, server)
        yield url
    finally:
        server.terminate()
        server.wait()


def run_child(script: str | Path, *args: object) -> dict[str, Any]:
    """Run `python SCRIPT ARGS...` in a fresh process and return the JSON object on its last stdout line.

    A fresh process per measurement keeps imports, caches and peak RSS of one run out of the next.
    If the child fails, exit with the tail of its stderr (the traceback is what one needs to see).
    """
    proc = subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"child failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def emit(result: dict[str, Any]) -> None:
    """The child's side of `run_child`: print the result as one JSON line (the last one it prints)."""
    print(json.dumps(result))


@dataclass
class Timing:
    """Filled in when the `timed()` block ends."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    """CPU time of this process (all threads), user + system."""


@contextmanager
def timed() -> Iterator[Timing]:
    """Measure the wall time and the process CPU time of the block."""
    timing = Timing()
    cpu, wall = time.process_time(), time.perf_counter()
    try:
        yield timing
    finally:
        timing.wall_s = time.perf_counter() - wall
        timing.cpu_s = time.process_time() - cpu


def peak_rss_mb(who: int = resource.RUSAGE_SELF) -> float:
    """Peak resident set size in MB, of this process or (RUSAGE_CHILDREN) its largest reaped child."""
    return round(resource.getrusage(who).ru_maxrss / 1024, 1)  # Linux reports KiB


def table_head(*columns: str, left: int = 1) -> str:
    """A markdown table's header and alignment lines; the first `left` columns align left, the rest right."""
    align = ["---" if i < left else "---:" for i in range(len(columns))]
    return f"{table_row(*columns)}\n|{'|'.join(align)}|"


def table_row(*cells: object) -> str:
    """One markdown table line."""
    return "| " + " | ".join(str(c) for c in cells) + " |"
