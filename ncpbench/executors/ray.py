"""Batch runs and vectors of envs past one machine, on Ray (the `ncpbench[ray]` extra).

`run_on_ray` is the runner's `executor="ray"` (`ncpbench run --envs ... --executor ray`):

- episodes are played in Ray worker actors (`EpisodeWorker`), one per worker, each holding one
  event loop and one ModelClient with many episodes in flight; the driver hands each episode to
  the least loaded worker and keeps at most `--concurrency` episodes in flight in all;
- the driver stays the only writer of the run folder: a worker streams back, for every committed
  turn, the calls.jsonl lines of that turn, its usage and the env snapshot, and at the end the
  record; the driver writes calls.jsonl, the checkpoint, and episodes.jsonl through the runner's
  executor interface (`BatchRunner.stored_snapshot`, `on_committed_turn`, `should_stop`, `fail_io`,
  `settle`), the same calls the local executor makes, so resume, --retry-errors, budgets, progress,
  the breaker and reports work as with the local executor;
- a worker that dies loses only its in-flight turns (their calls are buffered on the worker and
  are logged with the turn that commits them): a new worker replaces it and its episodes continue
  from their last checkpoint; an episode that kills MAX_WORKER_DEATHS workers stops the run with
  RunError (the folder stays resumable);
- per-endpoint concurrency limits hold across the cluster by splitting: worker i of n gets
  `limit // n (+1 for the first limit % n)` of every role's `concurrency`, and there are never
  more workers than the smallest limit, so the cluster never has more than `concurrency` calls on
  one endpoint (no cross-worker round trip per call, at the price of a worker not borrowing an
  idle worker's share);
- calls of an episode stopped between turns (budget, breaker) are logged; the response cache
  (--cache) is not used by workers (each node would need its own file).

`RayVectorEnv` is a Gymnasium `VectorEnv` whose sub-envs live in Ray actors (one env each).

Ray is imported only inside these functions: `import ncpbench` never imports it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array

from ncpbench.episode import EpisodeInterrupted, describe_failure, play_episode, restorable
from ncpbench.logs import get_logger
from ncpbench.models.calllog import CallEntry, call_context
from ncpbench.models.client import CallStats, ModelClient
from ncpbench.models.config import ROLES, ConfigError, RunConfig
from ncpbench.record import EpisodeRecord
from ncpbench.verdict import Usage

if TYPE_CHECKING:
    from ncpbench.runner import BatchRunner, EpisodeTask, NarratorFactory, PlayerFactory
    from ncpbench.spec import Spec

log = get_logger("ncpbench.executors.ray")

RAY_EXTRA = "pip install 'ncpbench[ray]'"
MAX_WORKER_DEATHS = 3
"""Workers one episode may lose before the run stops (an episode that keeps killing its worker)."""


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("the ray executor needs Ray, which is not installed", f"install the extra: {RAY_EXTRA}") from None
    return ray


def ensure_ray(address: str | None = None) -> bool:
    """Connect to the cluster at `address`, or start a local Ray instance; True when started here."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    ray.init(address=address, include_dashboard=False, configure_logging=False)
    return True


# -- concurrency limits across the cluster ------------------------------------------------------


def split_limit(limit: int, n: int, i: int) -> int:
    """Worker i's share of a limit split over n workers (the shares add up to the limit)."""
    return limit // n + (1 if i < limit % n else 0)


def worker_count(config: RunConfig, concurrency: int, wanted: int) -> int:
    """Workers to start: as wanted, but no more than episodes in flight or the smallest endpoint limit."""
    smallest = min(config.role(r).concurrency for r in config.active_roles())
    return max(1, min(wanted, concurrency, smallest))


def worker_config(config: RunConfig, n: int, i: int) -> RunConfig:
    """The run's config with worker i's share of every role's concurrency limit."""
    updates = {r: config.role(r).model_copy(update={"concurrency": max(1, split_limit(config.role(r).concurrency, n, i))})
               for r in ROLES}
    return config.model_copy(update=updates)


# -- the worker actor ---------------------------------------------------------------------------


