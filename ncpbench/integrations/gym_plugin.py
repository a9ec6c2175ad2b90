"""The Gymnasium face of ncpbench: what `gymnasium.make("ncpbench/IronMan-v1", ...)` builds.

Every registered id points at `make_env`, which turns role arguments into roles and builds the
`NarrativeEnv`:

- `player`: a Player object; None or `"scripted"` -> the seeded `ScriptedPlayer`; a model string
  (`openai/gpt-4o-mini`, `mock/default`, ...) or a `RoleConfig` -> an adversarial `LLMPlayer`.
- `auditor`: an Auditor object; a model string or a `RoleConfig` -> the `LLMAuditor` pipeline;
  None -> `ReplayAuditor(advance=True)`, a plot-following stand-in that completes one plot node per
  turn and never finds a conflict. It is *not a judge*: `make_env` says so with a UserWarning.
  Scores of such episodes measure nothing; pass an auditor for real ones.

Model strings and mappings get the sampling settings of the profile `ncpbench run` uses for the
env's protocol (`paper` under the default `published`, `default` under the others), unless
`profile=` names one; a RoleConfig is taken as it is. `env.metadata["ncpbench"]` (also reachable
through Gymnasium's wrappers) records the protocol, the profile and each role's settings. API keys
are the model layer's business (`OPENAI_API_KEY`, or `api_key_env` of a RoleConfig).

`MAX_EPISODE_STEPS`: one gym step is one narrator reply and the opening is a step, so an episode
of `max_turns` turns takes at most `max_turns + 1` steps. The registered `max_episode_steps` is
`DEFAULT_MAX_TURNS + 1`: Gymnasium's TimeLimit can only fire on the step where the env truncates
by itself (SURVIVAL at turn 100), never earlier. With a larger `max_turns`, pass
`max_episode_steps=max_turns + 1` as well (`ncpbench.make` does this for you).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ncpbench.env import NarrativeEnv
from ncpbench.protocols import Auditor, Player

if TYPE_CHECKING:
    from ncpbench.models.client import ModelClient
    from ncpbench.models.config import RoleConfig
    from ncpbench.protocol import AuditProtocol

DEFAULT_MAX_TURNS = 100
"""NarrativeEnv's own default `max_turns`."""
MAX_EPISODE_STEPS = DEFAULT_MAX_TURNS + 1
"""The opening plus one step per turn: the longest episode the env runs with its default limit."""

STAND_IN_WARNING = (
    "{env}: no auditor given, so the episode is judged by ReplayAuditor(advance=True), a plot-following "
    "stand-in that is NOT a judge (it completes one plot node per turn and never finds a conflict). "
    "Rewards and outcomes of this env measure nothing; pass auditor='openai/MODEL' (or an Auditor) for real ones.")

RoleArg = Any
"""A role object, None, `"scripted"` (player only), a model string, a RoleConfig or a mapping of its fields."""


class StandInAuditorWarning(UserWarning):
    """The env was made without an auditor and uses the plot-following stand-in."""


def sampling_profile(protocol: AuditProtocol | str | None = None, profile: str | None = None) -> str:
    """`profile` when given (checked), else the one `ncpbench run` resolves for `protocol`."""
    from ncpbench.models.config import PROFILES, PROTOCOLS, did_you_mean, resolve_run_config
    from ncpbench.protocol import get_protocol

    if profile is not None:
        if profile not in PROFILES:
            raise ValueError(f"unknown profile {profile!r}{did_you_mean(profile, tuple(PROFILES))}; "
                             f"use one of {', '.join(sorted(PROFILES))}")
        return profile
    name = get_protocol(protocol).name
    if name not in PROTOCOLS:
        # A protocol of your own, which `ncpbench run` cannot play: its rule for every protocol but
        # published is the `default` profile.
        return "default"
    return resolve_run_config(environ={}, extra={"protocol": name}).profile


