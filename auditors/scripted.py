"""A scripted auditor: replays fixed verdicts (a test double for the audit pipeline)."""

from __future__ import annotations

from collections.abc import Sequence

from ncpbench.commitments import structural_updates
from ncpbench.protocols import AuditRequest
from ncpbench.verdict import Verdict


class ReplayAuditor:
    """Returns the given verdicts in order (index 0 judges the opening), then clean verdicts."""

    def __init__(self, verdicts: Sequence[Verdict] = (), *, advance: bool = False) -> None:
        self.verdicts = list(verdicts)
        self.calls = 0
        self.advance = advance
        """When out of verdicts: complete the first frontier node each turn and satisfy the commitments
        its structural links prove (a plot-following stand-in, not a judge)."""

    def audit(self, request: AuditRequest) -> Verdict:
        index = 0 if request.player_action is None else request.state.turn + 1
        self.calls += 1
        if index < len(self.verdicts):
            return self.verdicts[index]
        if self.advance and request.player_action is not None and request.frontier:
            node = request.frontier[0]
            done = {*request.state.completed_nodes, node}
            # Judge commitments by their structural links, as a plot-following narration would earn them.
            return Verdict(completed_nodes=[node],
                           commitment_updates=structural_updates(request.spec.commitments, done))
        return Verdict()
