"""A narrator of your own, for `ncpbench run --narrator examples/my_narrator.py:narrate`.

Any `str -> str` function works: it receives the whole narrator prompt (instructions, the story's
commitments and facts, the story so far, the next plot point and the player's action) and returns
the narration. This one follows the plot point it is given, which a real narrator would do with a
model call.
"""

from __future__ import annotations

import re

_TRIGGER = re.compile(r"It happens when: (.*)$", re.M)
_ACTION = re.compile(r"now does: (.*)$", re.M)


def narrate(prompt: str) -> str:
    action = _ACTION.search(prompt)
    trigger = _TRIGGER.search(prompt)
    lines = [f"You {action.group(1).removeprefix('I ').rstrip('.')}." if action
             else "The story opens on an ordinary morning."]
    if trigger:
        lines.append(trigger.group(1).strip())
    return " ".join(lines)


class EchoNarrator:
    """The same as a Narrator object (`--narrator examples/my_narrator.py:EchoNarrator` builds one)."""

    def narrate(self, request: object) -> str:
        return "The world holds its breath, and then goes on."
