"""Building the three roles of a run from its configuration (the edge where models meet agents)."""

from __future__ import annotations

from ncpbench.agents import LLMNarrator, LLMPlayer, ScriptedPlayer
from ncpbench.auditors import LLMAuditor
from ncpbench.models.client import ModelClient
from ncpbench.models.config import RunConfig
from ncpbench.protocols import Auditor, Narrator, Player


def build_roles(config: RunConfig, client: ModelClient, salt: str = "") -> tuple[Narrator, Player, Auditor]:
    narrator = LLMNarrator(client, config.narrator, salt=salt)
    player: Player
    if config.player_mode == "scripted":
        player = ScriptedPlayer()
    else:
        player = LLMPlayer(client, config.player, mode=config.player_mode, salt=salt)
    auditor = LLMAuditor(client, config.auditor, salt=salt)
    return narrator, player, auditor
