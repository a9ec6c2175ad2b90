"""`gymnasium.make(id, ...)` builds roles from nothing, objects or model strings; TimeLimit never cuts an episode early.

(The fresh-interpreter plugin check, without `import ncpbench`, is in tests/test_packaging.py.)
"""

from __future__ import annotations

import warnings

import gymnasium as gym
import pytest
from ncpbench.agents import LLMPlayer, ScriptedPlayer
from ncpbench.auditors import LLMAuditor, ReplayAuditor

import ncpbench
from ncpbench.integrations.gym_plugin import MAX_EPISODE_STEPS, StandInAuditorWarning
from ncpbench.models.config import RoleConfig
from ncpbench.models.mock_server import MockServer
from ncpbench.registry import ENTRY_POINT, bundled_slugs, env_id

IRON_MAN = env_id("iron-man")


def test_every_registered_id_uses_the_factory_and_a_limit_of_the_opening_plus_the_default_turns() -> None:
    assert MAX_EPISODE_STEPS == ncpbench.NarrativeEnv.__init__.__kwdefaults__["max_turns"] + 1
    for slug in bundled_slugs():
        spec = gym.spec(env_id(slug))
        assert spec.entry_point == ENTRY_POINT and spec.max_episode_steps == MAX_EPISODE_STEPS
        assert spec.namespace == "ncpbench"


def test_make_without_roles_uses_the_scripted_player_and_warns_that_the_stand_in_auditor_is_not_a_judge() -> None:
    with pytest.warns(StandInAuditorWarning, match="NOT a judge") as caught:
        env = gym.make(IRON_MAN)
    assert IRON_MAN in str(caught[0].message)
    inner = env.unwrapped
    assert isinstance(inner.player, ScriptedPlayer)  # type: ignore[attr-defined]
    assert isinstance(inner.auditor, ReplayAuditor) and inner.auditor.advance  # type: ignore[attr-defined]
    env.reset(seed=0)
    obs, *_ = env.step("An opening.")
    assert obs["turn"] == 1 and obs["player_action"]


def test_make_with_an_auditor_object_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env = gym.make(IRON_MAN, auditor=ReplayAuditor(advance=True), player="scripted")
    assert isinstance(env.unwrapped.player, ScriptedPlayer)  # type: ignore[attr-defined]


def test_model_strings_build_an_llm_auditor_and_an_adversarial_llm_player_that_play_over_http() -> None:
    with MockServer() as server:
        auditor = RoleConfig(model="mock/default", base_url=server.base_url)
        env = gym.make(IRON_MAN, auditor=auditor, player={"model": "mock/default", "base_url": server.base_url},
                       max_turns=3)
        inner = env.unwrapped
        assert isinstance(inner.auditor, LLMAuditor)  # type: ignore[attr-defined]
        assert isinstance(inner.player, LLMPlayer) and inner.player.mode == "adversarial"  # type: ignore[attr-defined]
        assert inner.player.client is inner.auditor.client  # type: ignore[attr-defined]  # one client per env
        env.reset(seed=0)
        env.step("Sand and heat; the convoy rolls through the desert.")
        *_, info = env.step("The humvee lurches as the blast hits.")
        assert info["verdict"] is not None and info["verdict"].usage  # judged by the pipeline over HTTP
        assert server.stats.roles.get("player", 0) >= 1
        scripted = gym.make(IRON_MAN, auditor="mock/default", player="scripted").unwrapped
        assert isinstance(scripted.auditor, LLMAuditor) and scripted.auditor.role.model == "mock/default"  # type: ignore[attr-defined]
        assert scripted.auditor.role.temperature == 0.6  # type: ignore[attr-defined]  # paper, as `ncpbench run`
        assert isinstance(scripted.player, ScriptedPlayer)  # type: ignore[attr-defined]


def test_time_limit_never_cuts_an_episode_the_env_would_finish_itself() -> None:
    env = gym.make(IRON_MAN, auditor=ReplayAuditor())  # clean verdicts, no progress: runs to the turn limit
    env.reset(seed=0)
    steps, terminated, truncated, info = 0, False, False, {}
    while not (terminated or truncated):
        _, _, terminated, truncated, info = env.step(f"Reply {steps}.")
        steps += 1
    assert steps == MAX_EPISODE_STEPS
    assert info["outcome"] == "SURVIVAL" and info["turn"] == 100  # the env ended it, at its own limit


def test_ncpbench_make_raises_the_step_limit_with_max_turns() -> None:
    env = ncpbench.make("iron-man", auditor=ReplayAuditor(), max_turns=150)
    assert env.spec is not None and env.spec.max_episode_steps == 151
    short = ncpbench.make("iron-man", auditor=ReplayAuditor(), max_turns=5)
    assert short.spec is not None and short.spec.max_episode_steps == 6


SAMPLING = ("temperature", "top_p", "max_tokens", "seed")


def _sampling(role: RoleConfig) -> tuple[object, ...]:
    return tuple(getattr(role, f) for f in SAMPLING)


@pytest.mark.parametrize(("protocol", "profile"), [(None, "paper"), ("published", "paper"), ("grounded", "default")])
def test_model_strings_are_sampled_as_ncpbench_run_samples_them_under_the_envs_protocol(
        protocol: str | None, profile: str) -> None:
    from ncpbench.models.config import resolve_run_config

    extra = {"protocol": protocol} if protocol else {}
    env = gym.make(IRON_MAN, auditor="mock/default", player={"model": "mock/default"}, **extra)
    run = resolve_run_config({"auditor": {"model": "mock/default"}, "player": {"model": "mock/default"}},
                             environ={}, extra=extra)
    assert run.profile == profile, "the case is what `ncpbench run` does"
    inner = env.unwrapped
    assert _sampling(inner.auditor.role) == _sampling(run.auditor)  # type: ignore[attr-defined]
    assert _sampling(inner.player.role) == _sampling(run.player)  # type: ignore[attr-defined]
    recorded = env.metadata["ncpbench"]  # through the wrappers gym.make adds
    assert (recorded["profile"], recorded["protocol"]) == (profile, inner.protocol.label)  # type: ignore[attr-defined]
    assert {f: recorded["auditor"][f] for f in SAMPLING} == {f: getattr(run.auditor, f) for f in SAMPLING}
    assert recorded["player"]["model"] == "mock/default" and recorded["player_mode"] == "adversarial"
    assert "ncpbench" not in ncpbench.NarrativeEnv.metadata, "the class's metadata is shared: never written"


def test_a_named_profile_wins_and_a_role_config_is_taken_as_it_is() -> None:
    env = gym.make(IRON_MAN, auditor="mock/default", player=RoleConfig(model="mock/default", temperature=1.1),
                   profile="default")
    inner = env.unwrapped
    assert _sampling(inner.auditor.role) == (0.0, None, 800, 0)  # type: ignore[attr-defined]
    assert _sampling(inner.player.role) == (1.1, None, None, None)  # type: ignore[attr-defined]
    assert env.metadata["ncpbench"]["profile"] == "default"
    assert env.metadata["ncpbench"]["player"]["temperature"] == 1.1
    with pytest.warns(StandInAuditorWarning):
        stand_in = gym.make(IRON_MAN)
    assert stand_in.metadata["ncpbench"]["auditor"] == {"object": "ReplayAuditor"}
    with pytest.raises(ValueError, match="unknown profile 'papr' \\(did you mean paper\\?\\)"):
        gym.make(IRON_MAN, auditor="mock/default", profile="papr")
