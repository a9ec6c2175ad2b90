"""Reinforcement-learning helpers: async batched stepping, branching, and branch searches.

- `AsyncBatchEnv(envs)`: steps many episodes concurrently in one event loop (`asyncio.gather` over
  `NarrativeEnv.astep`), so the player's and the auditors' model calls of all episodes overlap.
  Finished episodes are recorded (`batch.records`) and either sit out (`active` is False, their
  replies are ignored) or, with `autoreset=True`, start a new episode in the same step.
- `branch(env)`: a new env at the same point of the same episode (same story, roles, limits,
  reward); stepping one never changes the other.
- `try_replies(env, replies)`: audit each candidate reply on its own branch, concurrently;
  `best_index` picks the best; `search_record` writes the search down as a `BranchSearch` (one
  line of a run folder's `branches.jsonl`, which `ncpbench export --format preference` reads).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, Field

from ncpbench.env import NarrativeEnv, narrate
from ncpbench.episode import DEFAULT_TURN_TIMEOUT_S, describe_failure, guarded
from ncpbench.protocols import Auditor, Narrator, NarratorRequest, Player
from ncpbench.record import AgentReply, EpisodeRecord
from ncpbench.state import Outcome
from ncpbench.verdict import Verdict

Reply = str | AgentReply


def unwrap(env: Any) -> NarrativeEnv:
    """The NarrativeEnv inside a `gymnasium.make` wrapper stack (or the env itself)."""
    inner = getattr(env, "unwrapped", env)
    if not isinstance(inner, NarrativeEnv):
        raise TypeError(f"expected a NarrativeEnv (or a wrapper around one), got {type(inner).__name__}")
    return inner


def branch(env: Any, *, player: Player | None = None, auditor: Auditor | None = None) -> NarrativeEnv:
    """`env.unwrapped.branch()`: a new env continuing this episode from this exact point."""
    return unwrap(env).branch(player=player, auditor=auditor)


# -- batched async stepping ------------------------------------------------------------------------


def _seeds(seeds: int | Sequence[int | None] | None, n: int) -> list[int | None]:
    if seeds is None:
        return [None] * n
    if isinstance(seeds, int):
        return [seeds + i for i in range(n)]
    out = list(seeds)
    if len(out) != n:
        raise ValueError(f"{len(out)} seeds for {n} envs")
    return out


@dataclass
class _Slot:
    env: NarrativeEnv
    obs: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    episodes: int = 0
    started: bool = False
    failed: bool = False
    """Ended as ERROR outside `step` (its narrator failed): reported by the next step."""
    last_record: EpisodeRecord | None = None


class AsyncBatchEnv:
    """Step n NarrativeEnvs together; every model call of a step runs concurrently.

    ```python
    batch = AsyncBatchEnv.make(["iron-man"] * 8, auditor=auditor, player=player, max_turns=20)
    obs, infos = await batch.reset(seeds=0)               # env i gets seed 0 + i
    while not batch.done:
        replies = await batch.narrate(narrator)            # or your policy: one str per env (None if inactive)
        obs, rewards, terminated, truncated, infos = await batch.step(replies)
    records = batch.records                                # one EpisodeRecord per finished episode
    ```

    Lists are aligned with `batch.envs`. An env whose episode is over is *inactive*: its reply is
    ignored (pass None) and it returns its last observation with reward 0, terminated and
    truncated False and `info["active"] = False`, so each episode end is reported exactly once.
    With `autoreset=True` a finished env starts its next episode in the same step (seeded from its
    own generator): the returned observation and info are the new episode's, and
    `info["final_obs"]`, `info["final_info"]`, `info["record"]` describe the one that ended.

    Failures follow the episode driver's policy (`ncpbench.episode.guarded`, the same as the batch
    runner's): a narrator call or a step over `turn_timeout_s`, a failing model call, or any
    exception in a role ends only that episode, as ERROR with truncated True and `info["error"]`.
    With `catch_errors=False` exceptions propagate instead.
    """

    def __init__(self, envs: Sequence[Any], *, autoreset: bool = False, catch_errors: bool = True,
                 turn_timeout_s: float | None = DEFAULT_TURN_TIMEOUT_S) -> None:
        if not envs:
            raise ValueError("AsyncBatchEnv needs at least one env")
        self._slots = [_Slot(unwrap(e)) for e in envs]
        self.autoreset = autoreset
        self.catch_errors = catch_errors
        self.turn_timeout_s = turn_timeout_s
        self.records: list[EpisodeRecord] = []
        """Every finished episode, in the order they ended."""

    @classmethod
    def make(cls, slugs: Sequence[str], *, autoreset: bool = False, catch_errors: bool = True,
             turn_timeout_s: float | None = DEFAULT_TURN_TIMEOUT_S, **env_kwargs: Any) -> AsyncBatchEnv:
        """One NarrativeEnv per slug (repeat a slug for replicates), all with the same keyword arguments."""
        return cls([NarrativeEnv(s, **env_kwargs) for s in slugs], autoreset=autoreset, catch_errors=catch_errors,
                   turn_timeout_s=turn_timeout_s)

    @property
    def envs(self) -> list[NarrativeEnv]:
        return [s.env for s in self._slots]

    @property
    def num_envs(self) -> int:
        return len(self._slots)

    @property
    def active(self) -> list[bool]:
        return [s.started and not s.env.state.done for s in self._slots]

    @property
    def done(self) -> bool:
        """Every episode is over (never True with autoreset)."""
        return not any(self.active)

    def requests(self) -> list[NarratorRequest | None]:
        """What each active env's narrator should answer now (None for inactive envs)."""
        return [s.env.narrator_view() if a else None for s, a in zip(self._slots, self.active, strict=True)]

    async def reset(self, seeds: int | Sequence[int | None] | None = None,
                    options: dict[str, Any] | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Reset every env; an int seed s gives env i the seed s + i."""
        for slot, seed in zip(self._slots, _seeds(seeds, self.num_envs), strict=True):
            slot.obs, slot.info = slot.env.reset(seed=seed, options=options)
            slot.info = {**slot.info, "active": True}
            slot.started = True
        return [s.obs for s in self._slots], [s.info for s in self._slots]

    async def narrate(self, narrator: Narrator | Sequence[Narrator]) -> list[Reply | None]:
        """Ask a narrator (or one per env) for every active env's reply, concurrently."""
        narrators = list(narrator) if isinstance(narrator, Sequence) else [narrator] * self.num_envs
        if len(narrators) != self.num_envs:
            raise ValueError(f"{len(narrators)} narrators for {self.num_envs} envs")
        requests = self.requests()

        async def one(slot: _Slot, n: Narrator, request: NarratorRequest | None) -> Reply | None:
            if request is None:
                return None
            if not self.catch_errors:
                return await asyncio.wait_for(narrate(n, request), self.turn_timeout_s)
            reply = await guarded(slot.env, lambda: narrate(n, request), self.turn_timeout_s)
            if reply is None:  # the driver ended the episode as ERROR: report it in the next step
                self._finish_failed(slot)
            return reply

        return list(await asyncio.gather(*(one(s, n, r) for s, n, r in zip(self._slots, narrators, requests,
                                                                             strict=True))))

    def _finish_failed(self, slot: _Slot) -> None:
        slot.obs = slot.env.observation()
        slot.info = {**slot.info, "outcome": Outcome.ERROR.value, "error": slot.env.error, "verdict": None,
                     "reward_breakdown": dict.fromkeys(slot.info.get("reward_breakdown") or {}, 0.0),
                     "phase": "over", "active": True}
        slot.failed = True

    async def step(self, replies: Sequence[Reply | None]) -> tuple[
            list[dict[str, Any]], npt.NDArray[np.float64], npt.NDArray[np.bool_], npt.NDArray[np.bool_],
            list[dict[str, Any]]]:
        if len(replies) != self.num_envs:
            raise ValueError(f"{len(replies)} replies for {self.num_envs} envs")
        if not any(s.started for s in self._slots):
            raise RuntimeError("call `await batch.reset()` before step()")
        active = self.active
        failed = [s.failed for s in self._slots]
        for i, (a, r) in enumerate(zip(active, replies, strict=True)):
            if a and r is None:
                raise ValueError(f"env {i} ({self._slots[i].env.story.key}) is active and needs a reply, got None")

        async def one(slot: _Slot, reply: Reply) -> Any:
            if not self.catch_errors:
                return await asyncio.wait_for(slot.env.astep(reply), self.turn_timeout_s)
            return await guarded(slot.env, lambda: slot.env.astep(reply), self.turn_timeout_s)

        results = await asyncio.gather(*(one(s, r) for s, a, r in zip(self._slots, active, replies, strict=True)
                                         if a and r is not None))
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminated = np.zeros(self.num_envs, dtype=np.bool_)
        truncated = np.zeros(self.num_envs, dtype=np.bool_)
        it = iter(results)
        for i, slot in enumerate(self._slots):
            if failed[i]:
                slot.failed = False
                truncated[i] = True
            elif not active[i]:
                slot.info = {**slot.info, "active": False}
                continue
            else:
                result = next(it)
                if result is None:  # the driver ended the episode as ERROR
                    self._finish_failed(slot)
                    slot.failed = False
                    truncated[i] = True
                else:
                    slot.obs, reward, term, trunc, info = result
                    slot.info = {**info, "active": True}
                    rewards[i], terminated[i], truncated[i] = reward, term, trunc
            if slot.env.state.done:
                record = slot.env.record(replicate=slot.episodes)
                self.records.append(record)
                slot.last_record = record
                slot.episodes += 1
                if self.autoreset:
                    final_obs, final_info = slot.obs, slot.info
                    slot.obs, info = slot.env.reset()
                    slot.info = {**info, "active": True, "final_obs": final_obs, "final_info": final_info,
                                 "record": record}
        return [s.obs for s in self._slots], rewards, terminated, truncated, [s.info for s in self._slots]

    async def run(self, narrator: Narrator | Sequence[Narrator],
                  seeds: int | Sequence[int | None] | None = None) -> list[EpisodeRecord]:
        """Play every env's episode to its end with `narrator`; returns their records (env order).
        Each env follows the same failure policy as `ncpbench.episode.play_episode`."""
        if self.autoreset:
            raise RuntimeError("run() plays each env once; it needs autoreset=False")
        await self.reset(seeds)
        while not self.done:
            await self.step(await self.narrate(narrator))
        return [s.last_record for s in self._slots if s.last_record is not None]

    def close(self) -> None:
        for s in self._slots:
            s.env.close()


# -- branch search ---------------------------------------------------------------------------------


@dataclass
class BranchResult:
    """One candidate reply played on its own branch."""

    reply: str
    """The reply as the env recorded it (after cleaning)."""
    env: NarrativeEnv
    """The branch, advanced by the reply: keep it to continue the episode from there."""
    observation: dict[str, Any] = field(default_factory=dict)
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    """The failure (a model call that kept failing) when the branch could not be audited."""

    @property
    def committed(self) -> bool:
        """The reply passed the audit (no confirmed conflict) and was committed."""
        return self.error is None and bool(self.env.history) and self.env.history[-1].committed


async def try_replies(env: Any, replies: Sequence[Reply], *, auditor: Auditor | None = None) -> list[BranchResult]:
    """Play each reply on its own branch of `env` (concurrently); `env` itself does not move."""
    base = unwrap(env)
    if base.state.done:
        raise RuntimeError(f"the episode is over ({base.state.outcome.value})")
    branches = [base.branch(auditor=auditor) for _ in replies]
    done = await asyncio.gather(*(b.astep(r) for b, r in zip(branches, replies, strict=True)), return_exceptions=True)
    out: list[BranchResult] = []
    for b, reply, result in zip(branches, replies, done, strict=True):
        text = reply.text if isinstance(reply, AgentReply) else reply
        if isinstance(result, BaseException):
            if not isinstance(result, Exception):
                raise result
            out.append(BranchResult(reply=text, env=b, error=describe_failure(result)))
            continue
        obs, reward, term, trunc, info = result
        recorded = b.history[-1].narrator_reply if b.history else text
        out.append(BranchResult(reply=recorded, env=b, observation=obs, reward=reward, terminated=term,
                                truncated=trunc, info=info))
    return out


def best_index(results: Sequence[BranchResult]) -> int:
    """The best candidate: one that passed the audit before one that did not, then the highest
    reward, then the one the env had to fix least (`info["notes"]`: an empty opening, a cut
    reply, ...), then the earliest. Failed calls rank last."""
    if not results:
        raise ValueError("no candidates")
    return max(range(len(results)),
               key=lambda i: (results[i].error is None, results[i].committed, results[i].reward,
                              -len(results[i].info.get("notes") or ()), -i))


class BranchCandidate(BaseModel):
    reply: str
    committed: bool
    """Passed the audit (no confirmed conflict)."""
    outcome: str
    """The branch's outcome after this reply (ONGOING, CONFLICT, SUCCESS, SURVIVAL, ERROR)."""
    reward: float
    reward_breakdown: dict[str, float] = Field(default_factory=dict)
    verdict: Verdict | None = None
    error: str | None = None
    """Set when the candidate could not be audited (it is then no evidence either way)."""


class BranchSearch(BaseModel):
    """Several candidate replies to one narrator request, each audited on its own branch.

    One JSON object per line of a run folder's `branches.jsonl`.
    """

    episode_id: str = ""
    env_id: str
    seed: int = 0
    turn: int
    """The turn the replies answer (0 = the opening)."""
    request: NarratorRequest
    """What the narrator saw: `export` rebuilds the prompt from it."""
    candidates: list[BranchCandidate]
    chosen: int | None = None
    """The index kept (None when no choice was made)."""


def search_record(env: Any, results: Sequence[BranchResult], chosen: int | None = None, *,
                  episode_id: str = "") -> BranchSearch:
    """Describe a branch search made from `env` (which has not moved) with `try_replies`."""
    base = unwrap(env)
    request = base.narrator_view()
    candidates = [BranchCandidate(reply=r.reply, committed=r.committed,
                                  outcome=r.env.state.outcome.value if r.error is None else Outcome.ERROR.value,
                                  reward=r.reward, reward_breakdown=dict(r.info.get("reward_breakdown") or {}),
                                  verdict=r.info.get("verdict"), error=r.error)
                  for r in results]
    return BranchSearch(episode_id=episode_id or f"{base.story.key}#0", env_id=base.story.key, seed=base.episode_seed,
                        turn=request.turn, request=request, candidates=candidates, chosen=chosen)
