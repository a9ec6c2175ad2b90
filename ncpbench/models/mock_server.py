"""A loopback OpenAI-compatible server for tests, dry runs and benchmarks.

`/v1/chat/completions` answers each role plausibly from the request itself:
- the player (system prompt "You are playing ..."): a short first-person action;
- the narrator ("You are the narrator ..."): a reply that acknowledges the action and narrates
  the trigger event of the plot point it was asked to advance;
- an auditor stage (its prompt names `Audit stage: NAME`): JSON valid for that stage's schema.
  No conflict by default; `conflict_turns` plants one (quoting the reply), `overturn_turns` makes
  the double check overturn it; `advance_every` completes the first frontier node every N turns.
- a scripted stage (`scripted`, keyed by the json_schema name of the response format, else by the
  last `Audit stage: NAME` / `Build stage: NAME` marker): the next scripted content, popped in
  order; once a stage's list is empty the answers above apply again.

Faults are injected with probability `fault_rate`, seeded: 429 with Retry-After, 500, timeout
(the server hangs), connection reset, malformed JSON body, truncated JSON content, empty
content, and JSON that misses the schema. Standard library only, so it runs anywhere.

Prompt caching is modelled like a server's prefix cache: per episode, role and stage (the
`X-Ncpbench-Context` header our client sends to the mock; else per stage or role and system
prompt) the server remembers the previous prompt and reports the prefix the new one shares with
it (characters / 4) as cached tokens, in the dialect `cache_report` names: `openai` (and vLLM):
usage.prompt_tokens_details.cached_tokens; `llama.cpp`: timings.cache_n and timings.prompt_n;
`none`: not reported.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import re
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FAULT_KINDS = ("429", "500", "timeout", "reset", "malformed", "truncated", "empty", "schema_miss")
CONTENT_FAULTS = {"truncated", "empty", "schema_miss"}


@dataclass
class MockConfig:
    latency_ms: float = 0.0
    """Fixed latency added to every answer."""
    fault_rate: float = 0.0
    """Share of requests that fail (in one of `fault_kinds`)."""
    fault_kinds: tuple[str, ...] = FAULT_KINDS
    seed: int = 0
    conflict_turns: frozenset[int] = frozenset()
    """Turns at which the conflict check reports a conflict."""
    conflict_kind: str = "fact"
    conflict_rate: float = 0.0
    """Share of replies in which the conflict check also claims a conflict, picked by a hash of the
    reply's text (so one reply always gets the same verdict): lets a dry run tell candidates apart."""
    vary_narration: bool = False
    """Number every narration (`take N`), so asking again gives another text: a dry run of sampling."""
    overturn_turns: frozenset[int] = frozenset()
    """Turns at which the double check overturns the claimed conflict."""
    advance_every: int = 1
    """Complete the first frontier node every N turns (0 = never)."""
    hang_s: float = 5.0
    """How long a `timeout` fault hangs before answering."""
    retry_after_s: float = 0.05
    scripted: dict[str, list[str]] = field(default_factory=dict)
    """Per stage name, message contents returned in order (popped); an empty list falls back."""
    cache_report: str = "openai"
    """How cached prompt tokens are reported: `openai` (also vLLM's shape), `llama.cpp`, or `none`."""


@dataclass
class MockStats:
    requests: int = 0
    cached_tokens: int = 0
    """Cached prompt tokens reported over all answers."""
    faults: dict[str, int] = field(default_factory=dict)
    roles: dict[str, int] = field(default_factory=dict)


