"""LLM agents: a narrator and a player that talk to any OpenAI-compatible model.

Both prompts are laid out append-only (stable instructions and story head, then the story log,
then what is new for this call), so a provider's prompt cache serves most of every call. The
narrator sees what the published baseline narrator sees: every commitment with its conditions,
the facts, the current plot node with its trigger and key delta, the whole story so far and the
player's input. The player sees only the visible story, all of it.

An empty answer is invalid output, never a move: it is re-asked at most twice, then the call
fails with InvalidOutputError (the episode becomes ERROR, never a verdict).
"""

from __future__ import annotations

from typing import Literal

from ncpbench.errors import InvalidOutputError
from ncpbench.models.calllog import call_context
from ncpbench.models.client import ModelClient
from ncpbench.models.config import RoleConfig
from ncpbench.protocols import NarratorRequest, PlayerRequest
from ncpbench.record import AgentReply
from ncpbench.verdict import Usage

from .prompts import narrator_messages, player_messages

REASKS = 2
"""An empty answer is asked again at most twice (the published setup for invalid output)."""


async def _non_empty(client: ModelClient, role: RoleConfig, messages: list[dict[str, str]], salt: str,
                     what: str) -> AgentReply:
    usage = Usage()
    for attempt in range(REASKS + 1):
        out = await client.chat(role, messages, salt=salt if attempt == 0 else f"{salt}|reask{attempt}")
        usage = usage.add(out.usage)
        if out.text.strip():
            return AgentReply(text=out.text.strip(), usage=usage)
    raise InvalidOutputError(f"empty {what}: the model answered with no text {REASKS + 1} times")


class LLMNarrator:
    """Sees the story state the published baseline narrator sees (see the module docstring)."""

    def __init__(self, client: ModelClient, role: RoleConfig, salt: str = "") -> None:
        self.client = client
        self.role = role
        self.salt = salt

    def messages(self, request: NarratorRequest) -> list[dict[str, str]]:
        return narrator_messages(request)

    async def narrate(self, request: NarratorRequest) -> AgentReply:
        with call_context(role="narrator", turn=request.turn):
            return await _non_empty(self.client, self.role, self.messages(request),
                                    f"{self.salt}|narrator|{request.turn}", "narration")


class LLMPlayer:
    """Sees only the visible story and its role: never facts, commitments or the plot."""

    def __init__(self, client: ModelClient, role: RoleConfig, mode: Literal["adversarial", "cooperative"] = "adversarial",
                 salt: str = "") -> None:
        self.client = client
        self.role = role
        self.mode = mode
        self.salt = salt

    def messages(self, request: PlayerRequest) -> list[dict[str, str]]:
        return player_messages(request, self.mode)

    async def act(self, request: PlayerRequest) -> AgentReply:
        with call_context(role="player", turn=request.turn):
            return await _non_empty(self.client, self.role, self.messages(request),
                                    f"{self.salt}|player|{request.seed}|{request.turn}", "player action")
