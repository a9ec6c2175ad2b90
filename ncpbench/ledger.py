"""The fact ledger: atomic facts about the story world, grown and negated turn by turn.

Pure and immutable: `apply` returns a new ledger. A negated fact stays in the ledger (for
traceability: which turn negated it) but leaves the active view.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ncpbench.spec import Spec


class LedgerError(ValueError):
    """A diff that cannot apply (an unknown or already negated fact id, an empty fact)."""


class LedgerFact(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    content: str
    negated: bool = False
    added_turn: int = 0
    """0 = an initial fact; t = committed with turn t."""
    negated_turn: int | None = None


class FactDiff(BaseModel):
    """The smallest change a narrator reply makes to the ledger."""

    model_config = ConfigDict(frozen=True)

    add: list[str] = Field(default_factory=list)
    """New facts, as atomic statements."""
    negate: list[str] = Field(default_factory=list)
    """Ids of facts the reply made false."""

    def is_empty(self) -> bool:
        return not self.add and not self.negate

    def merge(self, other: FactDiff) -> FactDiff:
        return FactDiff(add=[*self.add, *other.add], negate=[*self.negate, *other.negate])


class FactLedger(BaseModel):
    model_config = ConfigDict(frozen=True)

    facts: tuple[LedgerFact, ...] = ()

    @classmethod
    def from_spec(cls, spec: Spec) -> FactLedger:
        return cls(facts=tuple(LedgerFact(id=f.id, content=f.content, negated=f.negated) for f in spec.initial_facts))

    def active(self) -> list[LedgerFact]:
        return [f for f in self.facts if not f.negated]

    def get(self, fact_id: str) -> LedgerFact:
        for f in self.facts:
            if f.id == fact_id:
                return f
        raise LedgerError(f"unknown fact id {fact_id!r}")

    def __contains__(self, fact_id: object) -> bool:
        return any(f.id == fact_id for f in self.facts)

    def next_id(self) -> str:
        return f"f_{len(self.facts)}"

    def apply(self, diff: FactDiff, turn: int) -> FactLedger:
        """All of the diff or none of it: an unknown id raises and the ledger is unchanged."""
        negate = list(dict.fromkeys(diff.negate))
        by_id = {f.id: f for f in self.facts}
        for fid in negate:
            if fid not in by_id:
                raise LedgerError(f"cannot negate unknown fact id {fid!r}")
            if by_id[fid].negated:
                raise LedgerError(f"fact {fid!r} is already negated")
        for text in diff.add:
            if not text.strip():
                raise LedgerError("cannot add an empty fact")
        facts = [f.model_copy(update={"negated": True, "negated_turn": turn}) if f.id in negate else f
                 for f in self.facts]
        for text in diff.add:
            facts.append(LedgerFact(id=f"f_{len(facts)}", content=text.strip(), added_turn=turn))
        return FactLedger(facts=tuple(facts))

    def changed_in(self, turn: int) -> list[LedgerFact]:
        """Facts added or negated by the given turn."""
        return [f for f in self.facts if f.added_turn == turn or f.negated_turn == turn]

    def at_turn(self, turn: int) -> FactLedger:
        """The ledger as it stood after `turn` was committed (for reports and branching)."""
        kept = []
        for f in self.facts:
            if f.added_turn > turn:
                continue
            if f.negated_turn is not None and f.negated_turn > turn:
                f = f.model_copy(update={"negated": False, "negated_turn": None})
            kept.append(f)
        return FactLedger(facts=tuple(kept))
