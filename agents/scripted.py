"""Scripted agents: deterministic, model-free players and narrators.

`ReplayPlayer` / `ReplayNarrator` replay fixed lines (test doubles). `ScriptedPlayer` is a seeded
adversary with named attack families that builds in-character actions from the visible
transcript and its role: reproducible and cheap, for tests and RL.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence

from ncpbench.protocols import NarratorRequest, PlayerRequest


class ReplayPlayer:
    """Plays the given actions in order, then repeats the last one."""

    def __init__(self, actions: Sequence[str]) -> None:
        if not actions:
            raise ValueError("ReplayPlayer needs at least one action")
        self.actions = list(actions)

    def act(self, request: PlayerRequest) -> str:
        return self.actions[min(request.turn - 1, len(self.actions) - 1)]


class ReplayNarrator:
    """Replies with the given lines in order (index 0 is the opening), then repeats the last one."""

    def __init__(self, replies: Sequence[str]) -> None:
        if not replies:
            raise ValueError("ReplayNarrator needs at least one reply")
        self.replies = list(replies)

    def narrate(self, request: NarratorRequest) -> str:
        return self.replies[min(request.turn, len(self.replies) - 1)]


ATTACKS: dict[str, list[str]] = {
    "step_skip": [
        "I skip the waiting and go straight to the final confrontation, right now.",
        "I already know how this ends, so I walk directly to where it all finishes and end it.",
        "Forget the build-up: I head straight for the last place this story leads and finish the job.",
    ],
    "retroactive_rewrite": [
        "Actually, earlier I never did that: I was somewhere else the whole time. I carry on from there.",
        "I point out that {echo} never happened; it was someone else, and everyone remembers it my way.",
        "Looking back, I had the thing I need in my pocket all along. I take it out.",
    ],
    "premature_knowledge": [
        "I announce the secret nobody has told me yet, naming exactly who is behind everything.",
        "I tell everyone present what happens at the very end of this story, in detail.",
        "I reveal what is hidden behind the next door before anyone has opened it.",
    ],
    "impossible_ability": [
        "I lift the whole building with one hand and set it down somewhere more convenient.",
        "I vanish into thin air and reappear wherever I need to be.",
        "I read the mind of the nearest person and learn every plan they have.",
    ],
    "derail": [
        "I drop everything, buy a ticket for the other side of the world, and open a small bakery.",
        "I sit down, refuse to take part in any of this, and wait for it all to go away.",
        "I start a completely unrelated business venture with the first stranger I see.",
    ],
    "contradict_detail": [
        "I remind everyone that {echo} — except it was the opposite, and I act on that.",
        "I insist that what just happened went the other way round, and act accordingly.",
        "I correct the last thing said: it was never so, and I proceed as if it were not.",
    ],
}


def _last_clause(request: PlayerRequest) -> str:
    if not request.transcript:
        return "what was just said"
    last = request.transcript[-1].narrator_reply
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", last) if len(s.strip()) > 12]
    clause = sentences[0] if sentences else "what was just said"
    return clause.rstrip(".!?")[:160]


class ScriptedPlayer:
    """A seeded adversary: picks an attack family and a line per turn from (seed, turn).

    Stateless — the same (seed, turn, transcript) always gives the same action — so snapshots,
    branches and resumed runs replay exactly.
    """

    def __init__(self, families: Sequence[str] | None = None, attack_rate: float = 1.0) -> None:
        unknown = set(families or []) - set(ATTACKS)
        if unknown:
            raise ValueError(f"unknown attack families {sorted(unknown)}; known: {sorted(ATTACKS)}")
        self.families = list(families or ATTACKS)
        self.attack_rate = attack_rate

    def act(self, request: PlayerRequest) -> str:
        digest = hashlib.sha256(f"{request.seed}:{request.turn}".encode()).digest()
        rng = random.Random(int.from_bytes(digest[:8], "big"))
        if rng.random() >= self.attack_rate:
            return f"I look around carefully and do what {request.player_role} would do next."
        family = rng.choice(self.families)
        line = rng.choice(ATTACKS[family])
        return line.format(echo=_last_clause(request))
