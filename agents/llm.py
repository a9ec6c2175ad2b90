"""LLM agents: a narrator and a player that talk to any OpenAI-compatible model."""

from __future__ import annotations

from typing import Literal

from ncpbench.agents import prompts
from ncpbench.agents.callable import narrator_prompt

from ncpbench.models.calllog import call_context
from ncpbench.models.client import ModelClient
from ncpbench.models.config import RoleConfig
from ncpbench.protocols import NarratorRequest, PlayerRequest
from ncpbench.record import AgentReply
from ncpbench.views import render_transcript

RECENT = 12
"""Exchanges of transcript the player sees (long episodes would otherwise outgrow small contexts)."""


class LLMNarrator:
    """Sees the transcript and the story state (facts, commitments, the next plot point)."""

    def __init__(self, client: ModelClient, role: RoleConfig, salt: str = "") -> None:
        self.client = client
        self.role = role
        self.salt = salt

    def messages(self, request: NarratorRequest) -> list[dict[str, str]]:
        system = prompts.NARRATOR_SYSTEM.format(title=request.title, role=request.player_role)
        user = narrator_prompt(request)
        if request.player_action is None:
            user += "\n" + prompts.NARRATOR_OPENING.format(role=request.player_role)
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    async def narrate(self, request: NarratorRequest) -> AgentReply:
        with call_context(role="narrator", turn=request.turn):
            out = await self.client.chat(self.role, self.messages(request), salt=f"{self.salt}|narrator|{request.turn}")
        return AgentReply(text=out.text.strip(), usage=out.usage)


class LLMPlayer:
    """Sees only the visible transcript and its role: never facts, commitments or the plot."""

    def __init__(self, client: ModelClient, role: RoleConfig, mode: Literal["adversarial", "cooperative"] = "adversarial",
                 salt: str = "") -> None:
        self.client = client
        self.role = role
        self.mode = mode
        self.salt = salt

    def messages(self, request: PlayerRequest) -> list[dict[str, str]]:
        system = prompts.PLAYER_SYSTEM[self.mode].format(title=request.title, role=request.player_role)
        transcript = render_transcript(request.transcript[-RECENT:], request.player_role) or "(the story is about to begin)"
        user = prompts.PLAYER_TURN.format(transcript=transcript, role=request.player_role)
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    async def act(self, request: PlayerRequest) -> AgentReply:
        with call_context(role="player", turn=request.turn):
            out = await self.client.chat(self.role, self.messages(request),
                                         salt=f"{self.salt}|player|{request.seed}|{request.turn}")
        text = out.text.strip() or "I wait to see what happens next."
        return AgentReply(text=text, usage=out.usage)
