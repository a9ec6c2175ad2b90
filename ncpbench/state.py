"""The episode state: ledger + commitments + trajectory progress + transcript + turn.

Data only: the rules that move it from turn to turn live in `ncpbench.protocol`. Pure and immutable: every transition returns a new `EpisodeState`, so a snapshot is just a
reference and branching an episode from any turn costs nothing. JSON round-trips exactly.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from ncpbench.commitments import CommitmentBook
from ncpbench.ledger import FactDiff, FactLedger
from ncpbench.spec import Spec
from ncpbench.trajectory import TrajectoryGraph


class Outcome(StrEnum):
    ONGOING = "ONGOING"
    CONFLICT = "CONFLICT"
    SUCCESS = "SUCCESS"
    SURVIVAL = "SURVIVAL"
    ERROR = "ERROR"
    """Infrastructure failure (a model that kept failing); censored in survival analysis."""


class Exchange(BaseModel):
    """One committed line of the transcript, with what its turn committed (the story log)."""

    model_config = ConfigDict(frozen=True)

    turn: int
    """0 = the opening."""
    player_action: str | None
    narrator_reply: str
    facts_added: tuple[str, ...] = ()
    """`f_N: text` for each fact this turn committed (at turn 1 the opening's come first)."""
    facts_negated: tuple[str, ...] = ()
    """Ids of the facts this turn negated."""
    nodes_completed: tuple[str, ...] = ()
    status_changes: tuple[str, ...] = ()
    """`c_N: PENDING -> SATISFIED` for each commitment whose status this turn changed."""


class NodeMark(BaseModel):
    """Partial evidence for a plot node not yet complete: the turns its trigger and key delta were narrated."""

    model_config = ConfigDict(frozen=True)

    node: str
    trigger_turn: int | None = None
    delta_turn: int | None = None

    @property
    def complete(self) -> bool:
        return self.trigger_turn is not None and self.delta_turn is not None


class EpisodeState(BaseModel):
    model_config = ConfigDict(frozen=True)

    env_id: str
    turn: int = 0
    """Committed turns (the opening is not a turn)."""
    ledger: FactLedger
    commitments: CommitmentBook
    completed_nodes: tuple[str, ...] = ()
    """In order of completion."""
    transcript: tuple[Exchange, ...] = ()
    pending_diff: FactDiff = Field(default_factory=FactDiff)
    """Fact updates found in the opening, committed together with turn 1."""
    node_marks: tuple[NodeMark, ...] = ()
    """Trigger / key-delta evidence gathered so far for nodes not yet complete."""
    outcome: Outcome = Outcome.ONGOING

    @classmethod
    def initial(cls, spec: Spec) -> EpisodeState:
        return cls(env_id=spec.key, ledger=FactLedger.from_spec(spec), commitments=CommitmentBook.from_spec(spec))

    @property
    def done(self) -> bool:
        return self.outcome is not Outcome.ONGOING

    def with_opening(self, opening: str, diff: FactDiff) -> EpisodeState:
        return self.model_copy(update={
            "transcript": (*self.transcript, Exchange(turn=0, player_action=None, narrator_reply=opening)),
            "pending_diff": diff,
        })

    def finish(self, outcome: Outcome) -> EpisodeState:
        return self.model_copy(update={"outcome": outcome})

    def progress(self, graph: TrajectoryGraph) -> float:
        return graph.progress(self.completed_nodes)

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> EpisodeState:
        return cls.model_validate_json(text)
