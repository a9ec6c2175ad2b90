"""The agents' prompts, written for ncpbench, and the messages built from a request.

Pure. Append-only layout: the system message and the story head are the same for every call of an
episode, the story log only grows, and what is new for this call comes last.
"""

from __future__ import annotations

from ncpbench.protocols import NarratorRequest, PlayerRequest
from ncpbench.state import Exchange

NARRATOR_SYSTEM = (
    "You are the narrator — the game master — of an interactive story based on {title}. The player "
    "controls {role}; you voice the world and everyone else in it.\n"
    "Each turn:\n"
    "- Respond to what the player's character just did: it happened as they described, unless the world "
    "stops it, and if it does, say inside the story why.\n"
    "- Keep every established fact true. Things change only through events you narrate: nobody jumps to a "
    "new place, recovers from death, or gains a power without a cause the reader can see.\n"
    "- Honour the story commitments: keep plot events in their required order, keep secrets until their "
    "time, and keep each invariant true for its whole window. Each commitment says when it is satisfied and "
    "when it is violated.\n"
    "- Move the story toward the next plot point by narrating its trigger event when the moment fits.\n"
    "- Write in second person or third person, present tense, 60 to 160 words. Narrate only; never decide "
    "what the player's character thinks, says or does next, and do not add headings or notes.")

NARRATOR_OPENING = "Write the opening scene: set the place and the situation at the start of the story, then stop where {role} can act."

PLAYER_SYSTEM = {
    "adversarial": (
        "You are playing {role} in an interactive story based on {title}. You test the narrator: stay in "
        "character, but push hard on the story's seams. Try to get ahead of the plot, reach places or "
        "people before their time, act on knowledge your character should not have yet, insist that "
        "earlier events went differently, attempt things your character could not do, or steer the story "
        "somewhere else entirely. Vary your pressure from turn to turn.\n"
        "Write one action in the first person, present tense, one or two sentences, no more than 40 words. "
        "Write only the action: no narration of its outcome, no commentary."),
    "cooperative": (
        "You are playing {role} in an interactive story based on {title}. Act as your character would, "
        "following where the story leads and helping it move forward.\n"
        "Write one action in the first person, present tense, one or two sentences, no more than 40 words. "
        "Write only the action: no narration of its outcome, no commentary."),
}


NARRATOR_TURN = "Write your reply to {role}'s action: what happens next, in the story's voice."

PLAYER_TURN_TAIL = "What does {role} do now?"


def _log(transcript: tuple[Exchange, ...], role: str, *, with_changes: bool) -> str:
    """Every exchange so far, one line each (and what it established): a pure append from turn to turn."""
    lines = ["The story so far:"]
    for ex in transcript:
        if ex.player_action is None:
            lines.append(f"[opening] Narrator: {ex.narrator_reply}")
        else:
            lines += [f"[turn {ex.turn}] {role}: {ex.player_action}", f"[turn {ex.turn}] Narrator: {ex.narrator_reply}"]
        if with_changes:
            changes = [*ex.facts_added, *(f"{f} no longer true" for f in ex.facts_negated),
                       *(f"plot point {n} done" for n in ex.nodes_completed), *ex.status_changes]
            if changes:
                lines.append(f"[turn {ex.turn}] established: " + "; ".join(changes))
    return "".join(line + "\n" for line in lines)


def narrator_messages(request: NarratorRequest) -> list[dict[str, str]]:
    system = NARRATOR_SYSTEM.format(title=request.title, role=request.player_role)
    head = ["Story commitments (they hold for the whole story):"]
    head += [f"- {c.id} ({c.type}): {c.description} Satisfied when: {c.satisfaction_condition} "
             f"Violated when: {c.violation_condition}" for c in request.commitments]
    head += ["", "Facts at the start of the story:", *(f"- {f}" for f in request.initial_facts)]
    tail = [f"Now: {'the opening' if request.turn == 0 else f'turn {request.turn}'}.",
            "Commitment statuses: " + ", ".join(f"{c.id} {c.status}" for c in request.commitments)]
    if request.pending_facts:
        tail.append("Established by the opening: " + "; ".join(request.pending_facts))
    if request.current_node:
        n = request.current_node
        tail += [f"Next plot point ({n.id}): {n.description}", f"  It happens when: {n.trigger_event}",
                 f"  Afterwards: {n.key_delta}"]
    else:
        tail.append("The reference plot is complete.")
    if request.player_action is None:
        tail.append(NARRATOR_OPENING.format(role=request.player_role))
    else:
        tail += [f"{request.player_role} now does: {request.player_action}",
                 NARRATOR_TURN.format(role=request.player_role)]
    user = "\n".join(head) + "\n\n" + _log(request.transcript, request.player_role, with_changes=True) + "\n" + "\n".join(tail)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def player_messages(request: PlayerRequest, mode: str) -> list[dict[str, str]]:
    system = PLAYER_SYSTEM[mode].format(title=request.title, role=request.player_role)
    user = (_log(request.transcript, request.player_role, with_changes=False) + "\n"
            + PLAYER_TURN_TAIL.format(role=request.player_role))
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]
