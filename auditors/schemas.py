"""What each audit stage must answer: pydantic models, sent to the model as JSON schemas."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Out(BaseModel):
    model_config = ConfigDict(extra="ignore")


class FactUpdateOutput(_Out):
    add: list[str] = Field(description="New atomic facts the reply clearly establishes")
    negate: list[str] = Field(description="Ids (f_N) of active facts the reply clearly makes false")


class ClaimedConflict(_Out):
    kind: Literal["fact", "commitment", "player_input"]
    target: str | None = Field(description="The fact id or commitment id broken; null for player_input")
    evidence: str = Field(description="An exact quote from the narrator reply")
    reason: str


class ConflictCheckOutput(_Out):
    conflicts: list[ClaimedConflict]


class Decision(_Out):
    claim: int = Field(description="The claim number being judged")
    confirmed: bool
    reason: str
    evidence: str | None = Field(default=None, description="A corrected exact quote, if the claim's quote was wrong")


class DoubleCheckOutput(_Out):
    decisions: list[Decision]


class TrajectoryOutput(_Out):
    completed: list[str] = Field(description="Ids of frontier nodes whose trigger and key delta both happened")
    evidence: str = ""


class StatusUpdate(_Out):
    id: str
    status: Literal["SATISFIED", "PENDING"]
    evidence: list[str] = Field(default_factory=list, description="Fact ids or node ids that show it")


class StatusOutput(_Out):
    updates: list[StatusUpdate]
