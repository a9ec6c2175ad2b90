"""Any function `str -> str` (sync or async) as a Narrator."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ncpbench.protocols import NarratorRequest
from ncpbench.views import render_story_state, render_transcript


def narrator_prompt(request: NarratorRequest) -> str:
    """The plain-text view handed to a callable narrator: state, transcript, and the action."""
    parts = [render_story_state(request), "", "Transcript so far:",
             render_transcript(request.transcript, request.player_role) or "(nothing yet)", ""]
    if request.player_action is None:
        parts.append("Write the opening of the story.")
    else:
        parts.append(f"{request.player_role} now does: {request.player_action}")
    return "\n".join(parts)


class CallableNarrator:
    def __init__(self, fn: Callable[[str], str | Awaitable[str]]) -> None:
        self.fn = fn

    def narrate(self, request: NarratorRequest) -> str | Awaitable[str]:
        return self.fn(narrator_prompt(request))


def as_narrator(fn: Callable[[str], str | Awaitable[str]]) -> CallableNarrator:
    return CallableNarrator(fn)
