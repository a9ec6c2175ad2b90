"""The rules of a turn: what an audit verdict does to the episode state.

Pure: no I/O, no model, no reward. `apply_opening` and `apply_turn` are the only places where a
verdict changes the state; the Gymnasium env, the episode driver, the batch runner, the RL helpers,
`ncpbench play` and the conformance check all reach them through `NarrativeEnv`, so they cannot
drift apart.

How a verdict is applied is a named, versioned **protocol** (`AuditProtocol`): plain data that this
module and the auditors read. Two presets exist:

- `published` (the default): the published NCP-Bench turn semantics. Every auditor stage sees the
  whole story; the fact update runs first and its candidates are an input of the conflict check;
  the double check may only confirm or narrow; only the current plot node can complete, at most one
  per turn, and its trigger and key delta may be narrated in different turns (evidence
  accumulates); every commitment is re-judged every turn and a SATISFIED one may go back to
  PENDING; nothing is credited from the plot graph.
- `grounded`: our stricter extension. A claimed conflict stands only when its quote is found in
  the reply (checked here, in `apply_turn`, whatever auditor produced the verdict: `is_grounded`);
  any frontier node may complete, several per turn, credited in plot order; a node needs
  trigger and key delta in the same reply; statuses only move forward and the plot graph credits
  the satisfactions it proves (achievement node done, ordering `after` done, invariant `until`
  done).

docs/PROTOCOL.md describes both, and what each difference does to scores.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ncpbench.commitments import CommitmentBook, CommitmentUpdate, Status, structural_updates
from ncpbench.errors import AuditError
from ncpbench.ledger import FactDiff, LedgerError
from ncpbench.record import TurnRecord
from ncpbench.spec import Spec
from ncpbench.state import EpisodeState, Exchange, NodeMark, Outcome
from ncpbench.trajectory import TrajectoryGraph
from ncpbench.verdict import Conflict, ConflictKind, Verdict


class AuditProtocol(BaseModel):
    """How a turn is audited and how its verdict is applied. Recorded in every run and record."""

    model_config = ConfigDict(frozen=True)

    name: str
    """The preset's name, as `--protocol` takes it."""
    version: int
    """Bumped whenever the preset's rules change, so scores of different versions never mix."""
    audit_context: Literal["full", "compact"] = "full"
    """What every auditor stage sees of the story: every exchange since the opening (`full`), or the
    committed ledger plus the last `recent_turns` exchanges (`compact`, an opt-in cost saver)."""
    recent_turns: int = 6
    """Exchanges kept verbatim in `compact` context."""
    grounded_evidence: bool = False
    """A claimed conflict stands only when its quoted evidence is found in the reply."""
    one_node_per_turn: bool = True
    """Only the current plot node may complete, at most one per turn (the published rule). When
    False, any frontier node may complete, several per turn, credited in plot order."""
    cumulative_trajectory: bool = True
    """A node's trigger and key delta may be narrated in different turns; when False both must be
    in the same reply."""
    statuses_revert: bool = True
    """Every commitment is re-judged every turn and a SATISFIED one may go back to PENDING. When
    False, statuses only move forward."""
    structural_satisfaction: bool = False
    """Credit the satisfactions the plot graph proves (achievement node, ordering `after`,
    invariant `until` completed), whatever the status stage said."""

    @property
    def label(self) -> str:
        """`published/1` (or `published/1+compact6`): how records, run.json and reports name it."""
        base = f"{self.name}/{self.version}"
        return base if self.audit_context == "full" else f"{base}+compact{self.recent_turns}"

    def with_context(self, audit_context: Literal["full", "compact"], recent_turns: int = 6) -> AuditProtocol:
        """This preset with another audit context (`--audit-context compact`); the label says so."""
        return self.model_copy(update={"audit_context": audit_context, "recent_turns": recent_turns})


PUBLISHED = AuditProtocol(name="published", version=1)
GROUNDED = AuditProtocol(name="grounded", version=1, grounded_evidence=True, one_node_per_turn=False,
                         cumulative_trajectory=False, statuses_revert=False, structural_satisfaction=True)
