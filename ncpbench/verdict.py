"""What an audit returns: conflicts with quoted evidence, and the state changes a reply makes.

Pure data shared by the env, the auditors and the records.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from ncpbench.commitments import CommitmentUpdate
from ncpbench.ledger import FactDiff


class ConflictKind(StrEnum):
    FACT = "fact"
    COMMITMENT = "commitment"
    PLAYER_INPUT = "player_input"


class Conflict(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: ConflictKind
    target: str | None = None
    """The id broken: a fact id (fact), a commitment id (commitment), none (player input)."""
    evidence: str
    """A quote from the narrator's reply."""
    reason: str
    grounded: bool = True
    """False when the quote was not found in the reply (the double check must resolve it)."""


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0
    cached_tokens: int = 0
    """Prompt tokens the endpoint served from its prefix cache (a part of prompt_tokens, billed lower)."""

    def add(self, other: Usage) -> Usage:
        return Usage(prompt_tokens=self.prompt_tokens + other.prompt_tokens,
                     completion_tokens=self.completion_tokens + other.completion_tokens,
                     calls=self.calls + other.calls, cached_tokens=self.cached_tokens + other.cached_tokens)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class NodeEvidence(BaseModel):
    """What a trajectory check saw of one plot node in the story so far."""

    model_config = ConfigDict(frozen=True)

    node: str
    trigger: bool = False
    """Its trigger event has explicitly happened."""
    key_delta: bool = False
    """Its key delta has explicitly happened."""
    evidence: str = ""


class Verdict(BaseModel):
    """The auditors' judgement of one narrator reply."""

    model_config = ConfigDict(frozen=True)

    conflicts: list[Conflict] = Field(default_factory=list)
    """Confirmed conflicts: any one ends the episode as CONFLICT."""
    overturned: list[Conflict] = Field(default_factory=list)
    """Conflicts the first check claimed and the double check overturned (kept for the record)."""
    fact_diff: FactDiff = Field(default_factory=FactDiff)
    completed_nodes: list[str] = Field(default_factory=list)
    """Nodes whose trigger and key delta have both happened (the protocol decides which it credits)."""
    node_evidence: list[NodeEvidence] = Field(default_factory=list)
    """Partial evidence (trigger or key delta seen); the published protocol accumulates it across turns."""
    commitment_updates: list[CommitmentUpdate] = Field(default_factory=list)
    usage: dict[str, Usage] = Field(default_factory=dict)
    """Token usage per auditor stage."""

    @property
    def is_conflict(self) -> bool:
        return bool(self.conflicts)

    def conflict_kinds(self) -> set[ConflictKind]:
        return {c.kind for c in self.conflicts}
