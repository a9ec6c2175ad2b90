"""The audit trail of model calls: who asked what, when, and what came back.

Every HTTP attempt (and every cache hit) the ModelClient makes becomes one `CallEntry`, handed to
the client's call sink. The batch runner's sink is `CallLog`, which appends each entry as one
fsynced line of `calls.jsonl` in the run folder, so a model call is on disk before anything that
depends on it.

Which episode, turn, role and stage a call belongs to is carried by a context variable, bound with
`call_context(...)` around the code that makes the call (the episode driver binds the episode and
turn, the agents and the auditor bind role and stage). It nests: inner bindings refine outer ones.
Concurrent tasks (the auditor's parallel stages) each get their own copy, so they never mix. The
client's log events carry the same labels.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from pydantic import BaseModel, ConfigDict

from ncpbench.verdict import Usage

RESPONSE_CAP = 8000
"""Characters of a raw response body kept in calls.jsonl (a runaway body cannot bloat the log)."""


@dataclass(frozen=True)
class CallContext:
    episode: str | None = None
    turn: int | None = None
    role: str | None = None
    stage: str | None = None


_EMPTY = CallContext()
_CONTEXT: ContextVar[CallContext] = ContextVar("ncpbench_call_context", default=_EMPTY)  # frozen, so sharing it is safe


def current_context() -> CallContext:
    return _CONTEXT.get()


@contextlib.contextmanager
def call_context(*, episode: str | None = None, turn: int | None = None, role: str | None = None,
                 stage: str | None = None) -> Iterator[CallContext]:
    """Label the model calls made inside the block (fields left None keep the outer value).

    The client's log events carry the same labels (`context_fields`). Works in sync and async
    code; tasks created inside the block inherit the labels. One ContextVar set and reset: this
    runs around every model call, so it binds nothing else.
    """
    outer = _CONTEXT.get()
    ctx = CallContext(episode if episode is not None else outer.episode, turn if turn is not None else outer.turn,
                      role if role is not None else outer.role, stage if stage is not None else outer.stage)
    token = _CONTEXT.set(ctx)
    try:
        yield ctx
    finally:
        _CONTEXT.reset(token)


def context_fields() -> dict[str, str | int]:
    """The current labels that are set, for a log event (`log.info("x", **context_fields())`)."""
    ctx = _CONTEXT.get()
    return {k: v for k, v in (("episode", ctx.episode), ("turn", ctx.turn), ("role", ctx.role),
                              ("stage", ctx.stage)) if v is not None}


def messages_sha256(messages: Sequence[dict[str, str]]) -> str:
    """Identifies the exact rendered request (role and content of every message, in order).

    Each role and content is length-prefixed, so no two different conversations hash alike; no
    JSON is built (the prompts are tens of kilobytes and this runs on every call)."""
    h = hashlib.sha256()
    for m in messages:
        for part in (m.get("role", ""), m.get("content", "")):
            data = part.encode("utf-8", errors="surrogatepass")
            h.update(len(data).to_bytes(8, "little"))
            h.update(data)
    return h.hexdigest()


class CallEntry(BaseModel):
    """One line of calls.jsonl: one HTTP attempt, or one answer served from the response cache."""

    model_config = ConfigDict(extra="forbid")

    at: str
    """UTC time the attempt started (ISO 8601)."""
    call_id: str
    """Shared by the attempts of one logical call (retries of the same request)."""
    episode: str | None
    turn: int | None
    role: str | None
    stage: str | None
    model: str
    attempt: int
    """1 for the first HTTP request of a call, 2 for its first retry, ..."""
    reask: int = 0
    """0 for the first ask of a structured stage, 1 and 2 for its re-asks."""
    reask_reason: str | None = None
    """Why this request is a re-ask: the problems found in the previous answer."""
    outcome: str
    """`ok`, `cache_hit`, or what went wrong (`http 429`, `timeout`, `empty choices`, ...)."""
    retry: bool = False
    """True when the client tries again after this attempt."""
    latency_s: float | None
    status: int | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    messages_sha256: str
    response: str | None = None
    """The raw response body (redacted, capped at RESPONSE_CAP characters)."""
    response_chars: int | None = None
    """Length of the whole body, so a cap is visible."""


CallSink = Callable[[CallEntry], None]

_LINE_BREAKS = {0x85: "\\u0085", 0x2028: "\\u2028", 0x2029: "\\u2029"}
"""Characters JSON leaves raw that str.splitlines (and some editors and viewers) break lines at."""


def one_line(serialized: str) -> str:
    """A JSON text that is one line for every reader: the line breaks JSON may keep raw, escaped
    (the same text decodes to the same value; control characters are escaped by JSON already)."""
    return serialized.translate(_LINE_BREAKS)


class CallLog:
    """Appends entries to a JSON Lines file, each flushed and fsynced before the call returns.

    Opened in append mode: a resumed run adds lines after the ones already committed and never
    rewrites them. A torn final line (a kill mid-write) is cut before the first append.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        _cut_torn_line(self.path)
        self._handle: TextIO | None = self.path.open("a", encoding="utf-8")
        self.lines = 0

    def __call__(self, entry: CallEntry) -> None:
        if self._handle is None:
            return
        self._handle.write(one_line(entry.model_dump_json()) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self.lines += 1

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def __enter__(self) -> CallLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _cut_torn_line(path: Path) -> None:
    if not path.exists():
        return
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    with path.open("r+b") as f:
        f.truncate(data.rfind(b"\n") + 1)
        f.flush()
        os.fsync(f.fileno())


def read_calls(path: str | Path) -> list[CallEntry]:
    """Every whole line of a calls.jsonl (a torn last line is skipped)."""
    out: list[CallEntry] = []
    p = Path(path)
    if not p.exists():
        return out
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            out.append(CallEntry.model_validate_json(line))
        except ValueError:
            continue
    return out
