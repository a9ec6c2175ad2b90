"""A scripted auditor: replays fixed verdicts (a test double for the audit pipeline)."""

from __future__ import annotations

from collections.abc import Sequence

from ncpbench.protocols import AuditRequest
from ncpbench.verdict import Verdict


class ReplayAuditor:
    """Returns the given verdicts in order (index 0 judges the opening), then clean verdicts."""

    def __init__(self, verdicts: Sequence[Verdict] = (), *, advance: bool = False) -> None:
        self.verdicts = list(verdicts)
        self.calls = 0
        self.advance = advance
        """When out of verdicts: complete the first frontier node each turn (a plot-following stub)."""

    def audit(self, request: AuditRequest) -> Verdict:
        index = 0 if request.player_action is None else request.state.turn + 1
        self.calls += 1
        if index < len(self.verdicts):
            return self.verdicts[index]
        if self.advance and request.player_action is not None and request.frontier:
            return Verdict(completed_nodes=[request.frontier[0]])
        return Verdict()
