"""A Gymnasium space for free prose.

`gymnasium.spaces.Text` only admits a fixed character set (alphanumerics by default), so curly
quotes, em dashes and accented names fail `contains`. `UnicodeText` admits any string of at most
`max_length` code points that encodes as UTF-8 (no lone surrogates) and samples readable text.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.spaces import Space

_SAMPLE_CHARS = list("abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?'\"-—“”’éçøñ")


class UnicodeText(Space[str]):
    def __init__(self, max_length: int = 1_000_000, min_length: int = 0, seed: int | np.random.Generator | None = None):
        self.max_length = max_length
        self.min_length = min_length
        super().__init__(dtype=str, seed=seed)

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        length = int(self.np_random.integers(self.min_length, min(self.max_length, 200) + 1))
        idx = self.np_random.integers(0, len(_SAMPLE_CHARS), size=length)
        return "".join(_SAMPLE_CHARS[i] for i in idx)

    def contains(self, x: Any) -> bool:
        if not isinstance(x, str) or not self.min_length <= len(x) <= self.max_length:
            return False
        try:
            x.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"UnicodeText(max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UnicodeText) and (self.min_length, self.max_length) == (other.min_length, other.max_length)

    def to_jsonable(self, sample_n: Any) -> list[str]:
        return list(sample_n)

    def from_jsonable(self, sample_n: list[str]) -> list[str]:
        return list(sample_n)
