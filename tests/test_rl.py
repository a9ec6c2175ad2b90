"""RL use: vector envs, text batching, reward schemes, branching, async batches, and the examples."""

from __future__ import annotations

import asyncio
import copy
import json
import pickle
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector.utils import (
    batch_space,
    concatenate,
    create_empty_array,
    create_shared_memory,
    read_from_shared_memory,
    write_to_shared_memory,
)
from ncpbench.agents import ReplayNarrator, ReplayPlayer, ScriptedPlayer
from ncpbench.auditors import ReplayAuditor

import ncpbench
from ncpbench import NarrativeEnv, Outcome, RewardConfig, UnicodeText, rl
from ncpbench.models.client import ModelClient
from ncpbench.models.config import ROLES, resolve_run_config
from ncpbench.models.mock_server import MockServer
from ncpbench.protocols import AuditRequest
from ncpbench.rewards import SCHEMES, reward_config
from ncpbench.roles import build_roles
from ncpbench.spec import Spec
from ncpbench.verdict import Conflict, ConflictKind, Verdict

ROOT = Path(__file__).resolve().parent.parent
IRON_MAN = ncpbench.env_id("iron-man")  # ncpbench/IronMan-vN, N = meta.version
ALL_NODES = [Verdict(), Verdict(completed_nodes=["s_0"]), Verdict(completed_nodes=["s_1"]),
             Verdict(completed_nodes=["s_2"]), Verdict(completed_nodes=["s_3"])]


class KeywordAuditor:
    """Confirms a fact conflict whenever the reply contains `word`; otherwise advances the plot."""

    def __init__(self, word: str = "melts") -> None:
        self.word = word

    def audit(self, request: AuditRequest) -> Verdict:
        if request.player_action is not None and self.word in request.reply:
            return Verdict(conflicts=[Conflict(kind=ConflictKind.FACT, target="f_1", evidence=request.reply,
                                               reason="contradicts f_1")])
        if request.player_action is not None and request.frontier:
            return Verdict(completed_nodes=[request.frontier[0]])
        return Verdict()


class SlowAuditor:
    """An async auditor that takes `delay` seconds per call (a model endpoint's latency)."""

    def __init__(self, delay: float = 0.2) -> None:
        self.delay = delay
        self.in_flight = 0
        self.max_in_flight = 0

    async def audit(self, request: AuditRequest) -> Verdict:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(self.delay)
        self.in_flight -= 1
        return Verdict()


class FailingAuditor:
    async def audit(self, request: AuditRequest) -> Verdict:
        if request.player_action is not None:
            raise TimeoutError("the auditor endpoint timed out")
        return Verdict()


# -- vector envs -----------------------------------------------------------------------------------


def vector_rollout(mode: str, **vector_kwargs: object) -> list[tuple[object, ...]]:
    envs = gym.make_vec(IRON_MAN, num_envs=2, vectorization_mode=mode, vector_kwargs=vector_kwargs,
                        player=ScriptedPlayer(), auditor=ReplayAuditor(advance=True), max_turns=2)
    try:
        obs, info = envs.reset(seed=[3, 4])
        steps: list[tuple[object, ...]] = [(obs, info)]
        for replies in (("Opening one.", "Opening two."), ("A reply.", "Another reply."), ("More.", "Still more.")):
            steps.append(envs.step(replies))
        return steps
    finally:
        envs.close()


def test_make_vec_sync_batches_text_observations_as_tuples_of_str() -> None:
    steps = vector_rollout("sync")
    obs, info = steps[0]  # type: ignore[misc]
    assert set(obs) == {"turn", "player_action", "narrator_reply", "story_state", "transcript"}
    assert isinstance(obs["story_state"], tuple) and all(isinstance(s, str) for s in obs["story_state"])
    assert obs["story_state"][0].startswith("Story: Iron Man.")
    assert obs["turn"].tolist() == [0, 0]
    assert info["phase"].tolist() == ["opening", "opening"] and info["_phase"].tolist() == [True, True]
    obs, reward, _, _, info = steps[1]  # type: ignore[misc]
    assert all(a.startswith("I ") for a in obs["player_action"]) and obs["player_action"][0] != obs["player_action"][1]
    assert reward.dtype == np.float64 and reward.tolist() == [0.0, 0.0]
    assert isinstance(info["verdict"][0], Verdict)
    assert info["reward_breakdown"]["node"].tolist() == [0.0, 0.0]


