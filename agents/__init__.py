"""Narrator and player agents. Installed as `ncpbench.agents`.

Agents never import auditors: a narrator must not see how it is judged.
"""

from ncpbench.agents.callable import CallableNarrator, as_narrator
from ncpbench.agents.llm import LLMNarrator, LLMPlayer
from ncpbench.agents.scripted import ATTACKS, ReplayNarrator, ReplayPlayer, ScriptedPlayer

__all__ = ["ATTACKS", "CallableNarrator", "LLMNarrator", "LLMPlayer", "ReplayNarrator", "ReplayPlayer",
           "ScriptedPlayer", "as_narrator"]