class EpisodeWorker:
    """One Ray actor: an event loop and a ModelClient, many episodes in flight (async actor methods)."""

    def __init__(self, config: dict[str, Any], record_config: dict[str, Any], max_turns: int,
                 turn_timeout_s: float | None, narrator: NarratorFactory | None,
                 player: PlayerFactory | None = None) -> None:
        self.config = RunConfig.model_validate(config)
        self.record_config = record_config
        self.max_turns = max_turns
        self.turn_timeout_s = turn_timeout_s
        self.narrator_factory = narrator
        self.player_factory = player
        self._calls: dict[str, list[dict[str, Any]]] = {}
        self._stop = False
        self.client = ModelClient(call_sink=self._sink)

    def _sink(self, entry: CallEntry) -> None:
        buffer = self._calls.get(entry.episode or "")
        if buffer is not None:  # held until its turn commits: a lost turn leaves no line
            buffer.append(entry.model_dump(mode="json"))

    async def pid(self) -> int:
        return os.getpid()

    async def stop(self) -> None:
        """Stop every episode between turns (the driver's budget or breaker said so)."""
        self._stop = True

    async def stats(self) -> CallStats:
        return self.client.stats

    async def play(self, task: EpisodeTask, spec: Spec, resume: dict[str, Any] | None) -> Any:
        """Play (or continue) one episode; yields `turn` events, then one `end` (or `broken`)."""
        from ncpbench.env import NarrativeEnv
        from ncpbench.roles import build_roles

        try:
            narrator, player, auditor = build_roles(self.config, self.client, salt=task.episode_id)
            if self.narrator_factory is not None:
                narrator = self.narrator_factory(task)
            if self.player_factory is not None:
                player = self.player_factory(task)
            env = NarrativeEnv(spec, player=player, auditor=auditor, max_turns=self.max_turns,
                               protocol=self.config.audit_protocol())
        except Exception as e:  # the local executor stops the run here too (RunError)
            yield {"kind": "broken", "error": describe_failure(e)}
            return
        resume = restorable(env, task.seed, resume, episode=task.episode_id)
        buffer: list[dict[str, Any]] = []
        self._calls[task.episode_id] = buffer
        events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        def take_calls() -> list[dict[str, Any]]:
            calls = buffer[:]
            buffer.clear()
            return calls

        def on_step(e: NarrativeEnv, info: dict[str, Any]) -> None:
            events.put_nowait({"kind": "turn", "calls": take_calls(),
                               "usage": {r: u.model_dump() for r, u in e.history[-1].usage.items()},
                               "snapshot": None if e.state.done else e.snapshot()})

        async def go() -> None:
            record: EpisodeRecord | None
            try:
                with call_context(episode=task.episode_id):
                    record = await play_episode(
                        env, narrator, seed=task.seed, replicate=task.replicate, config=self.record_config,
                        on_step=on_step, resume=resume, stop=lambda: self._stop, turn_timeout_s=self.turn_timeout_s)
            except EpisodeInterrupted:
                record = None
            except Exception as e:  # as the local executor: an ERROR record, never a crash
                env.fail(describe_failure(e))
                record = env.record(replicate=task.replicate, config=self.record_config)
            events.put_nowait({"kind": "end", "record": record.model_dump(mode="json") if record else None})

        runner = asyncio.create_task(go())
        try:
            while True:
                event = await events.get()
                if event["kind"] == "end":
                    event["calls"] = take_calls()
                    yield event
                    return
                yield event
        finally:
            runner.cancel()
            self._calls.pop(task.episode_id, None)


# -- the driver ---------------------------------------------------------------------------------