def test_make_vec_sync_ends_episodes_and_autoresets_on_the_next_step() -> None:
    steps = vector_rollout("sync")
    _, reward, term, trunc, info = steps[3]  # type: ignore[misc]
    assert trunc.tolist() == [True, True] and term.tolist() == [False, False]
    assert info["outcome"].tolist() == ["SURVIVAL", "SURVIVAL"] and reward.tolist() == [1.0, 1.0]


@pytest.mark.parametrize("shared_memory", [True, False])
def test_make_vec_async_gives_the_same_batches_as_sync(shared_memory: bool) -> None:
    sync = vector_rollout("sync")
    asynchronous = vector_rollout("async", shared_memory=shared_memory)
    for s, a in zip(sync, asynchronous, strict=True):
        for key in ("player_action", "story_state", "transcript"):
            assert tuple(a[0][key]) == tuple(s[0][key])  # type: ignore[index]
            assert isinstance(a[0][key], tuple)  # type: ignore[index]
        assert a[0]["turn"].tolist() == s[0]["turn"].tolist()  # type: ignore[index]
    assert asynchronous[-1][4]["outcome"].tolist() == ["SURVIVAL", "SURVIVAL"]  # type: ignore[misc]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_make_vec_runs_llm_roles_that_share_one_model_client(mode: str) -> None:
    with MockServer() as server:
        config = resolve_run_config({r: {"model": "mock/default", "base_url": server.base_url} for r in ROLES})
        _, player, auditor = build_roles(config, ModelClient())  # fresh: async workers fork it unused
        envs = gym.make_vec(IRON_MAN, num_envs=2, vectorization_mode=mode, player=player, auditor=auditor,
                            max_turns=1)
        try:
            envs.reset(seed=0)
            obs, _, _, _, _ = envs.step(["Opening.", "Opening."])
            assert all(isinstance(a, str) and a for a in obs["player_action"])
            _, reward, _, trunc, info = envs.step(["A reply.", "Another reply."])
        finally:
            envs.close()
    assert trunc.tolist() == [True, True] and reward.tolist() == [1.0, 1.0]
    assert info["outcome"].tolist() == ["SURVIVAL", "SURVIVAL"]


def test_unicode_text_batches_and_round_trips_through_shared_memory() -> None:
    space = UnicodeText(max_length=20)
    batched = batch_space(space, 3)
    assert isinstance(batched, gym.spaces.Tuple) and len(batched) == 3
    assert batched.contains(("a", "“é”", ""))
    assert create_empty_array(space, n=2) == ("", "")
    assert concatenate(space, ["x", "y"], ("", "")) == ("x", "y")
    memory = create_shared_memory(space, n=3)
    view = read_from_shared_memory(space, memory, n=3)
    write_to_shared_memory(space, 1, "Tony — “Jarvis”, ñ", memory)
    write_to_shared_memory(space, 2, "x" * 20, memory)
    assert copy.deepcopy(view) == ("", "Tony — “Jarvis”, ñ", "x" * 20)
    write_to_shared_memory(space, 1, "short", memory)
    assert view[1] == "short", "the view follows the shared memory"
    with pytest.raises(ValueError, match="shared_memory=False"):
        write_to_shared_memory(space, 0, "ü" * 81, memory)


# -- reward schemes --------------------------------------------------------------------------------


def play(env: NarrativeEnv, replies: list[str]) -> list[tuple[float, dict[str, float]]]:
    env.reset(seed=0)
    out = []
    for reply in replies:
        _, reward, term, trunc, info = env.step(reply)
        out.append((reward, info["reward_breakdown"]))
        if term or trunc:
            break
    return out


