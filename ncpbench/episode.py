"""The episode driver: the one loop and the one failure policy every way of running shares.

The batch runner, `ncpbench run`, `ncpbench play`, `AsyncBatchEnv` and `check_environment` all
step episodes through `guarded` (one call under the turn deadline and the failure policy) and
most through `play_episode` (the whole loop), so a timeout or a failing model ends an episode the
same way wherever it happens:

- a call over the turn deadline          -> ERROR ("TurnTimeout: ...")
- an infrastructure failure              -> ERROR with the redacted cause (an endpoint that kept
  (ncpbench.errors.INFRASTRUCTURE_ERRORS)   failing, output that stayed invalid, a verdict that
                                            cannot apply)
- any other exception from a role        -> ERROR (a bug in a plugged-in agent must not take a
                                            batch down), logged as a crash
- `stop()` between turns                 -> EpisodeInterrupted (the state is intact; resume later)

Verdicts are never produced here: only the auditor judges, and only `ncpbench.protocol` applies.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import structlog

from ncpbench.env import NarrativeEnv, narrate
from ncpbench.errors import INFRASTRUCTURE_ERRORS
from ncpbench.logs import get_logger
from ncpbench.protocols import Narrator
from ncpbench.record import EpisodeRecord

log = get_logger("ncpbench.episode")
StepCallback = Callable[[NarrativeEnv, dict[str, Any]], None]
T = TypeVar("T")

DEFAULT_TURN_TIMEOUT_S = 600.0
"""Wall-clock limit of one turn (narrator, audit and the next player action) on every path."""


class EpisodeInterrupted(Exception):
    """`stop()` asked the episode to pause between turns (a budget ran out); its state is intact."""


def describe_failure(error: BaseException) -> str:
    from ncpbench.models.client import redact  # the redaction table lives with the keys it learns

    return redact(f"{type(error).__name__}: {error}")[:500]


async def guarded(env: NarrativeEnv, work: Callable[[], Awaitable[T]], turn_timeout_s: float | None) -> T | None:
    """Run one piece of an episode under the deadline and the failure policy.

    Returns its result, or None after ending the episode as ERROR (`env.error` says why).
    """
    deadline = asyncio.timeout(turn_timeout_s)
    try:
        async with deadline:
            return await work()
    except TimeoutError as e:
        # Our deadline, or a TimeoutError a role raised itself (an endpoint's): only the first is a turn timeout.
        env.fail(f"TurnTimeout: a turn took longer than {turn_timeout_s} s" if deadline.expired()
                 else describe_failure(e))
        log.warning("episode_error", env=env.story.key, turn=env.turn, error=env.error)
    except INFRASTRUCTURE_ERRORS as e:
        env.fail(describe_failure(e))
        log.warning("episode_error", env=env.story.key, turn=env.turn, error=env.error)
    except EpisodeInterrupted:
        raise
    except Exception as e:  # a bug in a plugged-in role must not take a batch down either
        env.fail(describe_failure(e))
        log.error("episode_crash", env=env.story.key, turn=env.turn, error=env.error)
    return None


def restorable(env: NarrativeEnv, seed: int, snapshot: dict[str, Any] | None, **where: Any) -> dict[str, Any] | None:
    """The snapshot if it restores on `env` (which it leaves restored), else None: a checkpoint of the
    wrong shape restarts the episode (warning `bad_checkpoint_ignored`, labelled with `where`) instead
    of becoming a permanent ERROR record."""
    if snapshot is None:
        return None
    try:
        env.reset(seed=seed)
        env.restore(snapshot)
        return snapshot
    except Exception as e:  # any shape problem at all: keys, types, another env's state
        log.warning("bad_checkpoint_ignored", **where, error=describe_failure(e)[:200])
        return None


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
    turn_timeout_s: float | None = DEFAULT_TURN_TIMEOUT_S,
) -> EpisodeRecord:
    """Run until CONFLICT, SUCCESS, SURVIVAL or ERROR; `resume` continues from a snapshot.

    `stop` is asked between turns; when it says so, EpisodeInterrupted is raised (nothing is lost:
    the caller's last checkpoint holds every committed turn). `turn_timeout_s` bounds one turn's
    wall-clock time (narrator, audit and the next player action); None means no limit.
    """
    if resume is not None:
        env.reset(seed=seed)
        env.restore(resume)
        info: dict[str, Any] = {"narrator_request": env.narrator_view()}
    else:
        _, info = env.reset(seed=seed)

    async def one_turn() -> Any:
        return await env.astep(await narrate(narrator, info["narrator_request"]))

    with structlog.contextvars.bound_contextvars(episode=f"{env.story.key}#{replicate}"):
        while not env.state.done:
            if stop is not None and stop():
                raise EpisodeInterrupted(env.story.key)
            with structlog.contextvars.bound_contextvars(turn=env.turn):
                result = await guarded(env, one_turn, turn_timeout_s)
            if result is None:
                break
            _, _, terminated, truncated, info = result
            if on_step is not None:
                on_step(env, info)
            if terminated or truncated:
                break
    return env.record(replicate=replicate, config=config)
