"""The episode state: ledger + commitments + trajectory progress + transcript + turn.

Pure and immutable: every transition returns a new `EpisodeState`, so a snapshot is just a
reference and branching an episode from any turn costs nothing. JSON round-trips exactly.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from ncpbench.commitments import CommitmentBook, CommitmentUpdate, structural_updates
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
    """One committed line of the visible transcript."""

    model_config = ConfigDict(frozen=True)

    turn: int
    """0 = the opening."""
    player_action: str | None
    narrator_reply: str


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

    def commit_turn(
        self,
        spec: Spec,
        graph: TrajectoryGraph,
        player_action: str,
        reply: str,
        diff: FactDiff,
        completed: list[str],
        updates: list[CommitmentUpdate],
    ) -> EpisodeState:
        """Commit one audited, conflict-free turn. Raises LedgerError/KeyError on a bad diff."""
        turn = self.turn + 1
        ledger = self.ledger.apply(self.pending_diff.merge(diff), turn)
        done = list(self.completed_nodes)
        for node in completed:
            if node not in done:
                done.append(node)
        book = self.commitments.apply(updates, turn)
        book = book.apply(structural_updates(spec.commitments, set(done)), turn)
        return self.model_copy(update={
            "turn": turn,
            "ledger": ledger,
            "commitments": book,
            "completed_nodes": tuple(done),
            "transcript": (*self.transcript, Exchange(turn=turn, player_action=player_action, narrator_reply=reply)),
            "pending_diff": FactDiff(),
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