def test_reward_schemes_are_selected_by_name(tiny: Spec) -> None:
    assert reward_config("progress") == RewardConfig() == reward_config(None)
    assert set(SCHEMES) == {"sparse", "progress", "conflict_penalised"}
    custom = RewardConfig(node=2.0)
    assert reward_config(custom) is custom
    with pytest.raises(ValueError, match="known: progress, sparse, conflict_penalised"):
        NarrativeEnv(tiny, auditor=ReplayAuditor(), reward="dense")


def test_sparse_pays_only_on_the_outcome(tiny: Spec) -> None:
    success = play(NarrativeEnv(tiny, player=ReplayPlayer(["I act."]), auditor=ReplayAuditor(ALL_NODES),
                                reward="sparse", protocol="grounded"), ["Opening."] + [f"Reply {i}." for i in range(4)])
    assert [r for r, _ in success] == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert success[-1][1]["success"] == 1.0 and success[-1][1]["node"] == 0.0
    survival = play(NarrativeEnv(tiny, player=ReplayPlayer(["I act."]), auditor=ReplayAuditor(), max_turns=2,
                                 reward="sparse"), ["Opening.", "A.", "B."])
    assert [r for r, _ in survival] == [0.0, 0.0, 0.5] and survival[-1][1]["survival"] == 0.5
    conflict = play(NarrativeEnv(tiny, player=ReplayPlayer(["I act."]), auditor=KeywordAuditor(), reward="sparse"),
                    ["Opening.", "The key melts."])
    assert [r for r, _ in conflict] == [0.0, -1.0]


def test_progress_and_conflict_penalised_shape_by_nodes_and_commitments(tiny: Spec) -> None:
    replies = ["Opening.", "The gangway drops.", "The key melts."]
    progress = play(NarrativeEnv(tiny, player=ReplayPlayer(["I act."]), auditor=KeywordAuditor(), protocol="grounded"),
                    replies)
    # turn 1: s_0 completes and with it (grounded: credited from the plot graph) achievement c_2
    assert [r for r, _ in progress] == [0.0, 2.0, -5.0]
    penalised = play(NarrativeEnv(tiny, player=ReplayPlayer(["I act."]), auditor=KeywordAuditor(),
                                  reward="conflict_penalised", protocol="grounded"), replies)
    assert [r for r, _ in penalised] == [0.0, 2.1, -40.0]
    assert penalised[1][1] == {"node": 1.0, "commitment": 1.0, "conflict": 0.0, "success": 0.0, "survival": 0.0,
                               "survive": 0.1}


def test_reward_scheme_passes_through_gymnasium_make() -> None:
    env = gym.make(IRON_MAN, auditor=ReplayAuditor(advance=True), reward="sparse", max_turns=1)
    env.reset(seed=0)
    env.step("Opening.")
    _, reward, _, trunc, _ = env.step("Reply.")
    assert trunc and reward == 0.5
    env.close()


# -- branching -------------------------------------------------------------------------------------


def test_counterfactual_replies_from_one_snapshot_are_independent(tiny: Spec) -> None:
    env = NarrativeEnv(tiny, player=ScriptedPlayer(), auditor=KeywordAuditor(), max_turns=5, reward="progress")
    env.reset(seed=11)
    env.step("Fog over the water.")
    env.step("The gangway drops onto the pier.")
    before = env.snapshot()
    bad, good = env.branch(), env.branch()
    _, r_bad, term_bad, _, _ = bad.step("The key melts in your pocket.")
    _, r_good, term_good, _, _ = good.step("You find the cellar door and the key turns.")
    assert term_bad and bad.state.outcome is Outcome.CONFLICT and r_bad == -5.0
    assert not term_good and good.state.completed_nodes == ("s_0", "s_1") and r_good == 1.0
    assert env.snapshot() == before, "branching never moves the original"
    assert len(env.history) == 2 and len(bad.history) == len(good.history) == 3
    assert bad.history[-1].committed is False and good.history[-1].committed is True
    assert (good.max_turns, good.reward_config, good.player, good.auditor) == (5, env.reward_config, env.player,
                                                                                env.auditor)
    _, _, term, _, _ = env.step("The key melts after all.")  # the original still steps on its own
    assert term and good.state.outcome is Outcome.ONGOING


