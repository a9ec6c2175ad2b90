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

from ncpbench.protocol import DEFAULT_PROTOCOL, AuditProtocol
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
    satisfaction_condition: str = ""
    violation_condition: str = ""


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
    """Active facts before this reply, as 'f_N: text' (at turn 1 including the opening's pending ones)."""
    initial_facts: tuple[str, ...] = ()
    """The facts at t=0, as 'f_N: text' (the stable head of a cache-friendly prompt)."""
    pending_facts: tuple[str, ...] = ()
    """Fact updates found in the opening and not yet committed (they commit with turn 1)."""
    commitments: tuple[CommitmentView, ...]
    current_node: NodeView | None
    """The plot node to advance next (None once the plot is complete)."""
    completed_nodes: tuple[str, ...]
    terminal: bool = False
    """The episode is over: nothing more will be asked (the final observation's request)."""


class AuditRequest(BaseModel):
    """One reply to audit, with the full spec and the committed state before it."""

    model_config = ConfigDict(frozen=True)

    spec: Spec
    state: EpisodeState
    player_action: str | None
    """None when auditing the opening (only the fact update runs then)."""
    reply: str
    frontier: tuple[str, ...]
    """Plot nodes that may complete with this reply (under the published protocol: the current node)."""
    protocol: AuditProtocol = DEFAULT_PROTOCOL
    """What the auditor sees and how its answer will be applied."""


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
