"""The rules of a turn (ncpbench.protocol): the published protocol and the grounded extension.

Each published rule is pinned with a scripted auditor; the pure function is tested directly, then
through the env, which must apply exactly the same rules.
"""

from __future__ import annotations

import pytest
from ncpbench.agents import ReplayPlayer
from ncpbench.auditors import ReplayAuditor

from ncpbench import NarrativeEnv, Outcome
from ncpbench.commitments import CommitmentUpdate, Status
from ncpbench.errors import AuditError
from ncpbench.ledger import FactDiff
from ncpbench.protocol import (
    GROUNDED,
    PUBLISHED,
    apply_opening,
    apply_quit,
    apply_turn,
    audit_frontier,
    get_protocol,
)
from ncpbench.spec import Spec
from ncpbench.state import EpisodeState
from ncpbench.trajectory import TrajectoryGraph
from ncpbench.verdict import Conflict, ConflictKind, NodeEvidence, Verdict

SAT = Status.SATISFIED
PEND = Status.PENDING


def opened(spec: Spec, diff: FactDiff | None = None) -> EpisodeState:
    return apply_opening(EpisodeState.initial(spec), "Fog lies on the water.", Verdict(fact_diff=diff or FactDiff()))


def env_with(spec: Spec, verdicts: list[Verdict], protocol: str = "published", turns: int = 10) -> NarrativeEnv:
    actions = [f"I act ({i})." for i in range(turns + 1)]
    return NarrativeEnv(spec, player=ReplayPlayer(actions), auditor=ReplayAuditor(verdicts), max_turns=turns,
                        protocol=protocol)


def play(env: NarrativeEnv, n: int) -> list[dict[str, object]]:
    env.reset(seed=0)
    env.step("The opening.")
    return [env.step(f"Reply {i}.")[4] for i in range(n)]


# -- the presets -----------------------------------------------------------------------------------

def test_published_is_the_default_and_presets_are_named_and_versioned() -> None:
    assert get_protocol(None) is PUBLISHED and PUBLISHED.label == "published/1"
    assert get_protocol("grounded") is GROUNDED and GROUNDED.label == "grounded/1"
    with pytest.raises(ValueError, match="unknown protocol 'strict'; known: published, grounded"):
        get_protocol("strict")


def test_records_carry_the_protocol(tiny: Spec) -> None:
    env = env_with(tiny, [], protocol="grounded", turns=1)
    play(env, 1)
    assert env.record().protocol == "grounded/1"


# -- conflicts -------------------------------------------------------------------------------------

def test_conflicting_turn_commits_nothing_and_marks_a_broken_commitment_violated(tiny: Spec) -> None:
    g, state = TrajectoryGraph(tiny), opened(tiny, FactDiff(add=["Fog."]))
    verdict = Verdict(conflicts=[Conflict(kind=ConflictKind.COMMITMENT, target="c_0", evidence="x", reason="r")],
                      fact_diff=FactDiff(add=["never committed"]), completed_nodes=["s_0"])
    out = apply_turn(tiny, g, state, "I act.", "x", verdict, PUBLISHED, 10)
    assert out.outcome is Outcome.CONFLICT and out.terminated and not out.committed
    assert out.state.ledger == state.ledger and out.state.transcript == state.transcript
    assert out.state.completed_nodes == () and out.state.commitments.get("c_0").status is Status.VIOLATED


def unquoted_conflict() -> Verdict:
    # grounded=True is the field's default: the core must not take the auditor's word for it.
    return Verdict(conflicts=[Conflict(kind=ConflictKind.COMMITMENT, target="c_0", evidence="you open the vault now",
                                       reason="opened early", grounded=True)],
                   fact_diff=FactDiff(add=["Mara waits by the rail."]))


def test_grounded_refuses_a_conflict_whose_quote_is_not_in_the_reply_whatever_the_auditor(tiny: Spec) -> None:
    g, state = TrajectoryGraph(tiny), opened(tiny)
    reply = "Mara waits by the rail while the ferry docks."
    out = apply_turn(tiny, g, state, "I wait.", reply, unquoted_conflict(), GROUNDED, 10)
    assert out.outcome is Outcome.ONGOING and out.committed and not out.terminated
    assert out.state.commitments.get("c_0").status is Status.PENDING, "an unquoted claim breaks nothing"
    assert out.state.ledger.active()[-1].content == "Mara waits by the rail.", "the turn commits as a clean one"
    recorded = out.record.verdict
    assert recorded.conflicts == [] and [c.target for c in recorded.overturned] == ["c_0"]
    assert not recorded.overturned[0].grounded and "grounded/1: the quote is not in the reply" in recorded.overturned[0].reason
    assert out.ungrounded_conflicts == recorded.overturned


