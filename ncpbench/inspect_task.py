"""`inspect eval ncpbench/inspect_task.py --model MODEL --model-role auditor=MODEL -T envs=iron-man,alien`.

A thin file for inspect's task loader (which looks for `@task` functions in the file itself);
the integration lives in `ncpbench.integrations.inspect_eval`. Needs the `ncpbench[inspect]` extra.
"""

from __future__ import annotations

from inspect_ai import Task, task

from ncpbench.integrations.inspect_eval import ncpbench_task


@task
def ncpbench(envs: str = "iron-man", max_turns: int = 20, replicates: int = 1, seed: int = 0,
             reward: str = "progress", protocol: str | None = None, auditor: str | None = None,
             player: str | None = None, auditor_structured: str = "auto", turn_timeout_s: float = 600.0) -> Task:
    """Narrative Commitment Preservation: one sample per (environment, replicate); see docs/INTEGRATIONS.md."""
    return ncpbench_task(envs=envs, max_turns=max_turns, replicates=replicates, seed=seed, reward=reward,
                         protocol=protocol, auditor=auditor, player=player,
                         auditor_structured=auditor_structured,  # type: ignore[arg-type]
                         turn_timeout_s=turn_timeout_s)
