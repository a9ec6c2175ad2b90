"""The three roles as small Protocols, and the typed requests each one receives.

Anything with the right method plugs in: an LLM agent, a scripted test double, a person at a
terminal, a plain function (see `ncpbench.agents.as_narrator`). Methods may be sync or async;
callers await the result when it is awaitable.

What each role sees is the point of the benchmark:
- the player sees the visible transcript and its role, never facts, commitments or the plot;
- the narrator sees the transcript plus the story state (active facts, commitments, plot position);
- the auditor sees everything, including the reply under audit.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from ncpbench.record import AgentReply
from ncpbench.spec import Spec
from ncpbench.state import EpisodeState, Exchange
from ncpbench.verdict import Verdict


class PlayerRequest(BaseModel):
    model_config = ConfigDict(frozen=True)

    title: str
    player_role: str
    turn: int
    """The turn the action is for (1-based)."""
    transcript: tuple[Exchange, ...]
    seed: int = 0
    """The episode seed: stateless players derive their randomness from (seed, turn)."""


class NodeView(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    description: str
    trigger_event: str
    key_delta: str


class CommitmentView(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    type: str
    description: str
    status: str


class NarratorRequest(BaseModel):
    """Everything the narrator under test may see for one reply."""

    model_config = ConfigDict(frozen=True)

    title: str
    player_role: str
    turn: int
    """0 = write the opening; t >= 1 = answer the player's action of turn t."""
    player_action: str | None
    transcript: tuple[Exchange, ...]
    facts: tuple[str, ...]
    """Active facts, as 'f_N: text'."""
    commitments: tuple[CommitmentView, ...]
    current_node: NodeView | None
    """The plot node to advance next (None once the plot is complete)."""
    completed_nodes: tuple[str, ...]


class AuditRequest(BaseModel):
    """One reply to audit, with the full spec and the committed state before it."""

    model_config = ConfigDict(frozen=True)

    spec: Spec
    state: EpisodeState
    player_action: str | None
    """None when auditing the opening (only the fact update runs then)."""
    reply: str
    frontier: tuple[str, ...]
    """Plot nodes that may complete with this reply."""


@runtime_checkable
class Player(Protocol):
    def act(self, request: PlayerRequest) -> str | AgentReply | Awaitable[str] | Awaitable[AgentReply]: ...


@runtime_checkable
class Narrator(Protocol):
    """Returns the reply text, or an AgentReply carrying the text and its token usage."""

    def narrate(self, request: NarratorRequest) -> str | AgentReply | Awaitable[str] | Awaitable[AgentReply]: ...


@runtime_checkable
class Auditor(Protocol):
    def audit(self, request: AuditRequest) -> Verdict | Awaitable[Verdict]: ...
