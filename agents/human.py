"""People as roles: a narrator or a player typing at a terminal (or piping lines in).

Both read one reply per line from a text stream (stdin by default), so piped input works:

- a line `/quit`, or the end of input, raises `EndOfSession`: the caller ends the episode there and
  records it as it stands;
- a blank line asks again (a blank narrator reply would count as ignoring the player);
- a line ending in a backslash continues on the next line (multi-line replies);
- `HumanNarrator` also takes `/state`, which prints the story state again.

`HumanNarrator` is shown what an LLM narrator is shown: the story state (active facts,
commitments, the next plot point; printed again whenever it changed) and the player's action. `HumanPlayer` is shown only what a
player may see: the story so far, never facts, commitments or the plot. It takes a `before_prompt`
hook, which is how a front end (the `ncpbench play` command) shows the latest turn and its verdict
before asking for the next action; agents never import auditors, so the verdict comes from there.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TextIO

from ncpbench.episode import EpisodeInterrupted
from ncpbench.protocols import NarratorRequest, PlayerRequest
from ncpbench.views import render_story_state

QUIT = "/quit"


class EndOfSession(EpisodeInterrupted):
    """The person ended the session (`/quit` or end of input): the episode pauses, state intact."""


class LineReader:
    """Reads replies line by line; see the module docstring for `/quit`, blanks and continuations."""

    def __init__(self, stdin: TextIO | None = None, stdout: TextIO | None = None) -> None:
        self._stdin = stdin
        self._stdout = stdout

    @property
    def stdin(self) -> TextIO:
        return self._stdin or sys.stdin

    @property
    def stdout(self) -> TextIO:
        return self._stdout or sys.stdout

    def say(self, text: str = "") -> None:
        self.stdout.write(text + "\n")
        self.stdout.flush()

    def read(self, prompt: str, commands: dict[str, Callable[[], None]] | None = None) -> str:
        """One reply; a line naming one of `commands` (e.g. `/state`) runs it and asks again."""
        parts: list[str] = []
        while True:
            self.stdout.write(prompt if not parts else "... ")
            self.stdout.flush()
            line = self.stdin.readline()
            if not line:
                if not self.stdin.isatty():
                    self.say()
                raise EndOfSession("end of input")
            text = line.rstrip("\r\n")
            if not self.stdin.isatty():
                self.say(text)  # echo piped input so a transcript of the session reads naturally
            if not parts and text.strip() == QUIT:
                raise EndOfSession(QUIT)
            if not parts and commands and text.strip() in commands:
                commands[text.strip()]()
                continue
            if text.endswith("\\"):
                parts.append(text[:-1].rstrip())
                continue
            parts.append(text.strip())
            reply = "\n".join(p for p in parts if p).strip()
            if reply:
                return reply
            parts = []


class HumanNarrator:
    """A person as the narrator under test."""

    def __init__(self, stdin: TextIO | None = None, stdout: TextIO | None = None, *, show_state: bool = True) -> None:
        self.reader = LineReader(stdin, stdout)
        self.show_state = show_state
        self._last_state: str | None = None

    def narrate(self, request: NarratorRequest) -> str:
        say = self.reader.say
        state = render_story_state(request)
        say("")
        say(f"── {'opening' if request.turn == 0 else f'turn {request.turn}'} ──")
        if self.show_state and state != self._last_state:
            say(state)
            say("")
        elif self.show_state:
            say("(story state unchanged; /state shows it)")
        self._last_state = state
        if request.player_action is None:
            say(f"Write the opening scene: set the place and the situation, then stop where {request.player_role} can act.")
        else:
            say(f"{request.player_role} does: {request.player_action}")
        return self.reader.read("narrator> ", {"/state": lambda: say(state)})


class HumanPlayer:
    """A person playing the role; sees only the visible story."""

    def __init__(self, stdin: TextIO | None = None, stdout: TextIO | None = None, *,
                 before_prompt: Callable[[PlayerRequest], None] | None = None) -> None:
        self.reader = LineReader(stdin, stdout)
        self.before_prompt = before_prompt

    def act(self, request: PlayerRequest) -> str:
        if self.before_prompt is not None:
            self.before_prompt(request)
        elif request.transcript:
            self.reader.say(f"Narrator: {request.transcript[-1].narrator_reply}")
        return self.reader.read(f"{request.player_role} (turn {request.turn})> ")
