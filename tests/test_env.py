"""NarrativeEnv: the turn protocol of DESIGN.md, pinned down step by step."""

from __future__ import annotations

import asyncio
import warnings

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from ncpbench.agents import ReplayPlayer, ScriptedPlayer
from ncpbench.auditors import ReplayAuditor

import ncpbench
from ncpbench import NarrativeEnv, Outcome
from ncpbench.commitments import CommitmentUpdate, Status
from ncpbench.env import MAX_REPLY_CHARS
from ncpbench.ledger import FactDiff
from ncpbench.registry import bundled_slugs, env_id
from ncpbench.spec import Spec
from ncpbench.verdict import Conflict, ConflictKind, Verdict

CLEAN = Verdict()


def conflict(kind: ConflictKind = ConflictKind.FACT, target: str = "f_1") -> Verdict:
    return Verdict(conflicts=[Conflict(kind=kind, target=target, evidence="the key melts", reason="f_1 says so")],
                   fact_diff=FactDiff(add=["This must not be committed."]))


def make(spec: Spec, verdicts: list[Verdict], **kw: object) -> NarrativeEnv:
    return NarrativeEnv(spec, player=ReplayPlayer(["I look around.", "I walk on.", "I wait."]),
                        auditor=ReplayAuditor(verdicts), **kw)  # type: ignore[arg-type]


def test_first_step_takes_the_opening_and_the_player_then_acts(tiny: Spec) -> None:
    env = make(tiny, [Verdict(fact_diff=FactDiff(add=["Fog lies on the water."]))])
    obs, info = env.reset(seed=0)
    assert obs["turn"] == 0 and obs["player_action"] == "" and info["phase"] == "opening"
    obs, reward, term, trunc, info = env.step("Fog lies on the water as the ferry slows.")
    assert obs["player_action"] == "I look around." and obs["turn"] == 1
    assert (reward, term, trunc) == (0.0, False, False)
    assert len(env.state.ledger.facts) == 4, "opening updates wait for turn 1"


def test_opening_updates_commit_together_with_turn_one(tiny: Spec) -> None:
    env = make(tiny, [Verdict(fact_diff=FactDiff(add=["Fog lies on the water."])), CLEAN])
    env.reset(seed=0)
    env.step("Fog.")
    env.step("You see the pier.")
    assert [f.content for f in env.state.ledger.changed_in(1)] == ["Fog lies on the water."]


def test_conflicting_turn_is_not_committed(tiny: Spec) -> None:
    env = make(tiny, [CLEAN, Verdict(completed_nodes=["s_0"]), conflict()])
    env.reset(seed=0)
    env.step("Opening.")
    env.step("The gangway drops; you are on the island.")
    before = env.state
    _obs, reward, term, trunc, info = env.step("The key melts in your pocket.")
    assert term and not trunc and info["outcome"] == "CONFLICT"
    assert env.state.ledger == before.ledger and env.state.transcript == before.transcript
    assert env.state.turn == 1 and reward == -5.0
    record = env.record()
    assert record.turns == 2 and record.conflict_kinds == ["fact"]
    assert record.history[-1].committed is False
    assert record.history[-1].verdict.conflicts[0].evidence == "the key melts"


def test_commitment_conflict_marks_the_commitment_violated(tiny: Spec) -> None:
    env = make(tiny, [CLEAN, conflict(ConflictKind.COMMITMENT, "c_0")])
    env.reset(seed=0)
    env.step("Opening.")
    env.step("You open the vault at once.")
    assert env.state.commitments.get("c_0").status is Status.VIOLATED


def test_success_when_every_achievement_is_satisfied_with_graph_credit(tiny: Spec) -> None:
    verdicts = [CLEAN, Verdict(completed_nodes=["s_0"]), Verdict(completed_nodes=["s_1"]),
                Verdict(completed_nodes=["s_2"]), Verdict(completed_nodes=["s_3"])]
    env = make(tiny, verdicts, protocol="grounded")
    env.reset(seed=0)
    env.step("Opening.")
    rewards = []
    for i in range(4):
        _, r, term, trunc, info = env.step(f"Reply {i}.")
        rewards.append(r)
    assert term and not trunc and info["outcome"] == "SUCCESS"
    assert info["progress"] == 1.0
    # s_0 + c_2; s_1; s_2 + c_0 (ordering) + c_1 (invariant window closed); s_3 + c_3
    assert rewards == [2.0, 1.0, 3.0, 2.0]
    assert env.record().satisfied_share == 1.0


def test_survival_is_truncation_at_the_turn_limit(tiny: Spec) -> None:
    env = make(tiny, [], max_turns=3)
    env.reset(seed=0)
    env.step("Opening.")
    results = [env.step("Nothing much happens.") for _ in range(3)]
    assert [r[3] for r in results] == [False, False, True]
    assert results[-1][4]["outcome"] == "SURVIVAL" and not results[-1][2]
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("more")


def test_a_node_whose_predecessor_is_missing_is_not_credited(tiny: Spec) -> None:
    env = make(tiny, [CLEAN, Verdict(completed_nodes=["s_2", "s_0"])])
    env.reset(seed=0)
    env.step("Opening.")
    _, _, _, _, info = env.step("You dock and open the vault.")
    assert info["completed_nodes"] == ["s_0"]
    assert env.history[-1].rejected_nodes == ["s_2"]


