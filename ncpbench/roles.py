"""Building the three roles of a run from its configuration (the edge where models meet agents)."""

from __future__ import annotations

from typing import Any

from ncpbench.agents import LLMNarrator, LLMPlayer, ScriptedPlayer, as_narrator
from ncpbench.auditors import LLMAuditor
from ncpbench.models.client import ModelClient
from ncpbench.models.config import RunConfig
from ncpbench.plugins import PluginRef, RoleName, load_object
from ncpbench.plugins import load_role as _load_role
from ncpbench.protocols import Auditor, Narrator, Player


def build_roles(config: RunConfig, client: ModelClient, salt: str = "") -> tuple[Narrator, Player, Auditor]:
    """The three roles: LLM agents for model strings, your own objects for `module:attr` references."""
    narrator: Narrator
    if config.narrator.provider == "python":
        narrator = load_role("narrator", config.narrator.model)[0]
    else:
        narrator = LLMNarrator(client, config.narrator, salt=salt)
    player: Player
    if config.player_mode == "scripted":
        player = ScriptedPlayer()
    elif config.player.provider == "python":
        player = load_role("player", config.player.model)[0]
    else:
        player = LLMPlayer(client, config.player, mode=config.player_mode, salt=salt)
    auditor: Auditor
    if config.auditor.provider == "python":
        auditor = load_role("auditor", config.auditor.model)[0]
    else:
        auditor = LLMAuditor(client, config.auditor, salt=salt)
    return narrator, player, auditor


def plugin_refs(config: RunConfig) -> dict[str, dict[str, str | None]]:
    """The roles of your own in a run, by reference and source hash (part of the run's identity)."""
    return {r: load_object(config.role(r).model)[1].model_dump() for r in config.active_roles()
            if config.role(r).provider == "python"}


def load_role(role: RoleName, ref: str) -> tuple[Any, PluginRef]:
    """Your own role from `module:attr` / `file.py:attr` (a `str -> str` function becomes a narrator)."""
    return _load_role(role, ref, text_narrator=as_narrator)
