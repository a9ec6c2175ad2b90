"""Commitment statuses: PENDING, SATISFIED (with evidence) or VIOLATED.

Pure. VIOLATED (a confirmed commitment conflict) is final. Whether SATISFIED may go back to
PENDING is the protocol's choice (`apply(..., revert=True)`: the published status check re-judges
every commitment every turn). Some satisfactions follow from the plot graph alone
(`structural_updates`); only the grounded protocol credits them.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from ncpbench.spec import Commitment, CommitmentType, Spec


class Status(StrEnum):
    PENDING = "PENDING"
    SATISFIED = "SATISFIED"
    VIOLATED = "VIOLATED"


class CommitmentUpdate(BaseModel):
    """An auditor's (or the plot graph's) judgement that a commitment changed status."""

    model_config = ConfigDict(frozen=True)

    id: str
    status: Status
    evidence: list[str] = Field(default_factory=list)
    """Fact ids or node ids that show it."""


class CommitmentState(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    type: CommitmentType
    status: Status = Status.PENDING
    evidence: tuple[str, ...] = ()
    turn: int | None = None
    """The turn that settled it."""


class CommitmentBook(BaseModel):
    model_config = ConfigDict(frozen=True)

    items: tuple[CommitmentState, ...] = ()

    @classmethod
    def from_spec(cls, spec: Spec) -> CommitmentBook:
        return cls(items=tuple(CommitmentState(id=c.id, type=c.type) for c in spec.commitments))

    def get(self, cid: str) -> CommitmentState:
        for c in self.items:
            if c.id == cid:
                return c
        raise KeyError(f"unknown commitment id {cid!r}")

    def apply(self, updates: Iterable[CommitmentUpdate], turn: int, *, revert: bool = False) -> CommitmentBook:
        """Apply status judgements; unknown ids raise, VIOLATED ones never change.

        Without `revert`, only PENDING commitments move (to SATISFIED or VIOLATED). With it, a
        SATISFIED commitment judged PENDING goes back to PENDING (and may be satisfied again later).
        """
        by_id = {c.id: c for c in self.items}
        for u in updates:
            if u.id not in by_id:
                raise KeyError(f"unknown commitment id {u.id!r}")
            cur = by_id[u.id]
            if cur.status is Status.VIOLATED or u.status is cur.status:
                continue
            if cur.status is Status.PENDING:
                by_id[u.id] = cur.model_copy(update={"status": u.status, "evidence": tuple(u.evidence), "turn": turn})
            elif revert and u.status is Status.PENDING:
                by_id[u.id] = cur.model_copy(update={"status": Status.PENDING, "evidence": tuple(u.evidence), "turn": turn})
            elif u.status is Status.VIOLATED:
                by_id[u.id] = cur.model_copy(update={"status": Status.VIOLATED, "evidence": tuple(u.evidence), "turn": turn})
        return CommitmentBook(items=tuple(by_id[c.id] for c in self.items))

    def all_achieved(self) -> bool:
        achievements = [c for c in self.items if c.type is CommitmentType.ACHIEVEMENT]
        return bool(achievements) and all(c.status is Status.SATISFIED for c in achievements)

    def satisfied_share(self) -> float:
        return sum(c.status is Status.SATISFIED for c in self.items) / len(self.items) if self.items else 0.0

    def statuses(self) -> dict[str, str]:
        return {c.id: c.status.value for c in self.items}


def structural_updates(commitments: Iterable[Commitment], completed: set[str]) -> list[CommitmentUpdate]:
    """Satisfactions that the plot graph alone proves, given the completed nodes.

    achievement with `node`: that node completed. ordering: `after` completed (the env only lets
    it complete after `before`). invariant with `until`: the window closed without a violation.
    """
    out = []
    for c in commitments:
        target = {CommitmentType.ACHIEVEMENT: c.node, CommitmentType.ORDERING: c.after,
                  CommitmentType.INVARIANT: c.until}[c.type]
        if target is not None and target in completed:
            out.append(CommitmentUpdate(id=c.id, status=Status.SATISFIED, evidence=[target]))
    return out