PROTOCOLS: dict[str, AuditProtocol] = {p.name: p for p in (PUBLISHED, GROUNDED)}
"""The presets by name; `published` is the default."""
DEFAULT_PROTOCOL = PUBLISHED


def get_protocol(protocol: AuditProtocol | str | None) -> AuditProtocol:
    """A preset by name, an AuditProtocol as it is, or the default (`published`) for None."""
    if protocol is None:
        return DEFAULT_PROTOCOL
    if isinstance(protocol, AuditProtocol):
        return protocol
    if protocol in PROTOCOLS:
        return PROTOCOLS[protocol]
    raise ValueError(f"unknown protocol {protocol!r}; known: {', '.join(PROTOCOLS)}")


# -- evidence grounding -----------------------------------------------------------------------------
# A rule of the grounded protocol, so it lives with the other rules: an auditor may ask for quotes,
# but only this check decides whether a claimed conflict may end the episode.

_QUOTE_MARKS = str.maketrans({"“": '"', "”": '"', "„": '"', "«": '"', "»": '"', "‘": "'", "’": "'", "‚": "'",
                              "`": "'"})

MIN_QUOTE_CHARS = 8
"""A quote shorter than this ("no", "he") says nothing about where a conflict is."""


def normalise_quote(text: str) -> str:
    """Curly quotes straightened, "…" spelled out, whitespace runs collapsed, lower case."""
    text = text.translate(_QUOTE_MARKS).replace("…", "...")
    return re.sub(r"\s+", " ", text).strip().lower()


def is_grounded(quote: str | None, reply: str) -> bool:
    """True when the quote (outer quote marks and ellipses trimmed) is a real piece of the reply:
    at least MIN_QUOTE_CHARS long and found at word boundaries (so "no" is not found in "know")."""
    if not quote:
        return False
    q = normalise_quote(quote).strip(" \"'.")
    if len(q) < MIN_QUOTE_CHARS:
        return False
    return re.search(rf"(?<!\w){re.escape(q)}(?!\w)", normalise_quote(reply)) is not None


def ground_conflicts(verdict: Verdict, reply: str, protocol: AuditProtocol) -> tuple[Verdict, list[Conflict]]:
    """(the verdict as the protocol lets it stand, the conflicts it refused).

    Under `grounded_evidence` a conflict whose quote is not in the reply is moved to `overturned`,
    marked `grounded=False` with the reason saying so; the auditor's own `grounded` flag is not
    trusted. Other protocols get the verdict unchanged (published: the double check decides).
    """
    if not protocol.grounded_evidence or not verdict.conflicts:
        return verdict, []
    standing: list[Conflict] = []
    refused: list[Conflict] = []
    for c in verdict.conflicts:
        if is_grounded(c.evidence, reply):
            standing.append(c if c.grounded else c.model_copy(update={"grounded": True}))
        else:
            refused.append(c.model_copy(update={
                "grounded": False, "reason": f"{c.reason} | {protocol.label}: the quote is not in the reply"}))
    if standing == verdict.conflicts:
        return verdict, []
    return verdict.model_copy(update={"conflicts": standing, "overturned": [*verdict.overturned, *refused]}), refused


