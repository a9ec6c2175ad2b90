"""Evidence grounding: a claimed conflict must quote the reply it accuses."""

from __future__ import annotations

import re

_QUOTES = str.maketrans({"“": '"', "”": '"', "„": '"', "«": '"', "»": '"', "‘": "'", "’": "'", "‚": "'", "`": "'"})


def normalise(text: str) -> str:
    text = text.translate(_QUOTES).replace("…", "...")
    return re.sub(r"\s+", " ", text).strip().lower()


MIN_QUOTE_CHARS = 8
"""A quote shorter than this ("no", "he") says nothing about where a conflict is."""


def is_grounded(quote: str | None, reply: str) -> bool:
    """True when the quote (outer quote marks and ellipses trimmed) is a real piece of the reply:
    at least MIN_QUOTE_CHARS long and found at word boundaries (so "no" is not found in "know")."""
    if not quote:
        return False
    q = normalise(quote).strip(" \"'.")
    if len(q) < MIN_QUOTE_CHARS:
        return False
    return re.search(rf"(?<!\w){re.escape(q)}(?!\w)", normalise(reply)) is not None