def test_branch_of_a_gymnasium_made_env_and_its_event_loop(tiny: Spec) -> None:
    wrapped = gym.make(IRON_MAN, auditor=KeywordAuditor(), player=ScriptedPlayer(), max_turns=4)
    wrapped.reset(seed=2)
    wrapped.step("Opening.")
    child = rl.branch(wrapped, auditor=ReplayAuditor())
    assert child.auditor is not wrapped.unwrapped.auditor  # type: ignore[attr-defined]
    child.step("A reply.")
    child.close()  # closing a branch never stops the parent
    wrapped.step("The parent goes on.")
    clone = pickle.loads(pickle.dumps(wrapped.unwrapped))
    assert clone.snapshot() == wrapped.unwrapped.snapshot()  # type: ignore[attr-defined]
    clone.step("And the pickled copy too.")
    wrapped.close()


def test_try_replies_audits_each_candidate_on_its_own_branch(tiny: Spec) -> None:
    env = NarrativeEnv(tiny, player=ScriptedPlayer(), auditor=KeywordAuditor())
    env.reset(seed=0)
    env.step("Opening.")
    results = asyncio.run(rl.try_replies(env, ["The key melts.", "The gangway drops.", "The gangway drops, again."]))
    assert [r.committed for r in results] == [False, True, True]
    assert rl.best_index(results) == 1
    search = rl.search_record(env, results, 1, episode_id="tiny#0")
    assert search.turn == 1 and search.request.player_action == env.pending_action
    assert search.candidates[0].verdict is not None and search.candidates[0].verdict.is_conflict
    assert search.candidates[0].outcome == "CONFLICT" and search.candidates[1].reward == 1.0  # s_0; no graph credit
    assert env.state.turn == 0, "the searched env does not move"
    assert json.loads(search.model_dump_json())["chosen"] == 1


# -- async batches ---------------------------------------------------------------------------------


def test_async_batch_overlaps_the_model_calls_of_all_episodes(tiny: Spec) -> None:
    auditor = SlowAuditor(0.2)
    batch = rl.AsyncBatchEnv([NarrativeEnv(tiny, player=ScriptedPlayer(), auditor=auditor) for _ in range(6)])

    async def main() -> float:
        await batch.reset(seeds=0)
        started = time.perf_counter()
        await batch.step(["Opening."] * 6)
        return time.perf_counter() - started

    elapsed = asyncio.run(main())
    assert auditor.max_in_flight == 6 and elapsed < 0.6
    assert [e.episode_seed for e in batch.envs] == [0, 1, 2, 3, 4, 5]


def test_async_batch_sits_finished_episodes_out_and_records_them(tiny: Spec) -> None:
    envs = [NarrativeEnv(tiny, player=ScriptedPlayer(), auditor=KeywordAuditor(), max_turns=turns)
            for turns in (1, 3)]
    batch = rl.AsyncBatchEnv(envs)

    async def main() -> list[tuple[list[float], list[bool], list[bool]]]:
        await batch.reset(seeds=[7, 8])
        out = []
        replies: list[str | None] = ["Opening.", "Opening."]
        while not batch.done:
            _, rewards, term, trunc, infos = await batch.step(replies)
            out.append((rewards.tolist(), [i["active"] for i in infos], (term | trunc).tolist()))
            replies = ["A reply." if a else None for a in batch.active]
        return out

    steps = asyncio.run(main())
    assert [s[2] for s in steps] == [[False, False], [True, False], [False, False], [False, True]]
    assert [s[1] for s in steps] == [[True, True], [True, True], [False, True], [False, True]]
    assert [r.outcome for r in batch.records] == [Outcome.SURVIVAL, Outcome.SURVIVAL]
    assert [r.turns for r in batch.records] == [1, 3]

    async def forgetful() -> None:
        await batch.reset()
        await batch.step([None, "Opening."])

    with pytest.raises(ValueError, match="needs a reply"):
        asyncio.run(forgetful())


