"""Narrator and player agents. Installed as `ncpbench.agents`.

Agents never import auditors: a narrator must not see how it is judged.
"""

from typing import TYPE_CHECKING, Any

from ncpbench.agents.callable import CallableNarrator, as_narrator
from ncpbench.agents.scripted import ATTACKS, ReplayNarrator, ReplayPlayer, ScriptedPlayer

if TYPE_CHECKING:
    from ncpbench.agents.llm import LLMNarrator, LLMPlayer


def __getattr__(name: str) -> Any:
    # The LLM agents pull in the openai SDK (~2 s to import); scripted and callable agents must not pay for it.
    if name in ("LLMNarrator", "LLMPlayer"):
        from ncpbench.agents import llm

        return getattr(llm, name)
    raise AttributeError(f"module 'ncpbench.agents' has no attribute {name!r}")

__all__ = ["ATTACKS", "CallableNarrator", "LLMNarrator", "LLMPlayer", "ReplayNarrator", "ReplayPlayer",
           "ScriptedPlayer", "as_narrator"]
