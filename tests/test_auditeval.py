"""Auditor validity: the planted-conflict suite, its scoring maths, and runs end to end."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import Counter
from pathlib import Path

import pytest
from ncpbench.auditors import prompts

from ncpbench.auditeval import (
    CATEGORIES,
    CLEAN_CATEGORIES,
    LONG_RANGE_CATEGORIES,
    AuditCase,
    CaseResult,
    Gold,
    Scores,
    bootstrap_f1,
    dump_cases,
    evaluate,
    generate_suite,
    load_cases,
    narrate_violation,
    negate_fact,
    rescore,
    run_audit_eval,
    score,
    wilson,
)
from ncpbench.auditeval.report import Block, CaseCard, Heading, Para, Table, render_html, render_markdown
from ncpbench.auditeval.scoring import kappa
from ncpbench.cli import audit_eval
from ncpbench.commitments import CommitmentUpdate, Status
from ncpbench.dataset import bundled
from ncpbench.models.client import ModelClient
from ncpbench.models.config import RoleConfig
from ncpbench.models.mock_server import MockConfig, MockServer
from ncpbench.protocol import PUBLISHED, AuditProtocol
from ncpbench.protocols import AuditRequest
from ncpbench.spec import Spec
from ncpbench.trajectory import TrajectoryGraph
from ncpbench.verdict import Conflict, ConflictKind, Verdict

FACT, COMMITMENT, PLAYER = ConflictKind.FACT, ConflictKind.COMMITMENT, ConflictKind.PLAYER_INPUT


@pytest.fixture(scope="module")
def specs() -> list[Spec]:
    return list(bundled())


@pytest.fixture(scope="module")
def suite(specs: list[Spec]) -> list[AuditCase]:
    return generate_suite(specs, 540, seed=0)


# -- generation ------------------------------------------------------------------------------------


def test_same_seed_gives_byte_identical_cases_jsonl_and_another_seed_differs(specs: list[Spec],
                                                                             tmp_path: Path) -> None:
    dump_cases(generate_suite(specs, 45, seed=3), tmp_path / "a.jsonl")
    dump_cases(generate_suite(specs, 45, seed=3), tmp_path / "b.jsonl")
    dump_cases(generate_suite(specs, 45, seed=4), tmp_path / "c.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert (tmp_path / "a.jsonl").read_bytes() != (tmp_path / "c.jsonl").read_bytes()
    assert load_cases(tmp_path / "a.jsonl") == generate_suite(specs, 45, seed=3)


def test_a_smaller_suite_is_a_prefix_of_a_larger_one(specs: list[Spec], suite: list[AuditCase]) -> None:
    assert generate_suite(specs, 40, seed=0) == suite[:40]


def test_default_suite_has_540_cases_balanced_across_categories_and_environments(suite: list[AuditCase]) -> None:
    assert len(suite) == 540 and len({c.id for c in suite}) == 540
    assert Counter(c.category for c in suite) == {cat: 60 for cat in CATEGORIES}
    per_env = Counter(c.env_id for c in suite)
    assert len(per_env) == 100 and 3 <= min(per_env.values()) and max(per_env.values()) <= 10
    # Any prefix stays balanced to within one case per category.
    counts = Counter(c.category for c in suite[:40])
    assert max(counts.values()) - min(counts.values()) <= 1
    # Half the clean controls complete the frontier node, so trajectory agreement has both answers.
    controls = [c for c in suite if c.category in CLEAN_CATEGORIES]
    assert sum(c.gold.completes for c in controls) == len(controls) // 2


def test_every_label_is_consistent_with_how_its_state_and_reply_were_built(specs: list[Spec],
                                                                            suite: list[AuditCase]) -> None:
    by_key = {s.key: s for s in specs}
    for case in suite:
        spec = by_key[case.env_id]
        graph = TrajectoryGraph(spec)
        state = case.state
        done = set(state.completed_nodes)
        assert 1 <= state.turn <= 3 and len(state.transcript) == state.turn + 1, case.id
        assert state.completed_nodes == tuple(graph.order[:len(done)]) and done, case.id
        assert case.frontier == tuple(graph.frontier(done)) and case.frontier_node == graph.order[len(done)]
        assert case.planted in case.reply
        assert (case.category in CLEAN_CATEGORIES) == case.gold.is_clean, case.id
        node = graph.descriptions[case.frontier_node]
        narrated = node.trigger_event in case.reply and node.key_delta in case.reply
        assert case.gold.completes == narrated, case.id
        if case.category == "fact_contradiction":
            (fid,) = case.gold.targets["fact"][:1]
            assert fid in {f.id for f in state.ledger.active()}, case.id
        if case.category == "step_skip":
            c = next(c for c in spec.commitments if c.id == case.gold.targets["commitment"][0])
            assert c.before not in done and c.after not in done and c.after != case.frontier_node
            later = graph.descriptions[c.after or ""]
            assert later.trigger_event in case.reply and later.key_delta in case.reply
        if case.category == "invariant_break":
            c = next(c for c in spec.commitments if c.id == case.gold.targets["commitment"][0])
            assert (c.from_ is None or c.from_ in done) and (c.until is None or c.until not in done), case.id
        if case.category == "hn_fact_event":
            assert any(f.content.endswith("is carrying " + case.player_action[len("I put "):].split(" down")[0] + ".")
                       for f in state.ledger.active()), case.id
        pending = {c.id for c in state.commitments.items if c.status is Status.PENDING}
        assert set(case.gold.satisfied) <= pending


def test_hand_checked_sample_of_five_cases_from_seed_0(suite: list[AuditCase]) -> None:
    by_index = {c.index: c for c in suite}

    # 0001, Predator: the reply asserts the negation of initial fact f_0 with no event that could
    # have changed what the Predator is ("Nobody ... finds anything strange") -> a fact conflict on f_0.
    # A commitment claim is tolerated (negating a premise might also touch an invariant).
    c = by_index[1]
    assert c.id == "0001-fact_contradiction-predator"
    assert c.reply.endswith("The Predator is not an alien hunter who has come to a Central American jungle to hunt. "
                            "Nobody around you finds anything strange about it.")
    assert (c.gold.kinds, c.gold.targets, c.gold.tolerated) == ([FACT], {"fact": ["f_0"]}, [COMMITMENT])

    # 0002, Dial M for Murder (v1): only s_0 is done, yet the reply narrates s_13's trigger and key
    # delta (Tony opens the flat with the hidden key). c_6 orders s_11 before s_13 and s_11 has not
    # happened -> a commitment conflict on c_6 (c_9, the invariant that closes at s_13, is also named);
    # the frontier node (s_1) is not what was narrated, so nothing completes.
    c = by_index[2]
    assert c.id == "0002-step_skip-dial-m-for-murder" and c.state.completed_nodes == ("s_0",)
    assert c.reply == ("You stand still and listen. You hear ordinary sounds: footsteps, voices, the hum of the place "
                       "around you. Tony takes Margot's key from under the stair carpet and opens the flat door with "
                       "it. Tony has used the hidden key in front of Hubbard's watchers.")
    assert c.gold.kinds == [COMMITMENT] and c.gold.targets["commitment"] == ["c_6", "c_9"]
    assert not c.gold.completes

    # 0005, The Big Sleep: the player goes through their belongings; the reply refuses with no reason
    # at all ("you cannot. Nothing happens.") -> a player-input conflict.
    c = by_index[5]
    assert c.player_action == "I go through my belongings, one item at a time."
    assert c.reply == "You try to go through your belongings, but you cannot. Nothing happens."
    assert c.gold.kinds == [PLAYER]

    # 0007, Tombstone: turn 1 committed "Ike Clanton is carrying a stub of pencil." (f_17); now the
    # player puts it down and the reply narrates exactly that -> f_17 changes through an in-story
    # event, which the protocol allows: no conflict (a hard negative for fact checks).
    c = by_index[7]
    assert c.state.ledger.get("f_17").content == "Ike Clanton is carrying a stub of pencil."
    assert c.player_action == "I put a stub of pencil down and leave it behind."
    assert c.reply == "You put a stub of pencil down and leave it where it lies. You are no longer carrying it."
    assert c.gold.is_clean and not c.gold.completes

    # 0015, Casino Royale: the action (sit down) is refused because every seat is taken and the
    # ground is wet -- a reason inside the story, so not a player-input conflict -- and the reply
    # then narrates the frontier node s_6's trigger and key delta, so s_6 completes.
    c = by_index[15]
    assert c.frontier_node == "s_6" and c.gold.is_clean and c.gold.completes
    assert c.reply.startswith("You look for somewhere to sit, but every seat nearby is taken and the ground is "
                              "soaking wet, so you lean against the wall to catch your breath instead. Vesper sits")


def test_fact_negation_handles_common_shapes_and_declines_the_rest() -> None:
    assert negate_fact("Dallas is the captain of the Nostromo.") == "Dallas is not the captain of the Nostromo."
    assert negate_fact("Henry has not met Karen.") == "Henry has met Karen."
    assert negate_fact("Willard has never been up the Nung River.") == "Willard has been up the Nung River."
    assert negate_fact("Marlowe carries a handgun.") == "Marlowe does not carry a handgun."
    assert negate_fact("Dilios has sight in both of his eyes.") == "Dilios does not have sight in both of his eyes."
    assert (negate_fact("The FBI does not know Buffalo Bill's real name.")
            == "The FBI does know Buffalo Bill's real name.")
    assert negate_fact("Ripley and the crew believe Ash is human.") == "Ripley and the crew do not believe Ash is human."
    assert negate_fact("Ripley cannot read MOTHER's directives.") == "Ripley can read MOTHER's directives."
    assert negate_fact("Report cards have not yet been handed out.") == "Report cards have already been handed out."
    # Shapes we cannot negate reliably are declined, never guessed.
    assert negate_fact("Nobody from SHIELD has contacted Tony.") is None
    assert negate_fact("The man who killed Inigo's father has six fingers.") is None
    assert negate_fact("Angier has no stage act of his own.") is None


def test_violation_conditions_lose_their_timing_words() -> None:
    assert narrate_violation("Little Bill dies before s_14.") == "Little Bill dies"
    assert narrate_violation("Before s_13 Frank learns that Harmonica is the boy.") == "Frank learns that Harmonica is the boy"
    assert narrate_violation("Ethan dies at any point from s_0 to s_15.") == "Ethan dies"
    assert narrate_violation("Broom dies before or during s_13.") == "Broom dies"
    assert narrate_violation("Between s_2 and s_13 the briefcase is lost.") == "The briefcase is lost"
    assert narrate_violation("At any point up to s_14 the narration names the contents.") is None


# -- scoring maths ---------------------------------------------------------------------------------


def _case(base: AuditCase, i: int, category: str, gold: Gold) -> AuditCase:
    return base.model_copy(update={"id": f"h{i:02d}", "index": i, "category": category, "gold": gold})


def _conflicts(*kinds: ConflictKind, target: str | None = None) -> list[Conflict]:
    return [Conflict(kind=k, target=target, evidence="quoted", reason="r") for k in kinds]


def test_scores_on_hand_made_verdicts_match_hand_computed_figures(suite: list[AuditCase]) -> None:
    base = suite[0]  # Network: 2 of 16 commitments settled, 14 pending
    pending = [c.id for c in base.state.commitments.items if c.status is Status.PENDING]
    assert len(pending) == 14
    cases: list[AuditCase] = []
    verdicts: list[Verdict] = []

    def add(category: str, gold: Gold, verdict: Verdict) -> None:
        cases.append(_case(base, len(cases), category, gold))
        verdicts.append(verdict)

    fact_gold = Gold(kinds=[FACT], targets={"fact": ["f_3"]}, why="planted")
    add("fact_contradiction", fact_gold, Verdict(conflicts=_conflicts(FACT, target="f_3")))
    add("fact_contradiction", fact_gold, Verdict(conflicts=_conflicts(FACT, target="f_3")))
    add("fact_contradiction", fact_gold, Verdict(conflicts=_conflicts(FACT, target="f_9")))  # wrong id
    add("fact_contradiction", fact_gold, Verdict())  # missed
    commit_gold = Gold(kinds=[COMMITMENT], targets={"commitment": ["c_4"]}, tolerated=[FACT], why="planted")
    add("step_skip", commit_gold, Verdict(conflicts=_conflicts(COMMITMENT, target="c_4") + _conflicts(FACT)))
    add("step_skip", commit_gold, Verdict())  # missed
    add("action_blocked", Gold(kinds=[PLAYER], why="planted"), Verdict(conflicts=_conflicts(PLAYER)))
    add("action_ignored", Gold(kinds=[PLAYER], why="planted"), Verdict(conflicts=_conflicts(PLAYER, FACT)))
    # Six clean controls: one false fact alarm; of the five passed, three complete the frontier node.
    add("clean", Gold(why="clean"), Verdict(conflicts=_conflicts(FACT, target="f_1")))
    add("clean", Gold(completes=True, satisfied=["c_2"], why="clean"),
        Verdict(completed_nodes=["s_5"], commitment_updates=[CommitmentUpdate(id="c_2", status=Status.SATISFIED)]))
    add("clean", Gold(completes=True, why="clean"), Verdict(completed_nodes=["s_5"]))
    add("hn_rumour", Gold(completes=True, why="hn"), Verdict())  # trajectory miss
    add("hn_fact_event", Gold(why="hn"), Verdict(completed_nodes=["s_5"]))  # trajectory false completion
    add("hn_blocked_with_reason", Gold(why="hn"),
        Verdict(commitment_updates=[CommitmentUpdate(id="c_3", status=Status.SATISFIED)]))  # status wrong
    results = [CaseResult(case_id=c.id, verdict=v, seconds=2.0) for c, v in zip(cases, verdicts, strict=True)]
    results.append(CaseResult(case_id="h99", error="boom"))
    cases.append(_case(base, 99, "clean", Gold(why="errored")))
    cases.append(_case(base, 98, "clean", Gold(why="never reached: the run was interrupted")))

    s = score(cases, results, seed=1, bootstrap_rounds=300)
    assert (s.cases, s.scored, s.errors, s.missing) == (16, 14, 1, 1)

    fact = s.kinds["fact"]
    # fact: TP 3 (f_9 is the wrong id but the right kind), FN 1; FP = clean alarm + action_ignored extra = 2;
    # the step_skip case with an extra fact claim tolerates it (skipped, 2 cases); TN = 6.
    assert (fact.tp, fact.fp, fact.fn, fact.tn, fact.skipped) == (3, 2, 1, 6, 2)
    assert fact.precision.value == pytest.approx(3 / 5) and fact.recall.value == pytest.approx(3 / 4)
    assert fact.f1 == pytest.approx(2 * 3 / (2 * 3 + 2 + 1))  # 0.667
    # Wilson, z = 1.96: 3/5 -> (0.6 + z²/10 ± z·sqrt(0.6·0.4/5 + z²/100)) / (1 + z²/5) = (0.2307, 0.8824)
    assert (fact.precision.low, fact.precision.high) == pytest.approx((0.2307, 0.8824), abs=1e-4)
    # 3/4 -> (0.75 + z²/8 ± z·sqrt(0.75·0.25/4 + z²/64)) / (1 + z²/4) = (0.3006, 0.9544)
    assert (fact.recall.low, fact.recall.high) == pytest.approx((0.3006, 0.9544), abs=1e-4)
    assert fact.target.k == 2 and fact.target.n == 3  # two of three hits named f_3
    assert fact.f1 is not None and fact.f1_low is not None and fact.f1_high is not None
    assert fact.f1_low <= fact.f1 <= fact.f1_high

    commit = s.kinds["commitment"]
    assert (commit.tp, commit.fp, commit.fn, commit.tn) == (1, 0, 1, 12)
    assert commit.precision.value == 1.0 and commit.recall.value == 0.5 and commit.f1 == pytest.approx(2 / 3)
    player = s.kinds["player_input"]
    assert (player.tp, player.fp, player.fn, player.tn) == (2, 0, 0, 12) and player.f1 == 1.0

    # One false alarm on six clean controls: Wilson 1/6 = (0.0301, 0.5635).
    assert (s.fpr.k, s.fpr.n) == (1, 6)
    assert (s.fpr.low, s.fpr.high) == pytest.approx((0.0301, 0.5635), abs=1e-4)
    assert (s.fpr_clean.k, s.fpr_clean.n, s.fpr_hard_negatives.k, s.fpr_hard_negatives.n) == (1, 3, 0, 3)
    assert (s.recall_any.k, s.recall_any.n) == (6, 8)

    # Trajectory on the 5 passed controls: TP 2, FN 1, FP 1, TN 1 -> agreement 3/5;
    # kappa = (0.6 - pe) / (1 - pe), pe = (3·3 + 2·2) / 25 = 0.52 -> 1/6.
    t = s.trajectory
    assert (t.tp, t.fn, t.fp, t.tn) == (2, 1, 1, 1) and s.trajectory_skipped == 1
    assert t.agreement.value == pytest.approx(0.6) and t.kappa == pytest.approx(1 / 6)
    # Status: every case but the hn_blocked one has the right set -> 4/5; per decision over 5 × 14.
    assert (s.status.cases.k, s.status.cases.n) == (4, 5)
    d = s.status.decisions
    assert (d.tp, d.fp, d.fn, d.tn) == (1, 1, 0, 5 * 14 - 2)

    table = s.by_category
    assert table["fact_contradiction"] == {"n": 4, "correct": 3, "none": 1, "fact": 3, "commitment": 0,
                                           "player_input": 0}
    assert table["step_skip"]["correct"] == 1 and table["action_ignored"]["correct"] == 0
    wrong = {m.case_id: m for m in s.misjudged}
    assert wrong["h02"].problems == ["right kind (fact) but wrong id: named f_9, expected one of f_3"]
    assert not wrong["h02"].conflict_axis and wrong["h03"].conflict_axis
    assert "h01" not in wrong and "h04" not in wrong
    assert s.seconds_total == 28.0


def test_wilson_and_kappa_edge_cases() -> None:
    assert wilson(0, 0).value is None
    w = wilson(0, 4)
    assert w.value == 0 and w.low == 0 and w.high == pytest.approx(0.4899, abs=1e-4)
    assert wilson(5, 5).high == 1.0
    assert kappa(5, 0, 0, 5) == 1.0 and kappa(0, 0, 0, 10) is None


def test_bootstrap_f1_is_seeded_and_brackets_the_estimate() -> None:
    pairs = [(True, True)] * 6 + [(True, False)] * 2 + [(False, True)] * 2 + [(False, False)] * 10
    a = bootstrap_f1(pairs, seed=7, rounds=500)
    assert a == bootstrap_f1(pairs, seed=7, rounds=500)
    assert a != bootstrap_f1(pairs, seed=8, rounds=500)
    low, high = a
    assert low is not None and high is not None and low < 0.75 < high  # F1 = 12 / 16
    assert bootstrap_f1([(True, True)] * 5, seed=0, rounds=50) == (1.0, 1.0)
    assert bootstrap_f1([(False, False)] * 5, seed=0, rounds=50) == (None, None)


# -- scripted auditors, end to end ----------------------------------------------------------------


class OracleAuditor:
    """Answers from the gold label: every figure must come out perfect."""

    def __init__(self, cases: list[AuditCase]) -> None:
        self.gold = {(c.state.model_dump_json(), c.player_action, c.reply): c for c in cases}

    def audit(self, request: AuditRequest) -> Verdict:
        case = self.gold[(request.state.model_dump_json(), request.player_action or "", request.reply)]
        g = case.gold
        conflicts = [Conflict(kind=k, target=next(iter(g.targets.get(k.value, [])), None), evidence=case.planted,
                              reason="planted") for k in g.kinds]
        if conflicts:
            return Verdict(conflicts=conflicts)
        return Verdict(completed_nodes=[case.frontier_node] if g.completes and case.frontier_node else [],
                       commitment_updates=[CommitmentUpdate(id=c, status=Status.SATISFIED) for c in g.satisfied])


class AlarmistAuditor:
    """Calls every reply a player-input conflict (async, to exercise awaiting)."""

    async def audit(self, request: AuditRequest) -> Verdict:
        return Verdict(conflicts=[Conflict(kind=PLAYER, evidence=request.reply[:20], reason="always")])


def test_an_oracle_auditor_scores_perfectly(specs: list[Spec], suite: list[AuditCase]) -> None:
    cases = suite[:90]
    s = score(cases, asyncio.run(evaluate(OracleAuditor(cases), cases, 8)), bootstrap_rounds=200)
    for k in s.kinds.values():
        assert (k.precision.value, k.recall.value, k.f1) == (1.0, 1.0, 1.0)
        assert (k.f1_low, k.f1_high) == (1.0, 1.0)
    assert s.kinds["fact"].target.value == 1.0 and s.kinds["commitment"].target.value == 1.0
    assert s.fpr.k == 0 and s.fpr.n == 40
    assert s.trajectory.agreement.value == 1.0 and s.status.cases.value == 1.0
    assert s.misjudged == []


def test_an_alarmist_auditor_has_full_recall_on_player_input_and_always_false_alarms(
        suite: list[AuditCase]) -> None:
    cases = suite[:90]  # 10 per category; 20 planted player-input conflicts
    s = score(cases, asyncio.run(evaluate(AlarmistAuditor(), cases, 8)), bootstrap_rounds=200)
    p = s.kinds["player_input"]
    assert (p.tp, p.fp, p.fn, p.tn) == (20, 70, 0, 0)
    assert p.precision.value == pytest.approx(2 / 9) and p.recall.value == 1.0
    assert s.fpr.k == s.fpr.n == 40 and s.trajectory.agreement.n == 0 and s.trajectory_skipped == 40
    assert s.kinds["fact"].tp == 0 and s.kinds["fact"].fp == 0


def test_a_failing_auditor_is_recorded_per_case_not_raised(suite: list[AuditCase]) -> None:
    class Broken:
        def audit(self, request: AuditRequest) -> Verdict:
            raise RuntimeError("endpoint down")

    results = asyncio.run(evaluate(Broken(), suite[:3], 2))
    assert [r.error for r in results] == ["RuntimeError: endpoint down"] * 3
    assert score(suite[:3], results).scored == 0


def test_llm_auditor_against_the_mock_server_end_to_end(specs: list[Spec], tmp_path: Path) -> None:
    # The mock plants a player-input conflict whenever the prompt says "Turn: 2", i.e. on cases whose
    # state has one committed turn; it completes the frontier node on every other case.
    from ncpbench.auditors import LLMAuditor

    with MockServer(MockConfig(conflict_turns=frozenset({2}), conflict_kind="player_input")) as server:
        role = RoleConfig(model="mock/default", base_url=server.base_url, temperature=0.0)

        async def go() -> Scores:
            client = ModelClient()
            try:
                return await run_audit_eval(LLMAuditor(client, role), tmp_path, specs=specs, n=27, seed=0,
                                            concurrency=4, meta={"auditor": "mock/default"}, bootstrap_rounds=100)
            finally:
                await client.aclose()

        s = asyncio.run(go())
    cases = load_cases(tmp_path / "cases.jsonl")
    results = {json.loads(line)["case_id"]: json.loads(line) for line in
               (tmp_path / "results.jsonl").read_text().splitlines()}
    assert len(cases) == len(results) == 27
    for case in cases:
        verdict = results[case.id]["verdict"]
        assert bool(verdict["conflicts"]) == (case.state.turn == 1), case.id
        if not verdict["conflicts"]:
            assert verdict["completed_nodes"] == [case.frontier_node]
    rescored = rescore(tmp_path, bootstrap_rounds=100)
    assert rescored.model_dump() == s.model_dump()
    page = (tmp_path / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<style>" in page and "<script" not in page
    md = (tmp_path / "report.md").read_text()
    assert "## Conflict detection per kind" in md and "planted by the mock server" in md


def test_cli_generates_runs_and_rescores(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    audit_eval.register(parser.add_subparsers(dest="command"))

    def run(*argv: str) -> int:
        args = parser.parse_args(["audit-eval", *argv])
        return int(args.func(args))

    assert run("--generate-only", "--cases", "18", "--envs", "alien,heat", "--out", str(tmp_path / "g")) == 0
    assert {c.env_id for c in load_cases(tmp_path / "g" / "cases.jsonl")} <= {"alien", "heat"}
    assert run("--auditor", "mock/default", "--cases", "9", "--bootstrap", "50", "--out", str(tmp_path / "r")) == 0
    assert run("--report-only", "--bootstrap", "50", "--out", str(tmp_path / "r")) == 0
    out = capsys.readouterr().out
    assert "false alarms on clean controls 0.0% (0/4)" in out and "reports rewritten" in out
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == [
        "cases.jsonl", "report.html", "report.md", "results.jsonl", "run.json", "scores.json"]
    from ncpbench.cli import main

    assert main(["audit-eval", "--cases", "9", "--out", str(tmp_path / "x")]) == 2  # no auditor named


def test_local_auditor_waits_long_instead_of_retrying_unless_told_otherwise() -> None:
    parser = argparse.ArgumentParser()
    audit_eval.register(parser.add_subparsers(dest="command"))
    local = audit_eval.auditor_role(parser.parse_args(["audit-eval", "--auditor", "local/smollm2-135m", "--out", "x"]))
    assert (local.timeout_s, local.max_retries) == (audit_eval.LOCAL_TIMEOUT_S, 1)
    told = audit_eval.auditor_role(parser.parse_args(["audit-eval", "--auditor", "local/smollm2-135m",
                                                      "--auditor-timeout", "60", "--out", "x"]))
    assert told.timeout_s == 60
    remote = audit_eval.auditor_role(parser.parse_args(["audit-eval", "--auditor", "openai/m", "--auditor-base-url",
                                                        "http://h/v1", "--out", "x"]))
    assert remote.base_url == "http://h/v1" and remote.timeout_s == RoleConfig().timeout_s


def test_core_never_imports_auditeval_and_its_scoring_never_touches_a_model() -> None:
    import ast

    root = Path(__file__).resolve().parent.parent

    def imports(path: Path) -> set[str]:
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
        return found

    core = ["spec", "validation", "ledger", "commitments", "trajectory", "state", "verdict", "dataset", "protocols"]
    assert not [m for name in core for m in imports(root / "ncpbench" / f"{name}.py")
                if m.startswith("ncpbench.auditeval")]
    banned = ("openai", "httpx", "ncpbench.models", "ncpbench.agents", "ncpbench.auditors", "ncpbench.cli")
    for name in ("cases", "scoring", "report", "evaluate", "__init__"):
        assert not [m for m in imports(root / "ncpbench" / "auditeval" / f"{name}.py") if m.startswith(banned)], name


def test_reports_escape_every_piece_of_text() -> None:
    evil = '<script>alert("x")</script> & <b>'
    items: list[Block] = [Heading(evil), Para(evil), Table([evil], [[evil]]),
                          CaseCard(evil, [("reply", evil), (evil, evil)])]
    page = render_html(items)
    assert "<script>" not in page and "<b>" not in page
    assert page.count("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &lt;b&gt;") == 8
    md = render_markdown([Table(["a|b"], [["x|y"]])])
    assert "a\\|b" in md and "x\\|y" in md


# -- long-range cases (opt-in: appended after the standard cases, so no index moves) ---------------

LONG = ("long_fact_ledger", "long_fact_narration", "hn_long_consistent")


@pytest.fixture(scope="module")
def long_cases(specs: list[Spec]) -> list[AuditCase]:
    return generate_suite(specs, 0, seed=0, long_range=36)


def _detail_key(case: AuditCase) -> str:
    """The phrase of the early detail that no later turn uses: the object, 'ribbon' or 'right hand'."""
    from ncpbench.auditeval.cases import PROPS

    found = [p for p in PROPS if p in case.detail] + [k for k in ("ribbon", "right hand") if k in case.detail]
    assert len(found) == 1, case.detail
    return found[0]


def _prompt(case: AuditCase, spec: Spec, protocol: AuditProtocol | None = None) -> str:
    content: str = prompts.messages("conflict_check", case.request(spec, protocol))[1]["content"]
    return content


def _active_facts(prompt: str) -> str:
    return prompt.split("Active facts now:", 1)[1].split("</story_facts>", 1)[0]


def test_long_range_cases_are_opt_in_deterministic_and_leave_existing_indices_alone(
        specs: list[Spec], suite: list[AuditCase], long_cases: list[AuditCase], tmp_path: Path) -> None:
    mixed = generate_suite(specs, 27, seed=0, long_range=36)
    assert mixed[:27] == suite[:27]  # the standard cases are untouched
    tail = mixed[27:]
    assert [c.index for c in tail] == list(range(27, 63))
    # A long-range case's content and id do not depend on how many standard cases come first.
    assert [c.model_copy(update={"index": 0}) for c in tail] == [c.model_copy(update={"index": 0}) for c in long_cases]
    assert [c.id for c in long_cases[:3]] == [f"L00{j}-{cat}-{long_cases[j].env_id}" for j, cat in enumerate(LONG)]
    dump_cases(generate_suite(specs, 0, seed=0, long_range=36), tmp_path / "a.jsonl")
    dump_cases(long_cases, tmp_path / "b.jsonl")
    dump_cases(generate_suite(specs, 0, seed=1, long_range=36), tmp_path / "c.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert (tmp_path / "a.jsonl").read_bytes() != (tmp_path / "c.jsonl").read_bytes()
    assert load_cases(tmp_path / "b.jsonl") == long_cases
    assert Counter(c.category for c in long_cases) == {cat: 12 for cat in LONG}
    assert LONG_RANGE_CATEGORIES == LONG
    # Every (detail kind, ledger/narration) pair appears among the hard negatives.
    assert len({c.variant for c in long_cases if c.category == "hn_long_consistent"}) == 6


def test_the_early_detail_is_at_least_ten_committed_turns_before_the_reply(
        specs: list[Spec], long_cases: list[AuditCase]) -> None:
    by_key = {s.key: s for s in specs}
    for case in long_cases:
        graph = TrajectoryGraph(by_key[case.env_id])
        state, t = case.state, case.detail_turn
        assert t in (1, 2) and state.turn - t >= 10 and case.detail_distance == state.turn + 1 - t >= 11, case.id
        assert len(state.transcript) == state.turn + 1 and state.transcript[t].narrator_reply == case.detail
        key = _detail_key(case)
        assert not [ex.turn for ex in state.transcript[t + 1:] if key in ex.narrator_reply or
                    any(key in f for f in ex.facts_added)], case.id  # the filler never speaks of it
        assert state.completed_nodes == tuple(graph.order[:len(state.completed_nodes)]) and state.completed_nodes
        assert case.frontier == tuple(graph.frontier(state.completed_nodes)) and case.planted in case.reply
        in_ledger = case.variant.endswith("+ledger")
        added = state.transcript[t].facts_added
        if in_ledger:  # the detail's turn committed it as a fact, still active
            (entry,) = added
            fid = entry.split(":", 1)[0]
            assert fid in {f.id for f in state.ledger.active()} and key in state.ledger.get(fid).content
        else:  # the detail's turn's fact update added nothing; no fact anywhere holds it
            assert added == () and not [f for f in state.ledger.facts if key in f.content], case.id
        if case.category == "long_fact_ledger":
            assert in_ledger and case.gold.kinds == [FACT] and case.gold.targets == {"fact": [fid]}
        elif case.category == "long_fact_narration":
            # A conflict with earlier narration: kind fact, no id to name (any id or none is accepted).
            assert not in_ledger and case.gold.kinds == [FACT] and case.gold.targets == {}
            assert case.gold.tolerated == [COMMITMENT]
        else:
            assert case.gold.is_clean and not case.gold.completes and not case.gold.satisfied


def test_compact_context_drops_the_early_narration_and_keeps_only_ledger_facts(
        specs: list[Spec], long_cases: list[AuditCase]) -> None:
    by_key = {s.key: s for s in specs}
    for case in long_cases:
        spec = by_key[case.env_id]
        full = _prompt(case, spec)
        assert case.detail in full and "Active facts now" not in full, case.id
        for n in (1, 6, 10):  # every detail is >= 11 turns back
            compact = _prompt(case, spec, PUBLISHED.with_context("compact", n))
            assert case.detail not in compact, (case.id, n)
            facts = _active_facts(compact)
            if case.variant.endswith("+ledger"):
                fid = case.state.transcript[case.detail_turn or 0].facts_added[0].split(":", 1)[0]
                assert f"{fid}: {case.state.ledger.get(fid).content}" in facts, case.id
            else:
                assert _detail_key(case) not in facts, case.id
        # Enough recent exchanges bring the detail back.
        assert case.detail in _prompt(case, spec, PUBLISHED.with_context("compact", 20))


class PromptBoundAuditor:
    """Knows the gold answer but may only claim a conflict it can see the evidence for: the early
    narration or the ledger fact that holds the detail must appear in the prompt, before the reply."""

    def __init__(self, cases: list[AuditCase]) -> None:
        self.cases = {(c.state.model_dump_json(), c.reply): c for c in cases}  # replies repeat across cases
        self.protocols: set[str] = set()

    def audit(self, request: AuditRequest) -> Verdict:
        case = self.cases[(request.state.model_dump_json(), request.reply)]
        self.protocols.add(request.protocol.label)
        prompt: str = prompts.messages("conflict_check", request)[1]["content"]
        seen = prompt.split("Narrator reply under audit:")[0]
        facts = case.gold.targets.get("fact", [])
        visible = case.detail in seen or any(request.state.ledger.get(f).content in seen for f in facts)
        if case.gold.is_clean or not visible:
            return Verdict()
        return Verdict(conflicts=[Conflict(kind=FACT, target=next(iter(facts), None), evidence=case.planted,
                                           reason="contradicts the early detail")])


def test_a_prompt_bound_auditor_loses_narration_only_recall_in_compact_context(
        specs: list[Spec], long_cases: list[AuditCase], tmp_path: Path) -> None:
    cases = long_cases[:18]  # 6 per category: 6 ledger conflicts, 6 narration-only conflicts, 6 negatives
    auditor = PromptBoundAuditor(cases)
    full = score(cases, asyncio.run(evaluate(auditor, cases, 4)), bootstrap_rounds=50)
    compact = score(cases, asyncio.run(evaluate(auditor, cases, 4, protocol=PUBLISHED.with_context("compact", 6))),
                    bootstrap_rounds=50)
    assert auditor.protocols == {"published/1", "published/1+compact6"}  # the protocol reached every request
    # Full context: every detail is in the log -> 12/12 fact conflicts found, no false alarm on the 6 negatives.
    f = full.kinds["fact"]
    assert (f.tp, f.fp, f.fn, f.tn) == (12, 0, 0, 6) and f.recall.value == 1.0
    assert full.by_category["long_fact_narration"]["correct"] == 6
    # Compact, last 6 exchanges (every detail is >= 11 turns back): the ledger variant still shows the fact
    # (6/6), the narration-only variant shows nothing (0/6) -> recall 6/12 = 0.5; Wilson 6/12 = (0.2538, 0.7462).
    c = compact.kinds["fact"]
    assert (c.tp, c.fp, c.fn, c.tn) == (6, 0, 6, 6) and c.recall.value == 0.5
    assert (c.recall.low, c.recall.high) == pytest.approx((0.2538, 0.7462), abs=1e-4)
    assert compact.by_category["long_fact_ledger"] == {"n": 6, "correct": 6, "none": 0, "fact": 6, "commitment": 0,
                                                       "player_input": 0}
    assert compact.by_category["long_fact_narration"]["fact"] == 0
    assert compact.by_category["long_fact_narration"]["none"] == 6
    assert compact.fpr_hard_negatives.k == 0 and compact.fpr_hard_negatives.n == 6

    # The same through run_audit_eval: run.json and the report say which context was used.
    s = asyncio.run(run_audit_eval(PromptBoundAuditor(long_cases), tmp_path, specs=specs, n=0, long_range=18,
                                   protocol=PUBLISHED.with_context("compact", 6), bootstrap_rounds=50))
    assert s.kinds["fact"].recall.value == 0.5
    info = json.loads((tmp_path / "run.json").read_text())
    assert (info["audit context"], info["protocol"], info["long-range cases"]) == (
        "compact, last 6 exchanges", "published/1+compact6", "18")
    md = (tmp_path / "report.md").read_text()
    assert "## Long-range cases" in md and "Audit context of this run: compact, last 6 exchanges" in md
    assert "| long_fact_narration | 6 | 11–" in md and "fact recall 0.0%" in md and "fact recall 100.0%" in md
    assert "| hn_long_consistent | 6 |" in md
    assert rescore(tmp_path, bootstrap_rounds=50).model_dump() == s.model_dump()
    assert "Audit context of this run: compact, last 6 exchanges" in (tmp_path / "report.md").read_text()


def test_cli_takes_long_range_and_audit_context(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    audit_eval.register(parser.add_subparsers(dest="command"))

    def run(*argv: str) -> int:
        args = parser.parse_args(["audit-eval", *argv])
        return int(args.func(args))

    assert run("--generate-only", "--cases", "0", "--long-range", "6", "--out", str(tmp_path / "g")) == 0
    assert [c.category for c in load_cases(tmp_path / "g" / "cases.jsonl")] == list(LONG) * 2
    assert run("--auditor", "mock/default", "--cases", "0", "--long-range", "3", "--audit-context", "compact",
               "--recent-turns", "4", "--bootstrap", "20", "--out", str(tmp_path / "r")) == 0
    info = json.loads((tmp_path / "r" / "run.json").read_text())
    assert (info["audit context"], info["protocol"]) == ("compact, last 4 exchanges", "published/1+compact4")
    out = capsys.readouterr().out
    assert "long_fact_narration" in out and "hn_long_consistent" in out
    assert "## Long-range cases" in (tmp_path / "r" / "report.md").read_text()


def _audit_eval_cli() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    audit_eval.register(parser.add_subparsers(dest="command"))
    return parser


def test_audit_eval_records_and_shows_every_auditor_setting_that_can_change_a_score(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ncpbench.models.config import RunConfig, resolve_run_config
    from ncpbench.runner import BatchRunner, BatchSettings, prompt_hashes

    sent: list[RoleConfig] = []
    chat = ModelClient.chat

    async def spy(self: ModelClient, role: RoleConfig, *args: object, **kwargs: object) -> object:
        sent.append(role)  # what the auditor was really sampled with, to hold the record against
        return await chat(self, role, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ModelClient, "chat", spy)
    parser, out = _audit_eval_cli(), tmp_path / "ae"
    secret = "ncpbench-canary-ae-0123456789abcdef"
    with MockServer() as server:
        url = f"{server.base_url}?api-key={secret}"  # direct transport drops the query; the probe could not
        args = parser.parse_args(["audit-eval", "--auditor", "mock/default", "--auditor-base-url", url,
                                  "--auditor-transport", "direct", "--skip-preflight", "--auditor-temperature",
                                  "1.3", "--cases", "9", "--envs", "alien,heat", "--bootstrap", "20", "--out", str(out)])
        assert args.func(args) == 0
    info = json.loads((out / "run.json").read_text())
    assert sent and {r.temperature for r in sent} == {1.3}
    assert info["auditor temperature"] == "1.3"
    # The rest comes from the profile `ncpbench run` gives the auditor under the published protocol.
    run_auditor = resolve_run_config({"auditor": {"model": "mock/default"}}, environ={}).auditor
    assert info["sampling profile"] == "paper (as `ncpbench run` under published)"
    assert (info["auditor top_p"], info["auditor max_tokens"]) == (str(run_auditor.top_p), str(run_auditor.max_tokens))
    assert {(r.top_p, r.max_tokens, r.seed) for r in sent} == {(0.95, 8092, None)}
    assert info["auditor seed"] == "not set (the endpoint's default)"
    assert (info["auditor timeout_s"], info["auditor max_retries"]) == ("120.0", "4")
    assert info["protocol"] == "published/1" and info["endpoint"] == f"{server.base_url}?api-key=[redacted]"
    # The dataset digest and prompt hashes are the ones a run's identity pins for the same envs and auditor.
    runner = BatchRunner(tmp_path / "run", RunConfig(player_mode="scripted"), BatchSettings(envs=["alien", "heat"]))
    assert info["dataset"] == runner.dataset_hash
    auditor_hashes = {k: v for k, v in prompt_hashes(RunConfig(player_mode="scripted")).items() if "auditor" in k}
    assert len(auditor_hashes) == 5 and {f"prompt hash {k}": v for k, v in auditor_hashes.items()}.items() <= info.items()
    for name in ("report.md", "report.html"):
        text = (out / name).read_text()
        assert secret not in text
    md, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    assert "| auditor temperature | 1.3 |" in md and "<td>auditor temperature</td><td>1.3</td>" in page
    assert "| sampling profile | paper (as `ncpbench run` under published) |" in md
    assert f"| dataset | {runner.dataset_hash} |" in md and "| protocol | published/1 |" in md
    assert "<td>prompt hash auditor:conflict_check</td>" in page and "<td>auditor top_p</td><td>0.95</td>" in page
    assert secret not in (out / "run.json").read_text()
    rerun = parser.parse_args(["audit-eval", "--report-only", "--bootstrap", "20", "--out", str(out)])
    assert rerun.func(rerun) == 0
    assert "| auditor temperature | 1.3 |" in (out / "report.md").read_text(), "a rewritten report keeps them"


def test_audit_eval_with_another_profile_than_the_runs_says_so(tmp_path: Path) -> None:
    parser = _audit_eval_cli()
    args = parser.parse_args(["audit-eval", "--auditor", "mock/default", "--profile", "default", "--cases", "9",
                              "--bootstrap", "20", "--out", str(tmp_path)])
    assert args.func(args) == 0
    info = json.loads((tmp_path / "run.json").read_text())
    assert info["sampling profile"] == ("default (differs from `ncpbench run`, which samples the auditor with "
                                        "paper under published)")
    assert (info["auditor temperature"], info["auditor seed"], info["auditor top_p"]) == (
        "0.0", "0", "not set (the endpoint's default)")
    assert "differs from `ncpbench run`" in (tmp_path / "report.md").read_text()
