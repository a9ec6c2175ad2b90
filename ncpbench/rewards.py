"""Reward: named schemes shaped by the audit, or any `RewardConfig`.

Per step the env adds up components (`info["reward_breakdown"]` carries each one):

- `node` per newly completed plot node;
- `commitment` per newly satisfied commitment;
- `conflict` (negative) when a confirmed conflict ends the episode (CONFLICT);
- `success` when every achievement commitment is satisfied (SUCCESS);
- `survival` when the turn limit is reached without a conflict (SURVIVAL);
- `survive` per committed (conflict-free) turn.

Named schemes (`NarrativeEnv(..., reward="sparse")`, `reward_config("sparse")`):

| name | node | commitment | conflict | success | survival | survive |
|---|---|---|---|---|---|---|
| `progress` (default) | 1 | 1 | -5 | 0 | 0 | 0 |
| `sparse` | 0 | 0 | -1 | 1 | 0.5 | 0 |
| `conflict_penalised` | 1 | 1 | -40 | 0 | 0 | 0.1 |

`sparse` pays on the outcome only (SUCCESS > SURVIVAL > ERROR = 0 > CONFLICT). In
`conflict_penalised` a conflict costs more than a whole plot is worth (every bundled environment
has at most 35 nodes plus commitments), and each clean turn earns a little.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from ncpbench.protocol import TurnOutcome


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
    survival: float = 0.0
    """When the turn limit is reached without a conflict (SURVIVAL)."""
    survive: float = 0.0
    """Per committed (conflict-free) turn."""


SCHEMES: dict[str, RewardConfig] = {
    "progress": RewardConfig(),
    "sparse": RewardConfig(node=0.0, commitment=0.0, conflict=-1.0, success=1.0, survival=0.5),
    "conflict_penalised": RewardConfig(conflict=-40.0, survive=0.1),
}
"""The named reward schemes; `progress` is the default."""


def reward_config(reward: RewardConfig | str | None) -> RewardConfig:
    """A scheme by name, a RewardConfig as it is, or the default (`progress`) for None."""
    if reward is None:
        return SCHEMES["progress"]
    if isinstance(reward, RewardConfig):
        return reward
    if isinstance(reward, str) and reward in SCHEMES:
        return SCHEMES[reward]
    raise ValueError(f"unknown reward scheme {reward!r}; known: {', '.join(SCHEMES)} (or pass a RewardConfig)")


def breakdown(cfg: RewardConfig, *, new_nodes: int, new_satisfied: int, conflict: bool, success: bool,
              committed: bool, survival: bool = False) -> dict[str, float]:
    return {
        "node": cfg.node * new_nodes,
        "commitment": cfg.commitment * new_satisfied,
        "conflict": cfg.conflict if conflict else 0.0,
        "success": cfg.success if success else 0.0,
        "survival": cfg.survival if survival else 0.0,
        "survive": cfg.survive if committed else 0.0,
    }


def turn_reward(cfg: RewardConfig, outcome: TurnOutcome) -> dict[str, float]:
    """The reward components of one applied turn. `commitment` pays the net change in satisfied
    commitments, so a status that reverts (published protocol) takes back what it paid."""
    from ncpbench.state import Outcome

    return breakdown(cfg, new_nodes=len(outcome.completed_nodes), new_satisfied=outcome.net_satisfied,
                     conflict=outcome.outcome is Outcome.CONFLICT, success=outcome.outcome is Outcome.SUCCESS,
                     committed=outcome.committed, survival=outcome.truncated)
