"""One episode driver: the batch runner, AsyncBatchEnv and check_environment meet the same timeout and
the same failing model the same way, because they all go through `ncpbench.episode.guarded`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from ncpbench.agents import LLMNarrator, ScriptedPlayer
from ncpbench.auditors import ReplayAuditor

from ncpbench import NarrativeEnv, Outcome, run_batch
from ncpbench.episode import guarded, play_episode
from ncpbench.models.client import ModelClient
from ncpbench.models.config import RoleConfig, RunConfig
from ncpbench.models.mock_server import MockConfig, MockServer
from ncpbench.rl import AsyncBatchEnv
from ncpbench.runner import EpisodeTask
from ncpbench.testing import ConformanceError, check_environment

FAILING = MockConfig(fault_rate=1.0, fault_kinds=("500",))
SLOW = MockConfig(latency_ms=2000)


def narrator_role(server: MockServer) -> RoleConfig:
    return RoleConfig(model="mock/narrator", base_url=server.base_url, max_retries=0, timeout_s=30)


def via_runner(tmp: Path, mock: MockConfig, timeout: float) -> tuple[Outcome, str]:
    with MockServer(mock) as bad, MockServer() as ok:
        judge = RoleConfig(model="mock/judge", base_url=ok.base_url)
        config = RunConfig(narrator=narrator_role(bad), player=judge, auditor=judge, player_mode="scripted")

        def narrator(task: EpisodeTask) -> LLMNarrator:
            return LLMNarrator(ModelClient(), narrator_role(bad))

        asyncio.run(run_batch(tmp / "run", config, envs=["iron-man"], max_turns=3, narrator=narrator,
                              turn_timeout_s=timeout))
    (line,) = (tmp / "run" / "episodes.jsonl").read_text().splitlines()
    data = json.loads(line)
    return Outcome(data["outcome"]), data["error"]


def via_async_batch(mock: MockConfig, timeout: float) -> tuple[Outcome, str]:
    with MockServer(mock) as bad:
        async def go() -> tuple[Outcome, str]:
            client = ModelClient()
            env = NarrativeEnv("iron-man", player=ScriptedPlayer(), auditor=ReplayAuditor(advance=True), max_turns=3)
            batch = AsyncBatchEnv([env], turn_timeout_s=timeout)
            (record,) = await batch.run(LLMNarrator(client, narrator_role(bad)), seeds=0)
            await client.aclose()
            return record.outcome, record.error or ""

        return asyncio.run(go())


def via_check_environment(mock: MockConfig, timeout: float) -> str:
    with MockServer(mock) as bad:
        client = ModelClient()
        with pytest.raises(ConformanceError) as caught:
            check_environment("iron-man", narrator=LLMNarrator(client, narrator_role(bad)), turns=3,
                              turn_timeout_s=timeout)
    (problem,) = caught.value.problems
    return problem.removeprefix("episode: ")


def test_a_turn_over_its_deadline_is_the_same_error_on_every_path(tmp_path: Path) -> None:
    expected = "TurnTimeout: a turn took longer than 0.5 s"
    assert via_runner(tmp_path, SLOW, 0.5) == (Outcome.ERROR, expected)
    assert via_async_batch(SLOW, 0.5) == (Outcome.ERROR, expected)
    assert via_check_environment(SLOW, 0.5) == expected


def test_a_failing_model_is_the_same_error_on_every_path(tmp_path: Path) -> None:
    outcome, error = via_runner(tmp_path, FAILING, 30)
    assert outcome is Outcome.ERROR and error.startswith("ModelCallError")
    assert via_async_batch(FAILING, 30) == (Outcome.ERROR, error)
    assert via_check_environment(FAILING, 30) == error


def test_a_role_raising_its_own_timeout_error_is_not_reported_as_the_turn_deadline() -> None:
    class Impatient:
        def narrate(self, request: object) -> str:
            raise TimeoutError("the endpoint gave up")

    env = NarrativeEnv("iron-man", player=ScriptedPlayer(), auditor=ReplayAuditor(), max_turns=2)
    record = asyncio.run(play_episode(env, Impatient(), turn_timeout_s=30))
    assert record.outcome is Outcome.ERROR and record.error == "TimeoutError: the endpoint gave up"


def test_guarded_returns_the_result_or_none_after_ending_the_episode() -> None:
    env = NarrativeEnv("iron-man", player=ScriptedPlayer(), auditor=ReplayAuditor(), max_turns=2)
    env.reset(seed=0)

    async def fine() -> int:
        return 7

    async def broken() -> int:
        raise RuntimeError("a bug in a plugged-in role")

    assert asyncio.run(guarded(env, fine, 1)) == 7 and not env.state.done
    assert asyncio.run(guarded(env, broken, 1)) is None
    assert env.state.outcome is Outcome.ERROR and env.error == "RuntimeError: a bug in a plugged-in role"
