"""Playing one episode to its end: the loop every runner shares.

Infrastructure failures (an endpoint that kept failing, output that stayed invalid, a verdict
that cannot apply) end the episode as an ERROR outcome with a redacted reason; they never
escape to the caller.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ncpbench.env import NarrativeEnv, narrate
from ncpbench.errors import AuditError, InvalidOutputError, ModelCallError
from ncpbench.logs import get_logger
from ncpbench.models.client import redact
from ncpbench.protocols import Narrator
from ncpbench.record import EpisodeRecord

log = get_logger("ncpbench.episode")
StepCallback = Callable[[NarrativeEnv, dict[str, Any]], None]


class EpisodeInterrupted(Exception):
    """`stop()` asked the episode to pause between turns (a budget ran out); its state is intact."""


async def _turn(env: NarrativeEnv, narrator: Narrator, info: dict[str, Any]) -> Any:
    return await env.astep(await narrate(narrator, info["narrator_request"]))


def describe_failure(error: BaseException) -> str:
    return redact(f"{type(error).__name__}: {error}")[:500]


async def play_episode(
    env: NarrativeEnv,
    narrator: Narrator,
    *,
    seed: int = 0,
    replicate: int = 0,
    config: dict[str, Any] | None = None,
    on_step: StepCallback | None = None,
    resume: dict[str, Any] | None = None,
    stop: Callable[[], bool] | None = None,
    turn_timeout_s: float | None = None,
) -> EpisodeRecord:
    """Run until CONFLICT, SUCCESS, SURVIVAL or ERROR; `resume` continues from a snapshot.

    `stop` is asked between turns; when it says so, EpisodeInterrupted is raised (nothing is lost:
    the caller's last checkpoint holds every committed turn). `turn_timeout_s` bounds one turn's
    wall-clock time (narrator, audit and the next player action); a turn over it is an ERROR.
    """
    if resume is not None:
        env.reset(seed=seed)
        env.restore(resume)
        info: dict[str, Any] = {"narrator_request": env.narrator_view()}
    else:
        _, info = env.reset(seed=seed)
    try:
        while not env.state.done:
            if stop is not None and stop():
                raise EpisodeInterrupted(env.story.key)
            _, _, terminated, truncated, info = await asyncio.wait_for(_turn(env, narrator, info), turn_timeout_s)
            if on_step is not None:
                on_step(env, info)
            if terminated or truncated:
                break
    except TimeoutError:
        env.fail(f"TurnTimeout: a turn took longer than {turn_timeout_s} s")
        log.warning("episode_error", env=env.story.key, replicate=replicate, error=env.error)
    except (ModelCallError, InvalidOutputError, AuditError) as e:
        env.fail(describe_failure(e))
        log.warning("episode_error", env=env.story.key, replicate=replicate, error=env.error)
    except EpisodeInterrupted:
        raise
    except Exception as e:  # a bug in a plugged-in agent must not take a batch down either
        env.fail(describe_failure(e))
        log.error("episode_crash", env=env.story.key, replicate=replicate, error=env.error)
    return env.record(replicate=replicate, config=config)
