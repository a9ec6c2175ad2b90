"""A short episode of iron-man driven by scripted stand-ins (no model, no network).

The narrator replays fixed lines, the player is the seeded scripted adversary, and the auditor
completes one plot node per turn. It shows the turn protocol and the episode record; it says
nothing about any model.
"""

from __future__ import annotations

import json
from pathlib import Path

from ncpbench.agents import ReplayNarrator, ScriptedPlayer
from ncpbench.auditors import ReplayAuditor

import ncpbench

REPLIES = [
    "Sand and heat. The convoy rolls through the Kunar hills while Tony Stark jokes with the soldiers.",
    "The humvee lurches as the first explosion hits; the soldiers shout and return fire.",
    "A shell lands at Tony's feet bearing his own company's name. The blast throws him into the sand.",
    "He wakes in a cave with wires running from his chest to a car battery. A doctor named Yinsen watches him.",
]


def main() -> None:
    env = ncpbench.make("iron-man", player=ScriptedPlayer(), auditor=ReplayAuditor(advance=True), max_turns=3)
    narrator = ReplayNarrator(REPLIES)
    _, info = env.reset(seed=7)
    terminated = truncated = False
    while not (terminated or truncated):
        reply = narrator.narrate(info["narrator_request"])
        _obs, reward, terminated, truncated, info = env.step(reply)
        print(f"[turn {info['turn']}] Narrator: {reply}")
        if info["player_action"]:
            print(f"[turn {info['turn'] + 1}] Tony Stark: {info['player_action']}")
        print(f"    verdict: reward={reward} outcome={info['outcome']} completed={info['completed_nodes']}")
    record = env.unwrapped.record()  # type: ignore[attr-defined]
    out = Path("runs/demo-scripted.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record.model_dump(mode="json"), indent=2))
    print(f"outcome {record.outcome.value} after {record.turns} turns; record written to {out}")


if __name__ == "__main__":
    main()