def test_published_lets_the_same_unquoted_conflict_stand(tiny: Spec) -> None:
    # The published protocol leaves evidence to the double check: the core does not look at quotes.
    g, state = TrajectoryGraph(tiny), opened(tiny)
    out = apply_turn(tiny, g, state, "I wait.", "Mara waits by the rail while the ferry docks.", unquoted_conflict(),
                     PUBLISHED, 10)
    assert out.outcome is Outcome.CONFLICT and not out.committed and out.ungrounded_conflicts == []
    assert out.record.verdict == unquoted_conflict()
    assert out.state.commitments.get("c_0").status is Status.VIOLATED


def test_grounded_keeps_a_conflict_quoted_with_other_spacing_and_quote_marks(tiny: Spec) -> None:
    g, state = TrajectoryGraph(tiny), opened(tiny)
    verdict = Verdict(conflicts=[Conflict(kind=ConflictKind.FACT, target="f_1", evidence="“the key   MELTS”",
                                          reason="f_1 says it is intact", grounded=False)])
    out = apply_turn(tiny, g, state, "I look.", 'And then "the key melts" in her pocket.', verdict, GROUNDED, 10)
    assert out.outcome is Outcome.CONFLICT and out.ungrounded_conflicts == []
    assert out.record.verdict.conflicts[0].grounded, "the core's finding is what the record says"


def test_a_grounded_run_checks_quotes_with_a_replayed_auditor(tiny: Spec) -> None:
    env = env_with(tiny, [Verdict(), unquoted_conflict()], protocol="grounded")
    infos = play(env, 2)
    assert [i["outcome"] for i in infos] == ["ONGOING", "ONGOING"]
    record = env.record()
    assert record.conflict_kinds == [] and record.history[1].committed
    assert [c.target for c in record.history[1].verdict.overturned] == ["c_0"]


def test_a_verdict_that_cannot_apply_is_an_audit_error_not_a_verdict(tiny: Spec) -> None:
    g, state = TrajectoryGraph(tiny), opened(tiny)
    with pytest.raises(AuditError, match="f_99"):
        apply_turn(tiny, g, state, "I act.", "x", Verdict(fact_diff=FactDiff(negate=["f_99"])), PUBLISHED, 10)


# -- the plot --------------------------------------------------------------------------------------

def test_published_credits_only_the_current_node_and_one_per_turn(tiny: Spec) -> None:
    g, state = TrajectoryGraph(tiny), opened(tiny)
    assert audit_frontier(g, state, PUBLISHED) == ("s_0",)
    out = apply_turn(tiny, g, state, "I act.", "x", Verdict(completed_nodes=["s_0", "s_1"]), PUBLISHED, 10)
    assert out.completed_nodes == ["s_0"] and out.rejected_nodes == ["s_1"]


def test_grounded_credits_several_frontier_nodes_in_plot_order(tiny: Spec) -> None:
    g, state = TrajectoryGraph(tiny), opened(tiny)
    out = apply_turn(tiny, g, state, "I act.", "x", Verdict(completed_nodes=["s_1", "s_0", "s_3"]), GROUNDED, 10)
    assert out.completed_nodes == ["s_0", "s_1"] and out.rejected_nodes == ["s_3"]


def test_trigger_at_turn_two_and_key_delta_at_turn_three_complete_the_node(tiny: Spec) -> None:
    trigger = Verdict(node_evidence=[NodeEvidence(node="s_0", trigger=True)])
    delta = Verdict(node_evidence=[NodeEvidence(node="s_0", key_delta=True)])
    env = env_with(tiny, [Verdict(), Verdict(), trigger, delta])
    infos = play(env, 3)
    assert [i["completed_nodes"] for i in infos] == [[], [], ["s_0"]]
    assert env.history[3].completed_nodes == ["s_0"]


def test_grounded_needs_trigger_and_key_delta_in_the_same_reply(tiny: Spec) -> None:
    trigger = Verdict(node_evidence=[NodeEvidence(node="s_0", trigger=True)])
    delta = Verdict(node_evidence=[NodeEvidence(node="s_0", key_delta=True)])
    both = Verdict(node_evidence=[NodeEvidence(node="s_0", trigger=True, key_delta=True)])
    infos = play(env_with(tiny, [Verdict(), trigger, delta, both], protocol="grounded"), 3)
    assert [i["completed_nodes"] for i in infos] == [[], [], ["s_0"]]


# -- commitment statuses ---------------------------------------------------------------------------

def test_a_commitment_satisfied_at_turn_two_and_reverted_at_turn_four_counts_as_pending(tiny: Spec) -> None:
    satisfied = Verdict(commitment_updates=[CommitmentUpdate(id="c_1", status=SAT, evidence=["f_1"])])
    reverted = Verdict(commitment_updates=[CommitmentUpdate(id="c_1", status=PEND)])
    env = env_with(tiny, [Verdict(), Verdict(), satisfied, Verdict(), reverted])
    infos = play(env, 4)
    assert [i["commitments"]["c_1"] for i in infos] == ["PENDING", "SATISFIED", "SATISFIED", "PENDING"]
    assert env.record().satisfied_share == 0.0
    assert [t.reward for t in env.history[1:]] == [0.0, 1.0, 0.0, -1.0], "a revert takes back what it paid"


