"""A Gymnasium space for free prose, and how it batches in vector envs.

`gymnasium.spaces.Text` only admits a fixed character set (alphanumerics by default), so curly
quotes, em dashes and accented names fail `contains`. `UnicodeText` admits any string of at most
`max_length` code points that encodes as UTF-8 (no lone surrogates) and samples readable text.

Vector envs (`gymnasium.make_vec`, `SyncVectorEnv`, `AsyncVectorEnv`) batch it through the
singledispatch utilities of `gymnasium.vector.utils`, registered here for `UnicodeText`:

- `batch_space` / `batch_differing_spaces`: a `Tuple` of n text spaces;
- `concatenate` / `create_empty_array`: a batch of texts is a plain `tuple[str, ...]` (and a batch
  of actions is any sequence of n str: the batched `Tuple` space iterates it);
- shared memory (`AsyncVectorEnv(shared_memory=True)`, the default): each env gets a slot of
  `8 + 4 * max_length` bytes holding the UTF-8 length and bytes (every string the space admits
  fits); the vector env hands out copies as tuples of str (`copy=False` gives the live
  `SharedTexts` view instead). `shared_memory=False` sends texts through the pipes instead
  and allocates nothing up front.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Iterable, Sequence
from copy import deepcopy
from types import ModuleType
from typing import Any, overload

import numpy as np
from gymnasium.spaces import Space, Tuple
from gymnasium.vector.utils import (
    batch_differing_spaces,
    batch_space,
    concatenate,
    create_empty_array,
    create_shared_memory,
    read_from_shared_memory,
    write_to_shared_memory,
)

_SAMPLE_CHARS = list("abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?'\"-—“”’éçøñ")
_HEADER = 8
"""Bytes of the little-endian length that precedes each text in shared memory."""


class UnicodeText(Space[str]):
    def __init__(self, max_length: int = 1_000_000, min_length: int = 0, seed: int | np.random.Generator | None = None,
                 non_blank: bool = False):
        self.max_length = max_length
        self.min_length = min_length
        self.non_blank = non_blank
        """Only texts with a visible character (a narration must say something: blank is invalid)."""
        super().__init__(dtype=str, seed=seed)

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        low = max(self.min_length, 1 if self.non_blank else 0)
        length = int(self.np_random.integers(low, min(self.max_length, 200) + 1))
        idx = self.np_random.integers(0, len(_SAMPLE_CHARS), size=length)
        text = "".join(_SAMPLE_CHARS[i] for i in idx)
        return "a" + text[1:] if self.non_blank and not text.strip() else text

    def contains(self, x: Any) -> bool:
        if not isinstance(x, str) or not self.min_length <= len(x) <= self.max_length:
            return False
        if self.non_blank and not x.strip():
            return False
        try:
            x.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True

    @property
    def is_np_flattenable(self) -> bool:
        return False

    @property
    def shared_slot_bytes(self) -> int:
        """Bytes one env's text takes in an AsyncVectorEnv's shared memory (UTF-8 is at most 4 a character)."""
        return _HEADER + 4 * self.max_length

    def __repr__(self) -> str:
        return f"UnicodeText(max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UnicodeText) and (self.min_length, self.max_length, self.non_blank) == (
            other.min_length, other.max_length, other.non_blank)

    def __hash__(self) -> int:
        return hash((UnicodeText, self.min_length, self.max_length, self.non_blank))

    def to_jsonable(self, sample_n: Any) -> list[str]:
        return list(sample_n)

    def from_jsonable(self, sample_n: list[str]) -> list[str]:
        return list(sample_n)


# -- vector env batching ---------------------------------------------------------------------------


@batch_space.register(UnicodeText)
def _batch_space_text(space: UnicodeText, n: int = 1) -> Space[Any]:
    # Independent copies, seeded from the space's generator (as gymnasium does for its own Text).
    batched = Tuple(tuple(deepcopy(space) for _ in range(n)), seed=deepcopy(space.np_random))
    rng = deepcopy(space.np_random)
    batched.seed([int(s) for s in rng.integers(0, int(1e8), n)])
    return batched


def _batch_differing_text(spaces: Sequence[UnicodeText]) -> Space[Any]:
    return Tuple(tuple(deepcopy(s) for s in spaces))


# gymnasium dispatches this one on the type of the first space of the sequence.
batch_differing_spaces.register(UnicodeText, _batch_differing_text)


@concatenate.register(UnicodeText)
def _concatenate_text(space: UnicodeText, items: Iterable[str], out: Any) -> tuple[str, ...]:
    return tuple(items)


@create_empty_array.register(UnicodeText)
def _empty_text(space: UnicodeText, n: int = 1, fn: Any = np.zeros) -> tuple[str, ...]:
    return ("",) * n


@create_shared_memory.register(UnicodeText)
def _shared_text(space: UnicodeText, n: int = 1, ctx: ModuleType = mp) -> Any:
    return ctx.Array("B", n * space.shared_slot_bytes)


class SharedTexts(Sequence[str]):
    """A live view of n texts in shared memory: AsyncVectorEnv reads its buffer once and copies it
    on every step, so indexing decodes the current bytes and `deepcopy` gives a plain tuple of str."""

    def __init__(self, space: UnicodeText, shared_memory: Any, n: int) -> None:
        self._data = np.frombuffer(shared_memory.get_obj(), dtype=np.uint8)
        self._stride = space.shared_slot_bytes
        self._n = n

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[str, ...]: ...
    def __getitem__(self, index: int | slice) -> str | tuple[str, ...]:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(self._n)))
        if not -self._n <= index < self._n:
            raise IndexError(index)
        start = (index % self._n) * self._stride
        length = int.from_bytes(self._data[start:start + _HEADER].tobytes(), "little")
        return self._data[start + _HEADER:start + _HEADER + length].tobytes().decode("utf-8")

    def __deepcopy__(self, memo: dict[int, Any]) -> tuple[str, ...]:
        return tuple(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"SharedTexts({tuple(self)!r})"


@read_from_shared_memory.register(UnicodeText)
def _read_text(space: UnicodeText, shared_memory: Any, n: int = 1) -> SharedTexts:
    return SharedTexts(space, shared_memory, n)


@write_to_shared_memory.register(UnicodeText)
def _write_text(space: UnicodeText, index: int, value: str, shared_memory: Any) -> None:
    encoded = value.encode("utf-8")
    stride = space.shared_slot_bytes
    if len(encoded) > stride - _HEADER:
        raise ValueError(f"a text of {len(encoded)} UTF-8 bytes does not fit the shared-memory slot of {space!r}; "
                         "use AsyncVectorEnv(..., shared_memory=False)")
    data = np.frombuffer(shared_memory.get_obj(), dtype=np.uint8)
    start = index * stride
    data[start:start + _HEADER] = np.frombuffer(len(encoded).to_bytes(_HEADER, "little"), dtype=np.uint8)
    data[start + _HEADER:start + _HEADER + len(encoded)] = np.frombuffer(encoded, dtype=np.uint8)