def test_async_batch_autoreset_starts_the_next_episode_in_the_same_step(tiny: Spec) -> None:
    batch = rl.AsyncBatchEnv([NarrativeEnv(tiny, player=ScriptedPlayer(), auditor=KeywordAuditor(), max_turns=1)],
                             autoreset=True)

    async def main() -> dict[str, object]:
        await batch.reset(seeds=0)
        await batch.step(["Opening."])
        obs, _, _, trunc, infos = await batch.step(["A reply."])
        assert trunc.tolist() == [True] and obs[0]["turn"] == 0
        return infos[0]

    info = asyncio.run(main())
    assert info["phase"] == "opening" and info["final_info"]["outcome"] == "SURVIVAL"  # type: ignore[index]
    assert info["record"] is batch.records[0] and not batch.done


def test_async_batch_turns_a_failing_role_into_an_error_for_that_episode_only(tiny: Spec) -> None:
    batch = rl.AsyncBatchEnv([NarrativeEnv(tiny, player=ScriptedPlayer(), auditor=FailingAuditor()),
                              NarrativeEnv(tiny, player=ScriptedPlayer(), auditor=KeywordAuditor())])
    narrator = ReplayNarrator(["Opening.", "The gangway drops."])

    async def main() -> list[dict[str, object]]:
        await batch.reset(seeds=0)
        await batch.step(await batch.narrate(narrator))
        _, _, _, trunc, infos = await batch.step(await batch.narrate(narrator))
        assert trunc.tolist() == [True, False]
        return infos

    infos = asyncio.run(main())
    assert infos[0]["outcome"] == "ERROR" and "timed out" in str(infos[0]["error"])
    assert batch.active == [False, True] and batch.records[0].outcome is Outcome.ERROR


def test_async_batch_run_plays_every_episode_to_its_end(tiny: Spec) -> None:
    batch = rl.AsyncBatchEnv.make(["iron-man", "iron-man", "iron-man"], player=ScriptedPlayer(),
                                  auditor=ReplayAuditor(advance=True), max_turns=3, reward="sparse")
    records = asyncio.run(batch.run(ReplayNarrator(["Opening.", "And then."]), seeds=5))
    assert [r.outcome for r in records] == [Outcome.SURVIVAL] * 3 and [r.seed for r in records] == [5, 6, 7]
    assert all(sum(t.reward for t in r.history) == 0.5 for r in records)


# -- the examples ----------------------------------------------------------------------------------


def run_example(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "examples" / name), *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def test_best_of_n_example_writes_branches_that_export_as_preference_pairs(tmp_path: Path) -> None:
    out = run_example("best_of_n.py", "--k", "3", "--turns", "3", "--episodes", "1", "--mock-conflict", "0.4",
                      "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "candidates passed" in out.stdout
    lines = (tmp_path / "run" / "branches.jsonl").read_text().splitlines()
    searches = [rl.BranchSearch.model_validate_json(line) for line in lines]
    assert len(searches) >= 2 and all(len(s.candidates) == 3 for s in searches)
    assert any(not c.committed for s in searches for c in s.candidates)
    from ncpbench.export import export

    assert export(tmp_path / "run", "preference", tmp_path / "prefs.jsonl") > 0
    assert export(tmp_path / "run", "sft", tmp_path / "sft.jsonl") > 0


def test_bandit_example_learns_from_episodes_and_writes_its_curve(tmp_path: Path) -> None:
    out = run_example("bandit.py", "--episodes", "6", "--turns", "2", "--batch", "3", "--out", str(tmp_path / "b"),
                      cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = (tmp_path / "b" / "curve.csv").read_text().splitlines()
    assert rows[0].startswith("episode,arm,return,outcome,mean_return") and len(rows) == 7
    summary = json.loads((tmp_path / "b" / "bandit.json").read_text())
    assert sum(a["pulls"] for a in summary["arms"].values()) == 6
    assert len((tmp_path / "b" / "episodes.jsonl").read_text().splitlines()) == 6
    assert "best arm so far" in out.stdout
