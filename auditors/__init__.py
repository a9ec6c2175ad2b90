"""Auditor components and the audit pipeline. Installed as `ncpbench.auditors`.

Auditors never import agents: the judge must not depend on the judged.
"""

from ncpbench.auditors.pipeline import LLMAuditor
from ncpbench.auditors.scripted import ReplayAuditor

__all__ = ["LLMAuditor", "ReplayAuditor"]
