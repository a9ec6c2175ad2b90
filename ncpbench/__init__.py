"""ncpbench: Narrative Commitment Preservation benchmark and Gymnasium environments.

The public face: load specs, make environments, and the data types that cross boundaries.
"""

from ncpbench.commitments import CommitmentBook, CommitmentUpdate, Status
from ncpbench.dataset import Dataset, bundled, get_spec, load
from ncpbench.env import NarrativeEnv
from ncpbench.errors import AuditError
from ncpbench.ledger import FactDiff, FactLedger, LedgerError
from ncpbench.protocols import Auditor, AuditRequest, Narrator, NarratorRequest, Player, PlayerRequest
from ncpbench.record import AgentReply, EpisodeRecord, TurnRecord
from ncpbench.registry import env_id, make, register_all
from ncpbench.rewards import RewardConfig
from ncpbench.spec import Commitment, CommitmentType, Fact, Meta, Node, Spec
from ncpbench.state import EpisodeState, Exchange, Outcome
from ncpbench.textspace import UnicodeText
from ncpbench.trajectory import TrajectoryGraph
from ncpbench.validation import Finding, Severity, SpecError
from ncpbench.verdict import Conflict, ConflictKind, Usage, Verdict

__version__ = "0.1.0"

register_all()


def __getattr__(name: str) -> object:
    # The runner pulls in the model layer (openai); load it only when asked for.
    if name == "run_batch":
        from ncpbench.runner import run_batch

        return run_batch
    raise AttributeError(f"module 'ncpbench' has no attribute {name!r}")

__all__ = [
    "AgentReply", "AuditError", "AuditRequest", "Auditor", "Commitment", "CommitmentBook", "CommitmentType",
    "CommitmentUpdate", "Conflict", "ConflictKind", "Dataset", "EpisodeRecord", "EpisodeState", "Exchange",
    "Fact", "FactDiff", "FactLedger", "Finding", "LedgerError", "Meta", "NarrativeEnv", "Narrator",
    "NarratorRequest", "Node", "Outcome", "Player", "PlayerRequest", "RewardConfig", "Severity", "Spec",
    "SpecError", "Status", "TrajectoryGraph", "TurnRecord", "UnicodeText", "Usage", "Verdict", "__version__",
    "bundled", "env_id", "get_spec", "load", "make", "register_all", "run_batch",
]
