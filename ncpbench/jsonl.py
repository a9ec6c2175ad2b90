"""JSON Lines as ncpbench writes and reads them: one record, exactly one line.

Writers use `jsonl_line`; readers use `iter_jsonl`, which skips blank lines and lines that are
not complete JSON objects (a run killed mid-append leaves at most a torn last line).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

_LINE_BREAKS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\u0085": "\\u0085"})


def jsonl_line(data: dict[str, Any], *, sort_keys: bool = False) -> str:
    """One record as exactly one line, whatever a reader splits on.

    json.dumps escapes C0 controls but, with ensure_ascii=False, leaves U+2028, U+2029 and U+0085
    raw; str.splitlines (and JavaScript) treat those as line breaks, so they are escaped too. They
    only ever occur inside JSON strings, where the escape means the same character.
    """
    return json.dumps(data, ensure_ascii=False, sort_keys=sort_keys).translate(_LINE_BREAKS) + "\n"


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a file, in order; blank, torn or non-object lines are skipped."""
    if not path.exists():
        return
    with path.open(encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(data, dict):
                yield data


def write_jsonl(rows: Iterable[BaseModel], path: Path) -> None:
    """Models as JSON Lines, keys sorted, so the same rows always give byte-identical files."""
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(jsonl_line(row.model_dump(mode="json"), sort_keys=True))
