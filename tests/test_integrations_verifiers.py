"""The verifiers environment: rollouts are ncpbench episodes, the reward is ncpbench's reward scheme.

Offline: the narrating "policy" is our mock server behind verifiers' own OpenAI chat client (real
HTTP), and the auditor is the LLM audit pipeline against the same mock server.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

vf = pytest.importorskip("verifiers", reason="needs the ncpbench[verifiers] extra (pip install -e '.[verifiers]')")

import openai  # noqa: E402

from ncpbench.integrations.verifiers_env import NCPBenchEnv, load_environment  # noqa: E402
from ncpbench.models.config import RoleConfig  # noqa: E402
from ncpbench.models.mock_server import MockConfig, MockServer  # noqa: E402
from ncpbench.rewards import reward_config  # noqa: E402


def evaluate(env: NCPBenchEnv, server: MockServer) -> Any:
    from verifiers.clients import OpenAIChatCompletionsClient

    async def go() -> Any:
        client = OpenAIChatCompletionsClient(openai.AsyncOpenAI(base_url=server.base_url, api_key="not-needed"))
        return await env.evaluate(client=client, model="default", num_examples=-1, rollouts_per_example=1,
                                  state_columns=["ncp"], on_progress=[])

    return asyncio.run(go())


def outputs_of(results: Any) -> list[dict[str, Any]]:
    outs = results["outputs"] if isinstance(results, dict) else results.outputs
    return [o if isinstance(o, dict) else dict(o) for o in outs]


def test_the_dataset_has_one_row_per_environment_and_seed_with_the_opening_request_as_prompt() -> None:
    env = load_environment(envs="iron-man,alien", seeds=[3, 4], auditor="mock/default")
    rows = env.get_eval_dataset()
    assert [(r["info"]["env"], r["info"]["seed"]) for r in rows] == [
        ("iron-man", 3), ("iron-man", 4), ("alien", 3), ("alien", 4)]
    assert "Write the opening scene" in rows[0]["prompt"][-1]["content"]


def test_an_auditor_is_required() -> None:
    with pytest.raises(ValueError, match="needs an auditor"):
        load_environment(envs="iron-man")


def test_two_episodes_roll_out_end_to_end_and_are_rewarded_by_the_reward_scheme() -> None:
    with MockServer(MockConfig(conflict_turns=frozenset({2}))) as server:
        auditor = RoleConfig(model="mock/default", base_url=server.base_url, temperature=0.0)
        env = load_environment(envs="iron-man,alien", max_turns=4, auditor=auditor)
        results = evaluate(env, server)
    outs = outputs_of(results)
    assert len(outs) == 2
    cfg = reward_config("progress")
    for out in outs:
        ncp = out["ncp"]
        assert ncp["outcome"] == "CONFLICT" and ncp["turns"] == 2, ncp  # the planted conflict at turn 2
        # the reward is the episode's return: one node at turn 1, then the conflict's penalty
        assert out["reward"] == pytest.approx(ncp["return"])
        assert ncp["return"] == pytest.approx(cfg.node + cfg.conflict)
        completion = [m if isinstance(m, dict) else m.model_dump() for m in out["completion"]]
        assert completion[-1]["content"].startswith("The episode is over: CONFLICT"), completion[-1]
        assert sum(1 for m in completion if m["role"] == "assistant") == 3  # the opening, turns 1 and 2
        assert out["metrics"]["ncp_turns"] == 2 and out["metrics"]["ncp_conflict"] == 1, out["metrics"]
    assert env._episodes == {}  # nothing is left behind