def test_grounded_statuses_only_move_forward(tiny: Spec) -> None:
    satisfied = Verdict(commitment_updates=[CommitmentUpdate(id="c_1", status=SAT)])
    reverted = Verdict(commitment_updates=[CommitmentUpdate(id="c_1", status=PEND)])
    infos = play(env_with(tiny, [Verdict(), satisfied, reverted], protocol="grounded"), 2)
    assert [i["commitments"]["c_1"] for i in infos] == ["SATISFIED", "SATISFIED"]


def test_published_credits_nothing_from_the_plot_graph(tiny: Spec) -> None:
    # c_2 is the achievement tied to s_0: completing s_0 proves it, but only the status check may say so.
    infos = play(env_with(tiny, [Verdict(), Verdict(completed_nodes=["s_0"])]), 1)
    assert infos[0]["completed_nodes"] == ["s_0"] and infos[0]["commitments"]["c_2"] == "PENDING"
    infos = play(env_with(tiny, [Verdict(), Verdict(completed_nodes=["s_0"])], protocol="grounded"), 1)
    assert infos[0]["commitments"]["c_2"] == "SATISFIED"


def test_success_when_the_status_check_satisfies_every_achievement(tiny: Spec) -> None:
    achieved = [CommitmentUpdate(id="c_2", status=SAT), CommitmentUpdate(id="c_3", status=SAT)]
    env = env_with(tiny, [Verdict(), Verdict(), Verdict(commitment_updates=achieved)])
    env.reset(seed=0)
    env.step("The opening.")
    env.step("Reply.")
    _, _, terminated, truncated, info = env.step("Reply.")
    assert terminated and not truncated and info["outcome"] == "SUCCESS" and info["turn"] == 2


def test_survival_at_the_turn_limit_is_a_truncation(tiny: Spec) -> None:
    env = env_with(tiny, [], turns=2)
    env.reset(seed=0)
    env.step("The opening.")
    env.step("Reply.")
    _, _, terminated, truncated, info = env.step("Reply.")
    assert truncated and not terminated and info["outcome"] == "SURVIVAL" and env.record().turns == 2


# -- facts -----------------------------------------------------------------------------------------

def test_the_opening_facts_are_visible_before_turn_one_commits_them(tiny: Spec) -> None:
    state = opened(tiny, FactDiff(add=["Fog covers the sea."], negate=["f_0"]))
    assert len(state.ledger.facts) == 4, "committed together with turn 1"
    env = env_with(tiny, [Verdict(fact_diff=FactDiff(add=["Fog covers the sea."]))])
    env.reset(seed=0)
    _, info = env.step("Fog.")[3:]
    request = info["narrator_request"]
    assert "f_4: Fog covers the sea." in request.facts and request.pending_facts == ("new: Fog covers the sea.",)


def test_turn_one_commits_the_opening_diff_first_then_its_own(tiny: Spec) -> None:
    g = TrajectoryGraph(tiny)
    state = opened(tiny, FactDiff(add=["Fog covers the sea."]))
    out = apply_turn(tiny, g, state, "I look.", "You see fog.", Verdict(fact_diff=FactDiff(add=["Mara sees fog."])),
                     PUBLISHED, 10)
    assert [f.content for f in out.state.ledger.changed_in(1)] == ["Fog covers the sea.", "Mara sees fog."]
    assert out.state.transcript[-1].facts_added == ("f_4: Fog covers the sea.", "f_5: Mara sees fog.")
    assert out.state.pending_diff.is_empty()


# -- empty narration -------------------------------------------------------------------------------

def test_empty_narration_is_refused_and_changes_nothing(tiny: Spec) -> None:
    auditor = ReplayAuditor([])
    env = NarrativeEnv(tiny, player=ReplayPlayer(["I jump."]), auditor=auditor)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="empty"):
        env.step("  \n ")
    env.step("The opening.")
    before, calls = env.snapshot(), auditor.calls
    with pytest.raises(ValueError, match="narration is empty"):
        env.step("   ")
    assert env.snapshot() == before and auditor.calls == calls


def test_a_session_the_person_quits_survives_with_its_committed_turns_and_an_ended_one_stays(tiny: Spec) -> None:
    state = opened(tiny)
    quit_now = apply_quit(state)
    assert quit_now.outcome is Outcome.SURVIVAL and quit_now.done and quit_now.turn == state.turn
    conflicted = state.finish(Outcome.CONFLICT)
    assert apply_quit(conflicted) is conflicted, "quitting never rewrites how an episode ended"