def test_auditor_statuses_apply_with_evidence(tiny: Spec) -> None:
    env = make(tiny, [CLEAN, Verdict(commitment_updates=[CommitmentUpdate(id="c_1", status=Status.SATISFIED,
                                                                           evidence=["f_1"])])])
    env.reset(seed=0)
    env.step("Opening.")
    env.step("The key is safe.")
    assert env.state.commitments.get("c_1").evidence == ("f_1",)


def test_an_empty_reply_is_never_scored(tiny: Spec) -> None:
    auditor = ReplayAuditor([])
    env = NarrativeEnv(tiny, player=ReplayPlayer(["I jump."]), auditor=auditor)
    env.reset(seed=0)
    env.step("Opening.")
    calls = auditor.calls
    with pytest.raises(ValueError, match="empty"):
        env.step("   \n ")
    assert env.state.outcome is Outcome.ONGOING and auditor.calls == calls


def test_hostile_text_is_cleaned_and_capped(tiny: Spec) -> None:
    env = make(tiny, [], max_reply_chars=100)
    env.reset(seed=0)
    env.step("Opening.")
    _, _, _, _, info = env.step("a\x00b\udc80" + "x" * 500)
    reply = env.state.transcript[-1].narrator_reply
    assert len(reply) == 100 and "\x00" not in reply
    assert any("truncated" in n for n in info["notes"]) and any("control" in n for n in info["notes"])
    env.record().model_dump_json()  # still valid JSON


def test_snapshot_and_restore_branch_an_episode(tiny: Spec) -> None:
    env = make(tiny, [CLEAN, Verdict(completed_nodes=["s_0"]), conflict()])
    env.reset(seed=5)
    env.step("Opening.")
    env.step("You dock.")
    snap = env.snapshot()
    env.step("The key melts.")
    assert env.state.outcome is Outcome.CONFLICT
    env.restore(snap)
    assert env.state.outcome is Outcome.ONGOING and env.state.turn == 1
    env.auditor = ReplayAuditor([])  # a different judge for the other branch
    _, _, term, _, _ = env.step("You walk up the hill.")
    assert not term and env.state.turn == 2


def test_step_and_astep_both_work_inside_a_running_event_loop(tiny: Spec) -> None:
    env = make(tiny, [])

    async def main() -> None:  # a notebook cell: a loop is already running
        env.reset(seed=0)
        await env.astep("Opening.")
        env.step("A reply.")
        await env.astep("Another reply.")

    asyncio.run(main())
    assert env.state.turn == 2


def test_scripted_player_is_deterministic_per_seed_and_turn(tiny: Spec) -> None:
    def actions(seed: int) -> list[str]:
        env = NarrativeEnv(tiny, player=ScriptedPlayer(), auditor=ReplayAuditor([]))
        env.reset(seed=seed)
        out = [env.step("Opening.")[0]["player_action"]]
        out += [env.step(f"Reply {i}.")[0]["player_action"] for i in range(3)]
        return out

    assert actions(1) == actions(1)
    assert actions(1) != actions(2)


def test_env_needs_an_auditor(tiny: Spec) -> None:
    with pytest.raises(ValueError, match="needs an auditor"):
        NarrativeEnv(tiny)


@pytest.mark.parametrize("slug", bundled_slugs())
def test_check_env_passes_without_warnings(slug: str) -> None:
    env = gym.make(env_id(slug), auditor=ReplayAuditor(advance=True), max_turns=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
    env.close()


@pytest.mark.parametrize("slug", bundled_slugs())
def test_short_scripted_episode_runs_on_every_environment(slug: str) -> None:
    env = ncpbench.make(slug, player=ScriptedPlayer(), auditor=ReplayAuditor(advance=True), max_turns=4)
    env.reset(seed=3)
    env.step("The story begins.")
    term = trunc = False
    while not (term or trunc):
        _, _, term, trunc, info = env.step("The story moves on, and the plot advances one step.")
    assert info["outcome"] == "SURVIVAL" and info["completed_nodes"] == [f"s_{i}" for i in range(4)]
    env.close()


def test_observations_stay_inside_their_space_for_the_longest_allowed_episode(tiny: Spec) -> None:
    # The defaults: 100 turns of replies and actions at the 16,000-character cap, each turn adding facts.
    long_action = "I act " + "a" * (MAX_REPLY_CHARS - 6)
    env = NarrativeEnv(tiny, player=ReplayPlayer([long_action]),
                       auditor=ReplayAuditor([Verdict(fact_diff=FactDiff(add=["x" * 290] * 8))] * 102))
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    trunc = False
    while not trunc:
        obs, _, _, trunc, _ = env.step("r" * MAX_REPLY_CHARS)
        assert env.observation_space.contains(obs), {k: len(v) if isinstance(v, str) else v for k, v in obs.items()}
    assert obs["turn"] == 100 and len(obs["transcript"]) > 3_000_000


def test_a_terminal_step_shows_the_final_turn_its_action_and_its_reply(tiny: Spec) -> None:
    env = make(tiny, [CLEAN, CLEAN, conflict()])
    env.reset(seed=0)
    env.step("Opening.")
    env.step("You see the pier.")
    obs, _, term, _, info = env.step("The key melts in your pocket.")
    assert term and obs["turn"] == info["turn"] == env.record().turns == 2
    assert obs["player_action"] == "I walk on." and obs["narrator_reply"] == "The key melts in your pocket."
    assert info["narrator_request"].terminal and info["narrator_request"].turn == 2
