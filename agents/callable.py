"""Any function `str -> str` (sync or async) as a Narrator."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ncpbench.protocols import NarratorRequest

from .prompts import narrator_messages


def narrator_prompt(request: NarratorRequest) -> str:
    """The plain-text prompt handed to a callable narrator: the same instructions, story state and
    story log the LLM narrator gets, as one string."""
    system, user = (m["content"] for m in narrator_messages(request))
    return f"{system}\n\n{user}"


class CallableNarrator:
    def __init__(self, fn: Callable[[str], str | Awaitable[str]]) -> None:
        self.fn = fn

    def narrate(self, request: NarratorRequest) -> str | Awaitable[str]:
        return self.fn(narrator_prompt(request))


def as_narrator(fn: Callable[[str], str | Awaitable[str]]) -> CallableNarrator:
    return CallableNarrator(fn)
