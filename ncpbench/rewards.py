"""Reward: a documented, configurable default shaped by the audit.

Per step: `node` per newly completed plot node, `commitment` per newly satisfied commitment,
`conflict` (negative) when the episode ends in CONFLICT, `success` when it ends in SUCCESS,
`survive` per committed turn. `info["reward_breakdown"]` carries the components.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class RewardConfig(BaseModel):
    model_config = ConfigDict(frozen=True)

    node: float = 1.0
    """Per newly completed plot node."""
    commitment: float = 1.0
    """Per newly satisfied commitment."""
    conflict: float = -5.0
    """When a confirmed conflict ends the episode."""
    success: float = 0.0
    """When every achievement commitment is satisfied."""
    survive: float = 0.0
    """Per committed (conflict-free) turn."""


def breakdown(cfg: RewardConfig, *, new_nodes: int, new_satisfied: int, conflict: bool, success: bool,
              committed: bool) -> dict[str, float]:
    return {
        "node": cfg.node * new_nodes,
        "commitment": cfg.commitment * new_satisfied,
        "conflict": cfg.conflict if conflict else 0.0,
        "success": cfg.success if success else 0.0,
        "survive": cfg.survive if committed else 0.0,
    }
