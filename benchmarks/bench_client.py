"""CPU per model call of the client paths the runner could take (a benchmark, not a test).

The throughput profile (bench_throughput.py --profile) puts most of the runner's CPU in the openai
SDK and its HTTP stack. This measures, side by side in one run against `ncpbench mock-server`
(its own process, so its CPU is not ours), the process CPU per call of:

- sdk:        what ModelClient.chat does now: `chat.completions.create(messages=..., extra_body=
              {"response_format": ...})`; the SDK walks `messages` through its TypedDict
              transforms and builds a ChatCompletion from the response;
- sdk-post:   `client.post("/chat/completions", body=..., cast_to=ChatCompletion)`: the same
              transport and response model, no request transform;
- sdk-raw:    `client.post(..., cast_to=httpx2.Response)` and `json.loads` of the body: no request
              transform, no response model (retries, timeouts and status errors are still the SDK's);
- httpx2:     the bare `httpx2.AsyncClient.post(json=...)`, no SDK;
- direct:     the shipped `DirectTransport` (ncpbench/models/transport.py) with `pydantic_core`
              encoding, what `ModelClient` uses for plain-http endpoints (transport `auto`);
- streams:    a minimal keep-alive HTTP/1.1 client on asyncio streams (the floor of the transport).

Each path makes the same auditor-sized request (a real conflict-check prompt layout, ~13,000
characters, and its JSON schema) at concurrency 1 and at concurrency 100 (one pool of 208
connections, as ModelClient sets it up for 100 episodes), plus the SDK-raw path with the
connections split over 8 clients (`sharded`), which shows what the pool's per-request scan of
every connection costs.

    .venv/bin/python benchmarks/bench_client.py --calls 600 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))  # finds _common under `python -m benchmarks.X` too
from _common import emit, mock_server, run_child, table_head, table_row


def sample_request() -> dict[str, Any]:
    """A conflict-check request as the pipeline builds it, from a real spec at turn 1."""
    from ncpbench.auditors import prompts
    from ncpbench.auditors.schemas import ConflictCheckOutput

    from ncpbench.dataset import load
    from ncpbench.models.client import schema_of
    from ncpbench.protocol import PUBLISHED
    from ncpbench.protocols import AuditRequest
    from ncpbench.state import EpisodeState

    spec = load(None)["the-prestige"]
    state = EpisodeState.initial(spec)
    reply = "The stage lights flare as the curtain rises. " * 20
    req = AuditRequest(spec=spec, state=state, player_action="I step onto the stage and look for the trapdoor.",
                       reply=reply, frontier=(spec.trajectory[0].id,), protocol=PUBLISHED)
    msgs = prompts.messages("conflict_check", req, prompts.candidate_changes([], []))
    fmt = {"type": "json_schema", "json_schema": {"name": "conflict_check", "schema": schema_of(ConflictCheckOutput)}}
    return {"model": "default", "messages": msgs, "temperature": 0.0, "seed": 0, "max_tokens": 800,
            "response_format": fmt}


class StreamsClient:
    """Keep-alive HTTP/1.1 POSTs over a pool of asyncio stream connections."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def post_json(self, path: str, payload: dict[str, Any]) -> Any:
        conn = self.idle.pop() if self.idle else await asyncio.open_connection(self.host, self.port)
        reader, writer = conn
        body = json.dumps(payload).encode()
        writer.write(f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        data = await reader.readexactly(length)
        self.idle.append(conn)
        return json.loads(data)

    async def close(self) -> None:
        for _, writer in self.idle:
            writer.close()


async def measure(url: str, path: str, calls: int, concurrency: int) -> float:
    """CPU ms per call of one path (process CPU over the whole run / calls)."""
    import httpx2
    import openai
    import pydantic_core
    from openai.types.chat import ChatCompletion

    from ncpbench.models.transport import DirectTransport

    body = sample_request()
    conns = concurrency + 8
    shards = 8 if path == "sharded" else 1
    https = [httpx2.AsyncClient(limits=httpx2.Limits(max_connections=max(2, conns // shards))) for _ in range(shards)]
    clients = [openai.AsyncOpenAI(base_url=url, api_key="not-needed", max_retries=4, timeout=120, http_client=h)
               for h in https]
    host, port = url.split("//")[1].split("/")[0].split(":")
    streams = StreamsClient(host, int(port))
    direct = DirectTransport(url, api_key="not-needed")
    counter = iter(range(10**9))

    async def one() -> None:
        i = next(counter)
        client = clients[i % shards]
        if path == "sdk":
            resp = await client.chat.completions.create(
                model=body["model"], messages=body["messages"], temperature=0.0, seed=0, max_tokens=800,
                extra_body={"response_format": body["response_format"]})
            text = resp.choices[0].message.content
        elif path == "sdk-post":
            comp = await client.post("/chat/completions", body=body, cast_to=ChatCompletion)
            text = comp.choices[0].message.content
        elif path in ("sdk-raw", "sharded"):
            raw = await client.post("/chat/completions", body=body, cast_to=httpx2.Response)
            text = json.loads(raw.content)["choices"][0]["message"]["content"]
        elif path == "direct":
            reply = await direct.post("/chat/completions", pydantic_core.to_json(body),
                                      {"Content-Type": "application/json"})
            text = json.loads(reply.body)["choices"][0]["message"]["content"]
        elif path == "httpx2":
            r = await https[0].post(url + "/chat/completions", json=body)
            text = r.json()["choices"][0]["message"]["content"]
        else:
            text = (await streams.post_json("/v1/chat/completions", body))["choices"][0]["message"]["content"]
        assert text

    gate = asyncio.Semaphore(concurrency)

    async def gated() -> None:
        async with gate:
            await one()

    await asyncio.gather(*(gated() for _ in range(min(20, calls))))  # warm up: connections, imports
    started = time.process_time()
    await asyncio.gather(*(gated() for _ in range(calls)))
    cpu = time.process_time() - started
    for c in clients:
        await c.close()
    await streams.close()
    await direct.aclose()
    return cpu / calls * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=600)
    ap.add_argument("--latency-ms", type=float, default=50)
    ap.add_argument("--repeat", type=int, default=3, help="rounds over every cell, interleaved; the median is shown")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        url, path, calls, conc = args.child
        emit({"ms": asyncio.run(measure(url, path, int(calls), int(conc)))})
        return
    with mock_server(args.latency_ms) as url:
        size = sum(len(m["content"]) for m in sample_request()["messages"])
        print(f"{args.calls} calls per cell, request of {size:,} prompt characters, mock latency "
              f"{args.latency_ms:g} ms; process CPU ms per call")
        paths = ("sdk", "sdk-post", "sdk-raw", "sharded", "httpx2", "direct", "streams")
        cells = [(p, c) for p in paths for c in (1, 100) if not (p == "sharded" and c == 1)]
        results: dict[tuple[str, int], list[float]] = {cell: [] for cell in cells}
        for _ in range(args.repeat):  # interleaved rounds: a burst of load elsewhere hits every path alike
            for path, conc in cells:
                calls = args.calls if conc == 100 else max(50, args.calls // 6)
                results[(path, conc)].append(run_child(__file__, "--child", url, path, calls, conc)["ms"])
        print(f"median of {args.repeat} interleaved rounds (min-max)")
        print(table_head("path", "concurrency 1", "concurrency 100"))
        for path in paths:
            row = []
            for conc in (1, 100):
                got = sorted(results.get((path, conc), []))
                row.append(f"{statistics.median(got):.2f} ({got[0]:.2f}-{got[-1]:.2f})" if got else "—")
            print(table_row(path, *row), flush=True)


if __name__ == "__main__":
    main()
