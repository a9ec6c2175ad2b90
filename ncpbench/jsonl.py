"""JSON Lines as ncpbench writes and reads them: one record, exactly one line.

Writers use `jsonl_line`. Every reader goes through `iter_jsonl`, so the runner, the report and
export agree on which lines count:

- a line that is not UTF-8, not JSON, not an object, or refused by the caller's `accept` test is
  *bad*; the last line of a file without its newline is *torn* (a kill mid-append);
- `strict=False` (tolerant, the default) skips bad and torn lines and tells `on_bad` about each;
- `strict=True` raises `JsonlError` on a bad line; a torn last line is still only reported, since
  every crash can leave one.

`repair_jsonl` (called by a runner that holds the folder's lock) moves the bad and torn lines to
`<file>.quarantine` and rewrites the file atomically, so what remains is whole records and the next
append starts on a fresh line. Nothing is deleted: a quarantined line can still be inspected.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ncpbench.logs import get_logger

log = get_logger("ncpbench.jsonl")

_LINE_BREAKS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\u0085": "\\u0085"})
MAX_LINE_BYTES = 64_000_000
"""A line longer than this is not a record ncpbench wrote (records are bounded by the reply caps)."""


def jsonl_line(data: dict[str, Any], *, sort_keys: bool = False) -> str:
    """One record as exactly one line, whatever a reader splits on.

    json.dumps escapes C0 controls but, with ensure_ascii=False, leaves U+2028, U+2029 and U+0085
    raw; str.splitlines (and JavaScript) treat those as line breaks, so they are escaped too. They
    only ever occur inside JSON strings, where the escape means the same character.
    """
    return json.dumps(data, ensure_ascii=False, sort_keys=sort_keys).translate(_LINE_BREAKS) + "\n"


class JsonlError(ValueError):
    """A damaged line in strict mode: `path:line: reason`."""


@dataclass(frozen=True)
class BadLine:
    """A line a reader skipped, and why."""

    path: Path
    lineno: int
    reason: str
    raw: bytes
    torn: bool
    """The last line of the file, without its newline: what a kill mid-append leaves."""

    def __str__(self) -> str:
        what = "torn last line" if self.torn else "damaged line"
        return f"{self.path.name}:{self.lineno}: {what} ({self.reason})"


Accept = Callable[[dict[str, Any]], str | None]
"""Returns None for a line the caller wants, else the reason it is refused."""


def _judge(raw: bytes, accept: Accept | None) -> tuple[dict[str, Any] | None, str]:
    if len(raw) > MAX_LINE_BYTES:
        return None, f"over {MAX_LINE_BYTES} bytes"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        return None, f"not JSON: {e.msg}"
    except RecursionError:
        return None, "not JSON: nested too deeply"
    if not isinstance(data, dict):
        return None, f"a JSON {type(data).__name__}, not an object"
    reason = accept(data) if accept else None
    if reason is not None:
        return None, reason
    return data, ""


def scan_jsonl(path: Path, *, accept: Accept | None = None) -> Iterator[tuple[int, dict[str, Any] | None, BadLine | None]]:
    """(line number, object or None, bad line or None) for every non-blank line, streaming."""
    if not path.exists():
        return
    with path.open("rb") as f:
        lineno = 0
        for raw in f:
            lineno += 1
            torn = not raw.endswith(b"\n")
            body = raw.strip()
            if not body:
                continue
            data, reason = _judge(body, accept)
            if data is None and torn and reason.startswith("not JSON"):
                reason = "incomplete"
            yield lineno, data, (BadLine(path, lineno, reason, raw, torn) if data is None else None)


def iter_jsonl(path: Path, *, strict: bool = False, accept: Accept | None = None,
               on_bad: Callable[[BadLine], None] | None = None) -> Iterator[dict[str, Any]]:
    """The accepted JSON objects of a file, in order (see the module docstring for strict/tolerant)."""
    for _, data, bad in scan_jsonl(path, accept=accept):
        if bad is not None:
            if strict and not bad.torn:
                raise JsonlError(f"{path}:{bad.lineno}: {bad.reason}")
            if on_bad is not None:
                on_bad(bad)
            continue
        assert data is not None
        yield data


def quarantine_path(path: Path) -> Path:
    return path.with_name(path.name + ".quarantine")


def repair_jsonl(path: Path, *, accept: Accept | None = None) -> list[BadLine]:
    """Move bad and torn lines to `<file>.quarantine`, keep the good ones; return what was moved.

    Call only while holding the folder's lock. The quarantine file is appended and fsynced before
    the file is replaced (temp file, fsync, rename), so a kill at any moment loses no line.
    """
    if not path.exists():
        return []
    bad = [b for _, _, b in scan_jsonl(path, accept=accept) if b is not None]
    if not bad:
        if path.stat().st_size and not _ends_with_newline(path):
            with path.open("ab") as f:  # a whole last line that lost only its newline
                f.write(b"\n")
                f.flush()
                os.fsync(f.fileno())
        return []
    with quarantine_path(path).open("ab") as q:
        for b in bad:
            q.write(b.raw if b.raw.endswith(b"\n") else b.raw + b"\n")
        q.flush()
        os.fsync(q.fileno())
    skip = {b.lineno for b in bad}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with path.open("rb") as src, tmp.open("wb") as dst:
        for lineno, raw in enumerate(src, start=1):
            if lineno not in skip and raw.strip():
                dst.write(raw if raw.endswith(b"\n") else raw + b"\n")
        dst.flush()
        os.fsync(dst.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
    for b in bad:
        log.warning("jsonl_line_quarantined", file=str(path), line=b.lineno, reason=b.reason, torn=b.torn,
                    quarantine=str(quarantine_path(path)))
    return bad


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def write_jsonl(rows: Iterable[BaseModel], path: Path) -> None:
    """Models as JSON Lines, keys sorted, so the same rows always give byte-identical files."""
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(jsonl_line(row.model_dump(mode="json"), sort_keys=True))


_RECORD_KEYS = ("env_id", "title", "genres", "turns", "max_turns", "progress", "satisfied_share", "final_state")
"""The required fields of an EpisodeRecord (the report validates the whole record on top)."""


def episode_line(data: dict[str, Any]) -> str | None:
    """`accept` test for episodes.jsonl, shared by the runner and the report reader."""
    from ncpbench.state import Outcome

    if not isinstance(data.get("episode_id"), str) or not data["episode_id"]:
        return "no episode_id"
    if data.get("outcome") not in {o.value for o in Outcome}:
        return "no valid outcome"
    missing = [k for k in _RECORD_KEYS if k not in data]
    if missing:
        return f"not an episode record (no {', '.join(missing)})"
    return None


def fsync_dir(folder: Path) -> None:
    """Make a rename inside `folder` durable (the folder's entry, not just the file's bytes)."""
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
