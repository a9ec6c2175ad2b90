"""What each role is shown: requests built from the state, and their plain-text renderings.

Pure. The same rendering feeds the env's text observation and the LLM narrator's prompt, so an
RL policy and an LLM agent see the same thing.
"""

from __future__ import annotations

from ncpbench.protocol import preview_ledger
from ncpbench.protocols import CommitmentView, NarratorRequest, NodeView, PlayerRequest
from ncpbench.spec import Spec
from ncpbench.state import EpisodeState, Exchange
from ncpbench.trajectory import TrajectoryGraph


def player_request(spec: Spec, state: EpisodeState) -> PlayerRequest:
    return PlayerRequest(title=spec.meta.title, player_role=spec.meta.player_role, turn=state.turn + 1,
                         transcript=state.transcript)


def narrator_request(spec: Spec, graph: TrajectoryGraph, state: EpisodeState,
                     player_action: str | None) -> NarratorRequest:
    current = graph.current(state.completed_nodes)
    node = graph.descriptions[current] if current else None
    statuses = {c.id: c.status.value for c in state.commitments.items}
    pending = state.pending_diff
    return NarratorRequest(
        title=spec.meta.title,
        player_role=spec.meta.player_role,
        turn=0 if player_action is None else state.turn + 1,
        player_action=player_action,
        transcript=state.transcript,
        facts=tuple(f"{fid}: {text}" for fid, text in preview_ledger(state)),
        initial_facts=tuple(f"{f.id}: {f.content}" for f in spec.initial_facts if not f.negated),
        pending_facts=(*(f"new: {a}" for a in pending.add), *(f"no longer true: {n}" for n in pending.negate)),
        commitments=tuple(CommitmentView(id=c.id, type=c.type.value, description=c.description,
                                         status=statuses[c.id], satisfaction_condition=c.satisfaction_condition,
                                         violation_condition=c.violation_condition) for c in spec.commitments),
        current_node=NodeView(id=node.id, description=node.description, trigger_event=node.trigger_event,
                              key_delta=node.key_delta) if node else None,
        completed_nodes=state.completed_nodes,
    )


def render_transcript(transcript: tuple[Exchange, ...] | list[Exchange], player_role: str) -> str:
    lines = []
    for ex in transcript:
        if ex.player_action is not None:
            lines.append(f"[turn {ex.turn}] {player_role}: {ex.player_action}")
        lines.append(f"[turn {ex.turn}] Narrator: {ex.narrator_reply}")
    return "\n".join(lines)


def render_story_state(req: NarratorRequest) -> str:
    parts = [f"Story: {req.title}. The player is {req.player_role}.", "", "Established facts:"]
    parts += [f"- {f}" for f in req.facts]
    parts += ["", "Story commitments:"]
    parts += [f"- {c.id} ({c.type}, {c.status}): {c.description}" for c in req.commitments]
    parts.append("")
    if req.current_node:
        n = req.current_node
        parts += [f"Next plot point ({n.id}): {n.description}",
                  f"  It happens when: {n.trigger_event}",
                  f"  Afterwards: {n.key_delta}"]
    else:
        parts.append("The reference plot is complete.")
    return "\n".join(parts)
