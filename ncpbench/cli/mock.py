"""`ncpbench mock-server`: the loopback OpenAI-compatible server, in the foreground."""

from __future__ import annotations

import argparse

from ncpbench.models.config import did_you_mean
from ncpbench.models.mock_server import FAULT_KINDS, MockConfig, MockServer
from ncpbench.preflight import PreflightError, check_number


def _turns(text: str) -> frozenset[int]:
    try:
        turns = frozenset(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated turns, e.g. 3,7 (got {text!r})") from None
    if any(t < 1 for t in turns):
        raise argparse.ArgumentTypeError("turns start at 1")
    return turns


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("mock-server", help="serve a loopback OpenAI-compatible mock (tests, dry runs, benchmarks)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8089)
    p.add_argument("--latency-ms", type=float, default=0.0)
    p.add_argument("--fault-rate", type=float, default=0.0, help="share of requests that fail")
    p.add_argument("--fault-kinds", default=",".join(FAULT_KINDS), help=f"subset of {','.join(FAULT_KINDS)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--conflict-turns", type=_turns, default=frozenset(), help="e.g. 3,7: plant a conflict at these turns")
    p.add_argument("--conflict-kind", default="fact", choices=["fact", "commitment", "player_input"])
    p.add_argument("--overturn-turns", type=_turns, default=frozenset(), help="the double check overturns at these turns")
    p.add_argument("--advance-every", type=int, default=1, help="complete a plot node every N turns (0 = never)")
    p.add_argument("--hang-s", type=float, default=5.0, help="how long a timeout fault hangs")
    p.set_defaults(func=cmd_mock)


def cmd_mock(args: argparse.Namespace) -> int:
    check_number("--port", args.port, ge=0, le=65535)
    check_number("--latency-ms", args.latency_ms, ge=0)
    check_number("--fault-rate", args.fault_rate, ge=0, le=1, fix="give --fault-rate a share from 0 to 1, e.g. 0.2")
    check_number("--advance-every", args.advance_every, ge=0)
    check_number("--hang-s", args.hang_s, ge=0)
    kinds = tuple(k for k in args.fault_kinds.split(",") if k)
    for k in kinds:
        if k not in FAULT_KINDS:
            raise PreflightError(f"unknown fault kind {k!r}{did_you_mean(k, FAULT_KINDS)}",
                                 f"--fault-kinds takes a subset of {','.join(FAULT_KINDS)}")
    config = MockConfig(latency_ms=args.latency_ms, fault_rate=args.fault_rate, fault_kinds=kinds, seed=args.seed,
                        conflict_turns=args.conflict_turns, conflict_kind=args.conflict_kind,
                        overturn_turns=args.overturn_turns, advance_every=args.advance_every, hang_s=args.hang_s)
    server = MockServer(config, host=args.host, port=args.port)
    print(f"mock server on {server.base_url} (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0