class _Pool:
    def __init__(self, ray: Any, runner: BatchRunner, n: int) -> None:
        self.ray = ray
        self.runner = runner
        self.n = n
        self.cls = ray.remote(num_cpus=1, max_restarts=0, max_concurrency=10_000)(EpisodeWorker)
        self.stopped = False
        self.actors = [self._spawn(i) for i in range(n)]
        self.load = [0] * n

    def _spawn(self, i: int) -> Any:
        r = self.runner
        cfg = worker_config(r.config, self.n, i).model_dump(mode="json")
        actor = self.cls.remote(cfg, r.record_config, r.settings.max_turns, r.turn_timeout_s, r.narrator_factory,
                               r.player_factory)
        if self.stopped:
            actor.stop.remote()
        return actor

    def pick(self) -> int:
        return min(range(self.n), key=lambda i: self.load[i])

    def replace(self, i: int, dead: Any) -> None:
        if self.actors[i] is dead:  # the first of its episodes to notice replaces it
            self.actors[i] = self._spawn(i)

    def stop_all(self) -> None:
        if not self.stopped:
            self.stopped = True
            for a in self.actors:
                a.stop.remote()


async def _episode(runner: BatchRunner, pool: _Pool, task: EpisodeTask, client: ModelClient, sink: TextIO) -> None:
    from ncpbench.runner import RunError

    ray = pool.ray
    died = (ray.exceptions.RayActorError, getattr(ray.exceptions, "ActorUnavailableError", ray.exceptions.RayActorError))
    runner.progress.alive += 1
    if runner.on_change:
        runner.on_change(runner.progress)
    record: EpisodeRecord | None = None
    try:
        for deaths in range(MAX_WORKER_DEATHS + 1):
            if deaths == MAX_WORKER_DEATHS:
                raise RunError(f"{task.episode_id} lost {deaths} Ray workers in a row; rerun to resume it")
            i = pool.pick()
            actor = pool.actors[i]
            pool.load[i] += 1
            try:
                # the worker checks the snapshot's shape on its env (runner.stored_snapshot reads the JSON)
                stream = actor.play.remote(task, runner.dataset[task.env_id], runner.stored_snapshot(task))
                async for ref in stream:
                    event = await ref
                    for line in event.get("calls", ()):
                        if client.call_sink is not None:
                            client.call_sink(CallEntry.model_validate(line))
                    if event["kind"] == "broken":
                        raise RunError(event["error"])
                    if event["kind"] == "turn":  # counted and checkpointed exactly as a local turn
                        runner.on_committed_turn(task, {r: Usage.model_validate(u) for r, u in event["usage"].items()},
                                                 event["snapshot"])
                        if runner.should_stop():
                            pool.stop_all()
                    elif event["kind"] == "end":
                        record = EpisodeRecord.model_validate(event["record"]) if event["record"] else None
                break
            except died as e:
                log.warning("ray_worker_lost", episode=task.episode_id, error=describe_failure(e)[:200])
                pool.replace(i, actor)
            finally:
                pool.load[i] -= 1
    finally:
        runner.progress.alive -= 1
    runner.settle(task, record, sink)


def _add_stats(total: CallStats, part: CallStats) -> None:
    for f in dataclasses.fields(CallStats):
        mine, theirs = getattr(total, f.name), getattr(part, f.name)
        if f.name == "by_status":
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0) + v
        elif f.name == "usage_by_model":
            for k, v in theirs.items():
                mine[k] = mine.get(k, Usage()).add(v)
        elif isinstance(mine, int | float):
            setattr(total, f.name, mine + theirs)


async def run_on_ray(runner: BatchRunner, pending: Iterable[EpisodeTask], client: ModelClient, sink: TextIO) -> None:
    """The runner's `_run_all` on Ray workers: same lanes, same stop rules, same commits."""
    ray = import_ray()
    started_here = ensure_ray(runner.ray_address)
    wanted = runner.ray_workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
    pool = _Pool(ray, runner, worker_count(runner.config, runner.concurrency, wanted))
    log.info("ray_workers_started", workers=pool.n, address=runner.ray_address or "local")
    tasks = iter(pending)

    async def lane() -> None:
        for task in tasks:
            if runner.should_stop():
                return
            try:
                await _episode(runner, pool, task, client, sink)
            except OSError as e:
                runner.fail_io(runner.out, e)
                return

    n = min(runner.concurrency, max(runner.progress.total - runner.progress.done, 0)) or 1
    try:
        try:
            async with asyncio.TaskGroup() as group:
                for _ in range(n):
                    group.create_task(lane())
        except BaseExceptionGroup as group_error:
            raise group_error.exceptions[0] from None
    finally:
        for actor in pool.actors:  # the stats of live workers (a lost worker's calls are in calls.jsonl)
            try:
                _add_stats(client.stats, await actor.stats.remote())
            except Exception as e:
                log.warning("ray_worker_stats_lost", error=describe_failure(e)[:200])
            ray.kill(actor)
        if started_here:
            ray.shutdown()