_TAKES = itertools.count(1)
_STAGE = re.compile(r"Audit stage: (\w+)")
_SCRIPT_STAGE = re.compile(r"(?:Audit|Build) stage: (\w+)")
_TURN = re.compile(r"^=== Now: turn (\d+) ===", re.M)
_FRONTIER = re.compile(r"^(?:Frontier|Current node): (.*)$", re.M)
_TO_JUDGE = re.compile(r"^Commitments to judge: (.*)$", re.M)
_DONE_AFTER = re.compile(r"^Plot nodes completed after this turn: (.*)$", re.M)
_COMMITMENT = re.compile(r"^- (c_\d+) \[\w+\] (.*)$", re.M)
_NODE = re.compile(r"\bs_\d+\b")
_FACT = re.compile(r"^- (f_\d+): ", re.M)
_REPLY = re.compile(r"<narrator_reply>\n?(.*?)\n?</narrator_reply>", re.S)
_CLAIMS = re.compile(r"^Claim (\d+):", re.M)
_ACTION = re.compile(r"now does: (.*)$", re.M)
_TRIGGER = re.compile(r"It happens when: (.*)$", re.M)
_ROLE = re.compile(r"You are playing (.+?) in ")

PLAYER_LINES = [
    "I try the nearest door and step through before anyone can stop me.",
    "I ask the person beside me what they are hiding, and I do not look away.",
    "I pocket the closest useful object and head for the exit.",
    "I announce that I already know how this ends, and act on it.",
    "I wait, watch, and listen for anything that gives the game away.",
]


def common_prefix(a: str, b: str) -> int:
    """Length of the prefix two strings share (bisection over slice comparisons: C speed)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _text(messages: list[dict[str, Any]]) -> tuple[str, str]:
    system = "\n".join(str(m.get("content", "")) for m in messages if m.get("role") == "system")
    user = "\n".join(str(m.get("content", "")) for m in messages if m.get("role") != "system")
    return system, user


def _stage_name(body: dict[str, Any], marker: re.Pattern[str]) -> str | None:
    """The stage a request is for: its json_schema name, else the last stage marker in the prompt
    (our prompts put the stage after the fenced reply, so the last mention is the real one)."""
    name = ((body.get("response_format") or {}).get("json_schema") or {}).get("name")
    if name is not None:
        return str(name)
    system, user = _text(body.get("messages") or [])
    found = marker.findall(system + "\n" + user)
    return found[-1] if found else None


def _scripted(body: dict[str, Any], cfg: MockConfig, lock: threading.Lock | None) -> str | None:
    """The next scripted content for the request's stage, if any is left."""
    if not cfg.scripted:
        return None
    name = _stage_name(body, _SCRIPT_STAGE)
    if name is None:
        return None
    with lock or threading.Lock():
        queue = cfg.scripted.get(name)
        return queue.pop(0) if queue else None


def answer_for(body: dict[str, Any], cfg: MockConfig, lock: threading.Lock | None = None) -> tuple[str, str]:
    """(role, content) for a chat request."""
    scripted = _scripted(body, cfg, lock)
    if scripted is not None:
        return "scripted", scripted
    messages = body.get("messages") or []
    system, user = _text(messages)
    stage_name = _stage_name(body, _STAGE)
    if stage_name:
        return "auditor", json.dumps(_audit(stage_name, user, cfg))
    if "You are the narrator" in system:
        action = _ACTION.search(user)
        trigger = _TRIGGER.search(user)
        lines = []
        if action:
            lines.append(f"You {action.group(1).removeprefix('I ').rstrip('.')}, and the world answers in kind.")
        else:
            lines.append("The story opens in a quiet moment before everything changes.")
        if trigger:
            lines.append(trigger.group(1).strip())
        if cfg.vary_narration:
            lines.append(f"(take {next(_TAKES)})")
        return "narrator", " ".join(lines)
    role = _ROLE.search(system)
    seed = sum(map(ord, user)) % len(PLAYER_LINES)
    who = role.group(1) if role else "someone"
    return "player", PLAYER_LINES[seed] if who else PLAYER_LINES[0]


