"""The reference trajectory as a plot graph, and progress along it.

Pure: a `TrajectoryGraph` is built once from a spec (networkx.DiGraph, edges from `requires`
— default linear — and from ordering commitments); progress is a frozenset of completed node
ids kept in the episode state, so the graph itself never changes during an episode.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import networkx as nx

from ncpbench.spec import CommitmentType, Spec


@dataclass(frozen=True)
class SkipCheck:
    """Whether completing `node` now is allowed, and which predecessors it would skip."""

    node: str
    missing: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.missing


class TrajectoryGraph:
    def __init__(self, spec: Spec) -> None:
        self.order: tuple[str, ...] = tuple(spec.node_ids())
        self.descriptions = {n.id: n for n in spec.trajectory}
        g: nx.DiGraph[str] = nx.DiGraph()
        g.add_nodes_from(self.order)
        for i, node in enumerate(spec.trajectory):
            preds = node.requires if node.requires is not None else ([self.order[i - 1]] if i else [])
            for p in preds:
                g.add_edge(p, node.id, why="requires")
        for c in spec.commitments:
            if c.type is CommitmentType.ORDERING and c.before and c.after:
                g.add_edge(c.before, c.after, why=c.id)
        self.graph = g
        # Every turn asks for the frontier: the predecessor lists are fixed, so read them once.
        self._preds = {n: tuple(g.predecessors(n)) for n in self.order}

    def __len__(self) -> int:
        return len(self.order)

    def cycle(self) -> list[tuple[str, str]] | None:
        """One cycle's edges, or None when the plot graph is acyclic."""
        try:
            return [(a, b) for a, b, *_ in nx.find_cycle(self.graph)]
        except nx.NetworkXNoCycle:
            return None

    def is_ancestor(self, a: str, b: str) -> bool:
        """True when a must happen strictly before b."""
        return a != b and nx.has_path(self.graph, a, b)

    def predecessors(self, node: str) -> list[str]:
        return list(self.graph.predecessors(node))

    def frontier(self, completed: Iterable[str]) -> list[str]:
        """Nodes not yet completed whose predecessors all are: what may happen next."""
        done = set(completed)
        return [n for n in self.order if n not in done and all(p in done for p in self._preds[n])]

    def check_skip(self, node: str, completed: Iterable[str]) -> SkipCheck:
        done = set(completed)
        missing = tuple(n for n in self.order if n in nx.ancestors(self.graph, node) and n not in done)
        return SkipCheck(node, missing)

    def progress(self, completed: Iterable[str]) -> float:
        return len(set(completed) & set(self.order)) / len(self.order) if self.order else 0.0

    def current(self, completed: Iterable[str]) -> str | None:
        """The first frontier node in plot order: the node the narrator should be advancing."""
        front = self.frontier(completed)
        return front[0] if front else None
