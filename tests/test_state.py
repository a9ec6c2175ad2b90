"""Ledger, commitments, trajectory and episode state: the pure core."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ncpbench.commitments import CommitmentUpdate, Status
from ncpbench.ledger import FactDiff, FactLedger, LedgerError
from ncpbench.protocol import GROUNDED, PUBLISHED, apply_turn
from ncpbench.spec import Spec
from ncpbench.state import EpisodeState
from ncpbench.trajectory import TrajectoryGraph
from ncpbench.verdict import Verdict


def test_ledger_adds_with_next_ids_and_records_the_turn(tiny: Spec) -> None:
    ledger = FactLedger.from_spec(tiny).apply(FactDiff(add=["Mara is on Skerry Island."], negate=["f_0"]), turn=1)
    assert ledger.get("f_4").content == "Mara is on Skerry Island." and ledger.get("f_4").added_turn == 1
    assert ledger.get("f_0").negated and ledger.get("f_0").negated_turn == 1
    assert [f.id for f in ledger.active()] == ["f_1", "f_2", "f_3", "f_4"]
    assert {f.id for f in ledger.changed_in(1)} == {"f_0", "f_4"}


def test_negated_fact_stays_for_traceability(tiny: Spec) -> None:
    ledger = FactLedger.from_spec(tiny).apply(FactDiff(negate=["f_2"]), turn=3)
    assert "f_2" in ledger and ledger.get("f_2").negated


def test_unknown_fact_id_in_a_diff_is_an_error_and_nothing_applies(tiny: Spec) -> None:
    ledger = FactLedger.from_spec(tiny)
    with pytest.raises(LedgerError, match="f_99"):
        ledger.apply(FactDiff(add=["A new fact."], negate=["f_1", "f_99"]), turn=1)
    assert ledger == FactLedger.from_spec(tiny)


def test_negating_twice_is_an_error(tiny: Spec) -> None:
    ledger = FactLedger.from_spec(tiny).apply(FactDiff(negate=["f_1"]), turn=1)
    with pytest.raises(LedgerError, match="already negated"):
        ledger.apply(FactDiff(negate=["f_1"]), turn=2)


def test_ledger_at_turn_rewinds_additions_and_negations(tiny: Spec) -> None:
    start = FactLedger.from_spec(tiny)
    later = start.apply(FactDiff(add=["x happened."]), 1).apply(FactDiff(negate=["f_0"]), 2)
    assert later.at_turn(0) == start
    assert later.at_turn(1) == start.apply(FactDiff(add=["x happened."]), 1)


def test_trajectory_is_linear_by_default_with_ordering_edges(tiny: Spec) -> None:
    g = TrajectoryGraph(tiny)
    assert g.frontier([]) == ["s_0"]
    assert g.frontier(["s_0"]) == ["s_1"]
    assert g.check_skip("s_2", ["s_0"]).missing == ("s_1",)
    assert g.check_skip("s_1", ["s_0"]).ok
    assert g.progress(["s_0", "s_1"]) == 0.5
    assert g.cycle() is None


def test_requires_makes_branches_and_joins(tiny: Spec) -> None:
    nodes = list(tiny.trajectory)
    nodes[2] = nodes[2].model_copy(update={"requires": ["s_0"]})
    nodes[3] = nodes[3].model_copy(update={"requires": ["s_1", "s_2"]})
    spec = tiny.model_copy(update={"trajectory": nodes, "commitments": tiny.commitments[1:]})
    g = TrajectoryGraph(spec)
    assert g.frontier(["s_0"]) == ["s_1", "s_2"]
    assert g.check_skip("s_3", ["s_0", "s_1"]).missing == ("s_2",)


def test_commitment_statuses_move_forward_only(tiny: Spec) -> None:
    state = EpisodeState.initial(tiny)
    book = state.commitments.apply([CommitmentUpdate(id="c_1", status=Status.VIOLATED, evidence=["quote"])], 2)
    book = book.apply([CommitmentUpdate(id="c_1", status=Status.SATISFIED)], 3)
    assert book.get("c_1").status is Status.VIOLATED and book.get("c_1").turn == 2
    with pytest.raises(KeyError):
        book.apply([CommitmentUpdate(id="c_9", status=Status.SATISFIED)], 3)


def test_completing_an_achievement_node_satisfies_it_structurally(tiny: Spec) -> None:
    g = TrajectoryGraph(tiny)
    state = apply_turn(tiny, g, EpisodeState.initial(tiny), "I step off.", "The gangway drops.",
                       Verdict(completed_nodes=["s_0"]), GROUNDED, 10).state
    assert state.commitments.get("c_2").status is Status.SATISFIED
    assert state.commitments.get("c_2").evidence == ("s_0",)
    assert not state.commitments.all_achieved()


def test_opening_diff_commits_with_turn_one(tiny: Spec) -> None:
    g = TrajectoryGraph(tiny)
    state = EpisodeState.initial(tiny).with_opening("Fog.", FactDiff(add=["Fog covers the sea."]))
    assert len(state.ledger.facts) == 4
    state = apply_turn(tiny, g, state, "I look.", "You see fog.", Verdict(fact_diff=FactDiff(add=["Mara sees fog."])),
                       PUBLISHED, 10).state
    assert [f.content for f in state.ledger.changed_in(1)] == ["Fog covers the sea.", "Mara sees fog."]
    assert state.pending_diff.is_empty()


texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40).filter(str.strip)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=st.lists(st.tuples(texts, texts, st.lists(texts, max_size=3), st.integers(0, 3), st.booleans()),
                      max_size=6))
def test_state_json_round_trips_exactly(tiny: Spec, turns: list[tuple[str, str, list[str], int, bool]]) -> None:
    g = TrajectoryGraph(tiny)
    state = EpisodeState.initial(tiny).with_opening("Opening “quoted” — text.", FactDiff(add=["An opening fact."]))
    for action, reply, adds, negate_index, advance in turns:
        active = [f.id for f in state.ledger.active()]
        negate = [active[negate_index % len(active)]] if active and negate_index else []
        frontier = g.frontier(state.completed_nodes)
        verdict = Verdict(fact_diff=FactDiff(add=adds, negate=negate), completed_nodes=frontier[:1] if advance else [])
        state = apply_turn(tiny, g, state, action, reply, verdict, PUBLISHED, 100).state
    again = EpisodeState.from_json(state.to_json())
    assert again == state
    assert again.to_json() == state.to_json()
