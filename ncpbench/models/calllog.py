"""The audit trail of model calls: who asked what, when, and what came back.

Every HTTP attempt (and every cache hit) the ModelClient makes becomes one `CallEntry`, handed to
the client's call sink. The batch runner's sink is `CallLog`, which appends each entry as one
fsynced line of `calls.jsonl` in the run folder, so a model call is on disk before anything that
depends on it.

Which episode, turn, role and stage a call belongs to is carried by a context variable, bound with
`call_context(...)` around the code that makes the call (the episode driver binds the episode and
turn, the agents and the auditor bind role and stage). It nests: inner bindings refine outer ones.
Concurrent tasks (the auditor's parallel stages) each get their own copy, so they never mix.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

import structlog
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

    Also binds the same fields into structlog's context, so the log events of those calls carry
    them. Works in sync and async code; tasks created inside the block inherit the labels.
    """
    given = {k: v for k, v in {"episode": episode, "turn": turn, "role": role, "stage": stage}.items()
             if v is not None}
    ctx = replace(_CONTEXT.get(), **given)  # type: ignore[arg-type]
    token = _CONTEXT.set(ctx)
    try:
        with structlog.contextvars.bound_contextvars(**given):
            yield ctx
    finally:
        _CONTEXT.reset(token)


def messages_sha256(messages: Sequence[dict[str, str]]) -> str:
    """Identifies the exact rendered request (role and content of every message, in order)."""
    canonical = json.dumps([[m.get("role", ""), m.get("content", "")] for m in messages], ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


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
        # ensure_ascii keeps U+2028 and friends escaped: one entry is one line for every reader.
        self._handle.write(json.dumps(entry.model_dump(mode="json"), ensure_ascii=True) + "\n")
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