def role_config(role: str, value: str | RoleConfig | Mapping[str, Any], profile: str | None = None) -> RoleConfig:
    """A RoleConfig from a model string or a mapping over `profile`'s sampling settings for the role
    (None: the published protocol's, as `ncpbench run`); a RoleConfig is returned as it is."""
    from ncpbench.models.config import PROFILES, RoleConfig

    if isinstance(value, RoleConfig):
        return value
    fields: dict[str, Any] = dict(PROFILES[sampling_profile(None, profile)].get(role, {}))
    fields.update({"model": value} if isinstance(value, str) else dict(value))
    return RoleConfig(**fields)


def _is_config(value: object) -> bool:
    from ncpbench.models.config import RoleConfig

    return isinstance(value, (str, RoleConfig, Mapping))


def build_player(value: RoleArg, client: ModelClient | None = None, mode: str = "adversarial", *,
                 profile: str | None = None,
                 protocol: AuditProtocol | str | None = None) -> tuple[Player, ModelClient | None]:
    """The player for `value` (see the module docstring) and the client it needed, if any."""
    if value is None or value == "scripted":
        from ncpbench.agents.scripted import ScriptedPlayer

        return ScriptedPlayer(), client
    if _is_config(value):
        from ncpbench.agents.llm import LLMPlayer
        from ncpbench.models.client import ModelClient

        if mode not in ("adversarial", "cooperative"):
            raise ValueError(f"player_mode must be 'adversarial' or 'cooperative', got {mode!r}")
        client = client or ModelClient()
        role = role_config("player", value, sampling_profile(protocol, profile))
        return LLMPlayer(client, role, mode=mode), client
    return value, client


def build_auditor(value: RoleArg, client: ModelClient | None = None, *, env: str = "ncpbench",
                  profile: str | None = None,
                  protocol: AuditProtocol | str | None = None) -> tuple[Auditor, ModelClient | None]:
    """The auditor for `value`; None gives the stand-in (with a StandInAuditorWarning)."""
    if value is None:
        from ncpbench.auditors.scripted import ReplayAuditor

        warnings.warn(STAND_IN_WARNING.format(env=env_label(env)), StandInAuditorWarning, stacklevel=4)
        return ReplayAuditor(advance=True), client
    if _is_config(value):
        from ncpbench.auditors.pipeline import LLMAuditor
        from ncpbench.models.client import ModelClient

        client = client or ModelClient()
        return LLMAuditor(client, role_config("auditor", value, sampling_profile(protocol, profile))), client
    return value, client


def describe_role(role: object) -> dict[str, Any]:
    """A built role for the env's metadata: an LLM role's settings (no secrets), else its class."""
    from ncpbench.models.config import RoleConfig

    config = getattr(role, "role", None)
    if isinstance(config, RoleConfig):
        return config.public()
    return {"object": type(role).__name__}


def make_env(spec: Any, *, player: RoleArg = None, auditor: RoleArg = None, player_mode: str = "adversarial",
             profile: str | None = None, **kwargs: Any) -> NarrativeEnv:
    """The registered entry point of every `ncpbench/<Name>-vN` id (see the module docstring)."""
    protocol = kwargs.get("protocol")
    chosen = sampling_profile(protocol, profile)
    built_player, client = build_player(player, None, player_mode, profile=chosen)
    built_auditor, _ = build_auditor(auditor, client, env=spec, profile=chosen)
    made = NarrativeEnv(spec, player=built_player, auditor=built_auditor, **kwargs)
    # An instance copy: the class dict is shared by every env. Wrappers forward `metadata`, so
    # gym.make(...).metadata["ncpbench"] shows what sampled the roles of this env.
    made.metadata = {**made.metadata, "ncpbench": {
        "protocol": made.protocol.label, "profile": chosen, "player_mode": player_mode,
        "player": describe_role(built_player), "auditor": describe_role(built_auditor)}}
    return made


def register_envs() -> None:
    """The `gymnasium.envs` entry point (for loaders that read it) and the startup hook's call."""
    from ncpbench.registry import register_all

    register_all()


def env_label(spec: object) -> str:
    """The gym id of a bundled slug (the spec's key or the text itself for anything else)."""
    from ncpbench.registry import bundled_versions, env_id

    if isinstance(spec, str):
        return env_id(spec) if spec in bundled_versions() else spec
    return str(getattr(spec, "key", spec))