# -- a vector of envs on Ray --------------------------------------------------------------------


class _EnvActor:
    """One env in a Ray actor."""

    def __init__(self, make: Callable[[], gym.Env[Any, Any]]) -> None:
        self.env = make()

    def spaces(self) -> tuple[gym.Space[Any], gym.Space[Any]]:
        return self.env.observation_space, self.env.action_space

    def reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, float(reward), bool(terminated), bool(truncated), info

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        self.env.close()


class RayVectorEnv(VectorEnv[Any, Any, Any]):
    """Gymnasium's vector API over envs that live in Ray actors (one env per actor).

    `env_fns` build the envs inside the actors (as for SyncVectorEnv: picklable callables);
    reset/step return batched observations (each text field a tuple of strings), rewards,
    terminated, truncated and vector infos. Autoreset is Gymnasium's NEXT_STEP: the step after an
    env ended resets it (reward 0, not terminated) and the action given for it is ignored.
    The actors step in parallel; a call blocks until every env has answered.
    """

    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env[Any, Any]]], *, num_cpus_per_env: float = 0.25,
                 address: str | None = None) -> None:
        if not env_fns:
            raise ValueError("RayVectorEnv needs at least one env")
        ray = import_ray()
        self._ray = ray
        ensure_ray(address)
        cls = ray.remote(num_cpus=num_cpus_per_env)(_EnvActor)
        self.actors = [cls.remote(fn) for fn in env_fns]
        self.num_envs = len(self.actors)
        self.single_observation_space, self.single_action_space = ray.get(self.actors[0].spaces.remote())
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._autoreset = np.zeros(self.num_envs, dtype=np.bool_)
        self._closed = False

    def _batch(self, observations: list[Any]) -> Any:
        out: Any = create_empty_array(self.single_observation_space, n=self.num_envs, fn=np.zeros)
        return concatenate(self.single_observation_space, observations, out)

    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        seeds: list[int | None] = ([None] * self.num_envs if seed is None else
                                   [seed + i for i in range(self.num_envs)] if isinstance(seed, int) else list(seed))
        if len(seeds) != self.num_envs:
            raise ValueError(f"reset got {len(seeds)} seeds for {self.num_envs} envs")
        results = self._ray.get([a.reset.remote(s, options) for a, s in zip(self.actors, seeds, strict=True)])
        self._autoreset[:] = False
        infos: dict[str, Any] = {}
        for i, (_, info) in enumerate(results):
            infos = self._add_info(infos, info, i)
        return self._batch([obs for obs, _ in results]), infos

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        actions = list(actions)
        if len(actions) != self.num_envs:
            raise ValueError(f"step got {len(actions)} actions for {self.num_envs} envs")
        refs = [a.reset.remote(None, None) if self._autoreset[i] else a.step.remote(actions[i])
                for i, a in enumerate(self.actors)]
        results = self._ray.get(refs)
        observations: list[Any] = []
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminated = np.zeros(self.num_envs, dtype=np.bool_)
        truncated = np.zeros(self.num_envs, dtype=np.bool_)
        infos: dict[str, Any] = {}
        for i, result in enumerate(results):
            if self._autoreset[i]:
                obs, info = result
            else:
                obs, rewards[i], terminated[i], truncated[i], info = result
            observations.append(obs)
            infos = self._add_info(infos, info, i)
        self._autoreset = terminated | truncated
        return self._batch(observations), rewards, terminated, truncated, infos

    def worker_pids(self) -> list[int]:
        return list(self._ray.get([a.pid.remote() for a in self.actors]))

    def close_extras(self, **kwargs: Any) -> None:
        if self._closed:
            return
        self._closed = True
        for a in self.actors:
            self._ray.kill(a)
