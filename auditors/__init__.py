"""Auditor components and the audit pipeline. Installed as `ncpbench.auditors`.

Auditors never import agents: the judge must not depend on the judged.
"""

from typing import TYPE_CHECKING, Any

from ncpbench.auditors.scripted import ReplayAuditor

if TYPE_CHECKING:
    from ncpbench.auditors.pipeline import LLMAuditor


def __getattr__(name: str) -> Any:
    # The LLM auditor pulls in the openai SDK (~2 s to import); a scripted auditor must not pay for it.
    if name == "LLMAuditor":
        from ncpbench.auditors.pipeline import LLMAuditor

        return LLMAuditor
    raise AttributeError(f"module 'ncpbench.auditors' has no attribute {name!r}")

__all__ = ["LLMAuditor", "ReplayAuditor"]
