"""Conformance checks users can run on their own spec or narrator (like gymnasium's check_env).

    from ncpbench.testing import check_environment
    report = check_environment("environments/my-film.yaml")            # spec + env conformance
    report = check_environment("iron-man", narrator=my_narrator)       # also drives your narrator

Raises `ConformanceError` listing every problem; returns a short summary when all is well.
No model is called: the player is the seeded scripted adversary and the auditor a stand-in that
completes one plot node per turn, so the check is fast, offline and deterministic.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from gymnasium.utils.env_checker import check_env

from ncpbench.dataset import get_spec, load_file
from ncpbench.env import NarrativeEnv, run_sync
from ncpbench.episode import DEFAULT_TURN_TIMEOUT_S, play_episode
from ncpbench.protocols import Narrator, NarratorRequest
from ncpbench.spec import Spec
from ncpbench.state import Outcome
from ncpbench.validation import SpecError


class ConformanceError(AssertionError):
    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class _EchoNarrator:
    def narrate(self, request: NarratorRequest) -> str:
        node = request.current_node
        return node.trigger_event if node else "The story continues quietly."


def check_environment(spec: Spec | str | Path, narrator: Narrator | None = None, *, turns: int = 5,
                      seed: int = 0, turn_timeout_s: float | None = DEFAULT_TURN_TIMEOUT_S) -> dict[str, Any]:
    """Validate the spec, run gymnasium's check_env without warnings, then play `turns` turns."""
    from ncpbench.agents.scripted import ScriptedPlayer
    from ncpbench.auditors.scripted import ReplayAuditor

    problems: list[str] = []
    try:
        if isinstance(spec, Spec):
            story = spec
        elif isinstance(spec, Path) or str(spec).endswith((".yaml", ".yml")):
            story = load_file(Path(spec))
        else:
            story = get_spec(str(spec))
    except SpecError as e:
        raise ConformanceError([str(f) for f in e.findings]) from None

    def make() -> NarrativeEnv:
        return NarrativeEnv(story, player=ScriptedPlayer(), auditor=ReplayAuditor(advance=True), max_turns=turns)

    env = make()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            check_env(env)
        except Exception as e:  # check_env raises plain assertions and errors
            problems.append(f"check_env: {type(e).__name__}: {e}")
    # Only registered envs can be re-made in other render modes; a file spec has no registration.
    problems += [f"check_env warning: {w.message}" for w in caught if "alternative render modes" not in str(w.message)]

    env = make()
    used = narrator or _EchoNarrator()
    # The episode driver every runner uses: a failing or hanging narrator ends the episode as ERROR here too.
    record = run_sync(play_episode(env, used, seed=seed, turn_timeout_s=turn_timeout_s))
    if record.outcome is Outcome.ERROR:
        problems.append(f"episode: {record.error}")
    try:
        record.model_dump_json()
    except Exception as e:
        problems.append(f"record is not serialisable: {e}")
    if problems:
        raise ConformanceError(problems)
    return {"env": story.key, "turns": record.turns, "outcome": record.outcome.value,
            "completed_nodes": list(record.final_state.completed_nodes)}