def _audit(stage: str, user: str, cfg: MockConfig) -> dict[str, Any]:
    turn_m = _TURN.search(user)
    turn = int(turn_m.group(1)) if turn_m else 0
    replies = _REPLY.findall(user)  # the story log comes first: the reply under audit is the last one
    reply = replies[-1] if replies else ""
    if stage == "fact_update":
        return {"add": [], "negate": []}
    if stage == "conflict_check":
        hashed = int(hashlib.sha256(reply.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        if (turn in cfg.conflict_turns or hashed < cfg.conflict_rate) and reply.strip():
            facts = _FACT.findall(user)
            quote = " ".join(reply.split()[:6])
            return {"conflicts": [{"kind": cfg.conflict_kind, "target": facts[0] if facts and cfg.conflict_kind == "fact" else None,
                                   "evidence": quote, "reason": "planted by the mock server's conflict schedule"}]}
        return {"conflicts": []}
    if stage == "double_check":
        claims = [int(i) for i in _CLAIMS.findall(user)]
        confirmed = turn not in cfg.overturn_turns
        return {"decisions": [{"claim": i, "confirmed": confirmed,
                               "reason": "confirmed by the mock" if confirmed else "overturned by the mock"}
                              for i in claims]}
    if stage in ("trajectory_check", "trajectory_frontier"):
        frontier_m = _FRONTIER.search(user)
        frontier = [s.strip() for s in frontier_m.group(1).split(",") if s.strip()] if frontier_m else []
        advance = cfg.advance_every > 0 and turn % cfg.advance_every == 0
        done = frontier[:1] if advance and frontier and frontier[0] != "(none)" else []
        if stage == "trajectory_check":  # the published stage: the current node, trigger and key delta
            node = frontier[0] if frontier else ""
            return {"node": node, "trigger_happened": bool(done), "key_delta_happened": bool(done),
                    "evidence": "the reply narrates the trigger event" if done else ""}
        return {"completed": done, "evidence": "the reply narrates the trigger event" if done else ""}
    if stage == "commitment_status":
        # A plot-following judge: a commitment is SATISFIED once every node its line names is complete.
        ids_m = _TO_JUDGE.search(user)
        ids = [i.strip() for i in ids_m.group(1).split(",") if i.strip()] if ids_m else []
        done_m = _DONE_AFTER.search(user)
        after: set[str] = {n.strip() for n in done_m.group(1).split(",")} if done_m else set()
        nodes = {m.group(1): set(_NODE.findall(m.group(2))) for m in _COMMITMENT.finditer(user)}
        return {"judgements": {i: {"status": "SATISFIED" if nodes.get(i) and nodes[i] <= after else "PENDING",
                                   "evidence": sorted(nodes.get(i, set()) & after)} for i in ids}}
    if stage == "commitment_pending":
        return {"updates": []}
    return {}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; with Nagle on, keep-alive clients stall ~40 ms per
    # response on delayed ACKs, which would make the mock slower than the latency it claims.
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # silence the default stderr log
        return

    def _send(self, status: int, payload: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        if self._route().endswith("/models"):
            self._send(200, json.dumps({"object": "list", "data": [
                {"id": "default", "object": "model", "owned_by": "ncpbench-mock"}]}).encode())
        elif self._route().endswith("/stats"):
            s = self.server.stats
            self._send(200, json.dumps({"requests": s.requests, "faults": s.faults, "roles": s.roles}).encode())
        else:
            self._send(404, b'{"error": {"message": "not found"}}')

    def _route(self) -> str:
        return self.path.partition("?")[0].rstrip("/")  # a base URL's query (api-version=...) is not the route

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if not self._route().endswith("/chat/completions"):
            self._send(404, b'{"error": {"message": "not found"}}')
            return
        try:
            body = json.loads(raw)
        except json.JSONDecodeError:
            self._send(400, b'{"error": {"message": "request body is not JSON"}}')
            return
        cfg = self.server.config
        if self.server.on_request is not None:
            self.server.on_request(body)
        fault = self.server.draw_fault()
        if cfg.latency_ms:
            time.sleep(cfg.latency_ms / 1000)
        if fault == "429":
            self._send(429, b'{"error": {"message": "rate limited", "type": "rate_limit"}}',
                       {"Retry-After": f"{cfg.retry_after_s:g}"})
            return
        if fault == "500":
            self._send(500, b'{"error": {"message": "internal error"}}')
            return
        if fault == "timeout":
            time.sleep(cfg.hang_s)
        if fault == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()
            return
        if fault == "malformed":
            self._send(200, b'{"id": "x", "choices": [{"message": {"content": ')
            return
        role, content = answer_for(body, cfg, self.server.lock)
        with self.server.lock:
            self.server.stats.roles[role] = self.server.stats.roles.get(role, 0) + 1
        if fault == "truncated":
            content = content[: max(1, len(content) // 2)]
        elif fault == "empty":
            content = ""
        elif fault == "schema_miss":
            content = json.dumps({"unexpected": True}) if role == "auditor" else content
        prompt_tokens = sum(len(str(m.get("content", ""))) for m in body.get("messages", [])) // 4
        cached = min(prompt_tokens, self.server.shared_prefix(self._cache_key(body), body) // 4)
        payload: dict[str, Any] = {
            "id": f"mock-{self.server.stats.requests}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "default"),
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(content) // 4,
                      "total_tokens": prompt_tokens + len(content) // 4},
        }
        if cfg.cache_report == "openai":
            payload["usage"]["prompt_tokens_details"] = {"cached_tokens": cached}
        elif cfg.cache_report == "llama.cpp":
            payload["timings"] = {"cache_n": cached, "prompt_n": prompt_tokens - cached}
        with self.server.lock:
            self.server.stats.cached_tokens += cached if cfg.cache_report != "none" else 0
        self._send(200, json.dumps(payload).encode())

    def _cache_key(self, body: dict[str, Any]) -> str:
        label = self.headers.get("X-Ncpbench-Context") or ""
        if label.strip("|"):
            return label
        system, _ = _text(body.get("messages") or [])
        return f"{_stage_name(body, _SCRIPT_STAGE) or ''}|{system[:400]}"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 512

    def __init__(self, addr: tuple[str, int], config: MockConfig) -> None:
        super().__init__(addr, _Handler)
        self.config = config
        self.stats = MockStats()
        self.lock = threading.Lock()
        self.rng = random.Random(config.seed)
        self.on_request: Callable[[dict[str, Any]], None] | None = None
        self.prompts: dict[str, str] = {}
        """The last prompt per cache key (oldest evicted past MAX_PROMPTS)."""

    MAX_PROMPTS = 4096

    def shared_prefix(self, key: str, body: dict[str, Any]) -> int:
        """Characters the prompt shares with the previous prompt under `key`; remembers this one."""
        prompt = "".join(f"{m.get('role', '')}\n{m.get('content', '')}\n" for m in body.get("messages") or [])
        with self.lock:
            previous = self.prompts.pop(key, "")
            self.prompts[key] = prompt
            if len(self.prompts) > self.MAX_PROMPTS:
                self.prompts.pop(next(iter(self.prompts)))
        return common_prefix(previous, prompt)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (its timeout during a `timeout` fault) leaves a closed socket: the
        # late answer hits a broken pipe. That is the fault working, not a server error to print.
        import sys

        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)

    def draw_fault(self) -> str | None:
        with self.lock:
            self.stats.requests += 1
            if self.config.fault_rate <= 0 or self.rng.random() >= self.config.fault_rate:
                return None
            kind = self.rng.choice(self.config.fault_kinds)
            self.stats.faults[kind] = self.stats.faults.get(kind, 0) + 1
            return kind


class MockServer:
    """`with MockServer(MockConfig(...)) as server: server.base_url` — runs in a daemon thread."""

    def __init__(self, config: MockConfig | None = None, host: str = "127.0.0.1", port: int = 0,
                 on_request: Callable[[dict[str, Any]], None] | None = None) -> None:
        """`on_request` sees every parsed chat request before it is answered (benchmarks record
        prompts with it); it runs on the server's request threads."""
        self.config = config or MockConfig()
        self._server = _Server((host, port), self.config)
        self._server.on_request = on_request
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    @property
    def stats(self) -> MockStats:
        return self._server.stats

    def start(self) -> MockServer:
        self._thread = threading.Thread(target=self._server.serve_forever, name="ncpbench-mock", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> MockServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_shared: MockServer | None = None
_shared_lock = threading.Lock()


def shared_mock_server() -> MockServer:
    """The in-process mock that `mock/...` models use when no base URL is given."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = MockServer().start()
        return _shared
