"""Episode records: what a finished (or in-flight) episode leaves behind.

Pure data, JSON on disk. Metrics and reports read these and nothing else.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ncpbench.state import EpisodeState, Outcome
from ncpbench.verdict import Usage, Verdict


class AgentReply(BaseModel):
    """What an agent may return instead of a bare string, to report its token usage."""

    model_config = ConfigDict(frozen=True)

    text: str
    usage: Usage = Field(default_factory=Usage)


class TurnRecord(BaseModel):
    """One audited reply. The conflicting turn is recorded with committed=False."""

    turn: int
    """0 = the opening."""
    player_action: str | None
    narrator_reply: str
    verdict: Verdict
    committed: bool
    completed_nodes: list[str] = Field(default_factory=list)
    """Nodes this turn completed (after the env's skip check)."""
    rejected_nodes: list[str] = Field(default_factory=list)
    """Nodes the auditor claimed but whose predecessors were not complete."""
    reward: float = 0.0
    usage: dict[str, Usage] = Field(default_factory=dict)
    """Per role: player, narrator (when known), auditor."""
    notes: list[str] = Field(default_factory=list)
    """Defined handling the env applied (truncated reply, empty reply, ...)."""


class EpisodeRecord(BaseModel):
    episode_id: str = ""
    """`<env_id>#<replicate>` in batch runs: unique within a run."""
    env_id: str
    env_version: int = 0
    """The environment's version (`meta.version`, the `-vN` of its Gymnasium id)."""
    title: str
    genres: list[str]
    replicate: int = 0
    seed: int = 0
    protocol: str = "published/1"
    """The audit protocol the episode was played under (`name/version`, see ncpbench.protocol)."""
    outcome: Outcome
    turns: int
    """Turns played; the conflicting turn counts."""
    max_turns: int
    progress: float
    satisfied_share: float
    conflict_kinds: list[str] = Field(default_factory=list)
    error: str | None = None
    """Why an ERROR outcome happened (never contains secrets)."""
    history: list[TurnRecord] = Field(default_factory=list)
    final_state: EpisodeState
    usage: dict[str, Usage] = Field(default_factory=dict)
    config: dict[str, Any] = Field(default_factory=dict)

    @property
    def total_tokens(self) -> int:
        return sum(u.total_tokens for u in self.usage.values())