class StatusChange(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    before: Status
    after: Status


class TurnOutcome(BaseModel):
    """Everything one applied verdict did: the new state, the record of the turn, and the outcome."""

    model_config = ConfigDict(frozen=True)

    state: EpisodeState
    record: TurnRecord
    """The turn as recorded (reward and usage are filled in by the caller)."""
    completed_nodes: list[str] = Field(default_factory=list)
    rejected_nodes: list[str] = Field(default_factory=list)
    """Nodes the auditor claimed that the protocol does not credit now (out of plot order, not the
    current node, or a second node in one turn)."""
    status_changes: list[StatusChange] = Field(default_factory=list)
    ungrounded_conflicts: list[Conflict] = Field(default_factory=list)
    """Conflicts the auditor confirmed that the protocol refused because their quote is not in the
    reply (`grounded_evidence`); the record's verdict lists them under `overturned`."""
    outcome: Outcome
    terminated: bool
    """CONFLICT or SUCCESS: the episode is over by its own rules."""
    truncated: bool
    """The turn limit was reached (SURVIVAL)."""

    @property
    def committed(self) -> bool:
        return self.record.committed

    @property
    def net_satisfied(self) -> int:
        """Commitments SATISFIED after the turn minus before it (negative when statuses reverted)."""
        return (sum(c.after is Status.SATISFIED for c in self.status_changes)
                - sum(c.before is Status.SATISFIED for c in self.status_changes))


def audit_frontier(graph: TrajectoryGraph, state: EpisodeState, protocol: AuditProtocol) -> tuple[str, ...]:
    """The plot nodes this turn's reply may complete under the protocol."""
    if protocol.one_node_per_turn:
        current = graph.current(state.completed_nodes)
        return (current,) if current else ()
    return tuple(graph.frontier(state.completed_nodes))


def preview_ledger(state: EpisodeState, diff: FactDiff | None = None) -> list[tuple[str, str]]:
    """Active facts (id, text) as they would stand with the pending opening diff and `diff` applied.

    The opening's updates are committed with turn 1, but turn 1 must already be judged against
    them; auditors show this view. Ids follow the numbering the commit will give.
    """
    merged = state.pending_diff.merge(diff or FactDiff())
    try:
        ledger = state.ledger.apply(merged, state.turn + 1)
    except LedgerError:
        ledger = state.ledger
    return [(f.id, f.content) for f in ledger.active()]


def credit_nodes(graph: TrajectoryGraph, state: EpisodeState, verdict: Verdict, protocol: AuditProtocol,
                 turn: int) -> tuple[list[str], list[str], tuple[NodeMark, ...]]:
    """(completed, rejected, evidence marks kept for later turns) for one conflict-free verdict."""
    done = set(state.completed_nodes)
    marks = {m.node: m for m in state.node_marks} if protocol.cumulative_trajectory else {}
    for ev in verdict.node_evidence:
        if ev.node in done or ev.node not in graph.descriptions:
            continue
        old = marks.get(ev.node, NodeMark(node=ev.node))
        marks[ev.node] = NodeMark(node=ev.node,
                                  trigger_turn=old.trigger_turn if old.trigger_turn is not None else
                                  (turn if ev.trigger else None),
                                  delta_turn=old.delta_turn if old.delta_turn is not None else
                                  (turn if ev.key_delta else None))
    claimed = list(dict.fromkeys(verdict.completed_nodes))
    claimed += [n for n, m in marks.items() if m.complete and n not in claimed]
    position = {n: i for i, n in enumerate(graph.order)}
    completed: list[str] = []
    rejected: list[str] = []
    allowed = set(audit_frontier(graph, state, protocol))
    for node in sorted(claimed, key=lambda n: position.get(n, len(position))):
        if node in done:
            continue
        if protocol.one_node_per_turn:
            ok = node in allowed and not completed
        else:
            ok = node in position and graph.check_skip(node, done).ok
        if ok:
            completed.append(node)
            done.add(node)
        else:
            rejected.append(node)
    kept = tuple(m for n, m in marks.items() if n not in done)
    return completed, rejected, kept


def apply_opening(state: EpisodeState, reply: str, verdict: Verdict) -> EpisodeState:
    """The opening's fact updates are held and committed together with turn 1."""
    if not reply.strip():
        raise ValueError("the opening is empty: a narration must contain text")
    try:
        state.ledger.apply(verdict.fact_diff, 1)  # refuse an unappliable diff now, not one turn later
    except LedgerError as e:
        raise AuditError(f"verdict for the opening cannot apply: {e}") from e
    return state.with_opening(reply, verdict.fact_diff)


def apply_quit(state: EpisodeState) -> EpisodeState:
    """A session the person ended (`ncpbench play`'s /quit): SURVIVAL of the turns committed so far;
    an episode already over stays as it ended."""
    return state if state.done else state.finish(Outcome.SURVIVAL)


def _violations(state: EpisodeState, verdict: Verdict, turn: int) -> CommitmentBook:
    known = {c.id for c in state.commitments.items}
    updates = [CommitmentUpdate(id=c.target, status=Status.VIOLATED, evidence=[c.evidence])
               for c in verdict.conflicts if c.kind is ConflictKind.COMMITMENT and c.target in known]
    return state.commitments.apply(updates, turn, revert=False)


def _changes(before: CommitmentBook, after: CommitmentBook) -> list[StatusChange]:
    return [StatusChange(id=a.id, before=b.status, after=a.status)
            for b, a in zip(before.items, after.items, strict=True) if a.status is not b.status]


def apply_turn(spec: Spec, graph: TrajectoryGraph, state: EpisodeState, action: str, reply: str,
               verdict: Verdict, protocol: AuditProtocol, max_turns: int) -> TurnOutcome:
    """Apply the audit of the reply to turn `state.turn + 1`.

    A confirmed conflict ends the episode as CONFLICT and commits nothing of the turn (a
    commitment conflict marks its commitment VIOLATED). Under `grounded_evidence` only a conflict
    whose quote is found in the reply is confirmed; the others are overturned here, whichever
    auditor wrote the verdict. Otherwise the fact diff (with the
    opening's, at turn 1), the plot nodes the protocol credits and the commitment statuses are
    committed together; SUCCESS when every achievement is SATISFIED, SURVIVAL at `max_turns`.
    Raises AuditError when the verdict cannot apply (an unknown fact or commitment id).
    """
    if state.done:
        raise ValueError(f"the episode is over ({state.outcome.value})")
    if not reply.strip():
        raise ValueError("the reply is empty: a narration must contain text")
    turn = state.turn + 1
    verdict, ungrounded = ground_conflicts(verdict, reply, protocol)
    if verdict.conflicts:
        book = _violations(state, verdict, turn)
        new_state = state.model_copy(update={"commitments": book}).finish(Outcome.CONFLICT)
        record = TurnRecord(turn=turn, player_action=action, narrator_reply=reply, verdict=verdict, committed=False)
        return TurnOutcome(state=new_state, record=record, status_changes=_changes(state.commitments, book),
                           ungrounded_conflicts=ungrounded, outcome=Outcome.CONFLICT, terminated=True,
                           truncated=False)

    completed, rejected, marks = credit_nodes(graph, state, verdict, protocol, turn)
    diff = state.pending_diff.merge(verdict.fact_diff)
    try:
        ledger = state.ledger.apply(diff, turn)
        book = state.commitments.apply(verdict.commitment_updates, turn, revert=protocol.statuses_revert)
    except (LedgerError, KeyError) as e:
        raise AuditError(f"verdict for turn {turn} cannot apply: {e}") from e
    nodes = (*state.completed_nodes, *completed)
    if protocol.structural_satisfaction:
        book = book.apply(structural_updates(spec.commitments, set(nodes)), turn, revert=False)
    changes = _changes(state.commitments, book)
    exchange = Exchange(
        turn=turn, player_action=action, narrator_reply=reply,
        facts_added=tuple(f"{f.id}: {f.content}" for f in ledger.facts if f.added_turn == turn),
        facts_negated=tuple(f.id for f in ledger.facts if f.negated_turn == turn),
        nodes_completed=tuple(completed),
        status_changes=tuple(f"{c.id}: {c.before.value} -> {c.after.value}" for c in changes))
    new_state = state.model_copy(update={
        "turn": turn, "ledger": ledger, "commitments": book, "completed_nodes": nodes, "node_marks": marks,
        "transcript": (*state.transcript, exchange), "pending_diff": FactDiff()})
    success = book.all_achieved()
    truncated = not success and turn >= max_turns
    outcome = Outcome.SUCCESS if success else (Outcome.SURVIVAL if truncated else Outcome.ONGOING)
    if outcome is not Outcome.ONGOING:
        new_state = new_state.finish(outcome)
    record = TurnRecord(turn=turn, player_action=action, narrator_reply=reply, verdict=verdict, committed=True,
                        completed_nodes=completed, rejected_nodes=rejected)
    return TurnOutcome(state=new_state, record=record, completed_nodes=completed, rejected_nodes=rejected,
                       status_changes=changes, ungrounded_conflicts=ungrounded, outcome=outcome,
                       terminated=success, truncated=truncated)
