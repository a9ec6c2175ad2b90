"""Evidence grounding: a claimed conflict must quote the reply it accuses."""

from __future__ import annotations

import re

_QUOTES = str.maketrans({"“": '"', "”": '"', "„": '"', "«": '"', "»": '"', "‘": "'", "’": "'", "‚": "'", "`": "'"})


def normalise(text: str) -> str:
    text = text.translate(_QUOTES).replace("…", "...")
    return re.sub(r"\s+", " ", text).strip().lower()


def is_grounded(quote: str | None, reply: str) -> bool:
    """True when the quote (outer quote marks and ellipses trimmed) appears in the reply."""
    if not quote:
        return False
    q = normalise(quote).strip(" \"'.")
    return bool(q) and q in normalise(reply)
