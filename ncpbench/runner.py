"""Batch runs: many episodes, concurrently, into a run folder that survives being killed.

Guarantees (docs/RELIABILITY.md lists the test behind each):
- one runner per folder: an exclusive lock (flock on `.lock`, released by the OS even on SIGKILL);
- a finished episode is one line appended to episodes.jsonl (written whole, flushed, fsynced);
  a torn last line from a kill is cut off at the next start;
- an in-flight episode has a checkpoint, rewritten atomically (temp file, fsync, rename) after
  every committed turn; a rerun continues it from its last committed turn, and removes the temp
  file of a write a kill cut short;
- a record is one line whatever a reader splits on (U+2028, U+2029, U+0085 are escaped too);
- an episode is finished when its line is in episodes.jsonl: a rerun skips it, and deletes a
  checkpoint left behind by a kill between the append and the delete, so nothing is duplicated;
- a failure in one episode becomes an ERROR record for that episode and never stops the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from pydantic import BaseModel, ConfigDict

from ncpbench.dataset import Dataset, load
from ncpbench.env import NarrativeEnv
from ncpbench.episode import EpisodeInterrupted, describe_failure, play_episode
from ncpbench.jsonl import iter_jsonl, jsonl_line
from ncpbench.logs import get_logger
from ncpbench.models.cache import ResponseCache
from ncpbench.models.calllog import CallLog, call_context
from ncpbench.models.client import ModelClient
from ncpbench.models.config import RunConfig
from ncpbench.pricing import Price, as_price, cached_share, total_cost
from ncpbench.protocols import Narrator
from ncpbench.record import EpisodeRecord
from ncpbench.roles import build_roles
from ncpbench.state import Outcome
from ncpbench.verdict import Usage

log = get_logger("ncpbench.runner")


class RunError(RuntimeError):
    """A run folder that cannot be used as asked (locked, or holding a different run)."""


class BatchSettings(BaseModel):
    """What a batch covers; a rerun into the same folder must ask for the same thing."""

    model_config = ConfigDict(frozen=True)

    envs: list[str]
    """Environment keys, in run order."""
    replicates: int = 1
    max_turns: int = 100
    seed: int = 0
    shard: tuple[int, int] | None = None
    """(i, n): this runner takes the episodes whose index % n == i."""
    dataset: str | None = None


@dataclass(frozen=True)
class EpisodeTask:
    episode_id: str
    env_id: str
    replicate: int
    seed: int


@dataclass
class Budget:
    max_total_tokens: int | None = None
    max_cost_usd: float | None = None
    prices: dict[str, Price] = field(default_factory=dict)
    """model string -> USD per 1M prompt, completion and (optionally) cached prompt tokens."""

    def cost(self, usage_by_model: dict[str, Usage]) -> float | None:
        return total_cost(usage_by_model, self.prices)


@dataclass
class Progress:
    """Live counters for the progress display and the run record."""

    total: int = 0
    done: int = 0
    skipped: int = 0
    alive: int = 0
    conflicts: int = 0
    errors: int = 0
    turns: int = 0
    tokens: int = 0
    by_model: dict[str, Usage] = field(default_factory=dict)
    stopped_by_budget: bool = False

    def add_usage(self, model: str, usage: Usage) -> None:
        self.by_model[model] = self.by_model.get(model, Usage()).add(usage)
        self.tokens += usage.prompt_tokens + usage.completion_tokens

    def cached_share(self) -> float | None:
        total = Usage()
        for u in self.by_model.values():
            total = total.add(u)
        return cached_share(total)


@dataclass
class BatchResult:
    out: Path
    progress: Progress
    records: list[EpisodeRecord]
    """Records finished in this invocation."""
    call_stats: dict[str, Any]
    client_cpu_s: float = 0.0
    """CPU time spent while model calls were in flight (exact only at concurrency 1)."""


# -- files ----------------------------------------------------------------------------------------


def atomic_write(path: Path, text: str) -> None:
    """Write a whole file or leave the old one: temp file, fsync, rename, fsync the folder."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


_TEMP = re.compile(r"^\..+\.\d+\.tmp$")


def remove_stale_temp_files(folder: Path) -> None:
    """Delete the temp files of atomic writes that a kill interrupted (`.NAME.PID.tmp`).

    They are never read (the rename never happened); call only while holding the folder's lock,
    when no other writer can be mid-write.
    """
    for d in (folder, folder / "checkpoints"):
        if not d.is_dir():
            continue
        for tmp in d.iterdir():
            if _TEMP.match(tmp.name):
                tmp.unlink(missing_ok=True)
                log.warning("stale_temp_file_removed", file=str(tmp))


def repair_jsonl(path: Path) -> None:
    """Cut a torn final line (a kill mid-append) so the next append starts on a fresh line."""
    if not path.exists():
        return
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    keep = data[: data.rfind(b"\n") + 1]
    with path.open("r+b") as f:
        f.truncate(len(keep))
        f.flush()
        os.fsync(f.fileno())
    log.warning("torn_line_removed", file=str(path), bytes=len(data) - len(keep))


def read_records(path: Path) -> dict[str, dict[str, Any]]:
    """episode_id -> record data; the last line per id wins; unparsable lines are skipped."""
    return {d["episode_id"]: d for d in iter_jsonl(path) if d.get("episode_id")}


def append_line(handle: TextIO, data: dict[str, Any]) -> None:
    handle.write(jsonl_line(data))
    handle.flush()
    os.fsync(handle.fileno())


@contextlib.contextmanager
def run_lock(folder: Path) -> Iterator[None]:
    """Exclusive use of a run folder; a second runner gets a clear refusal, not interleaved lines."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ".lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EACCES):
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                raise RunError(f"{folder} is in use by another ncpbench run (pid {holder}); "
                               "wait for it to finish or choose another --out") from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing releases the flock


# -- planning ---------------------------------------------------------------------------------------


def select_envs(dataset: Dataset, selector: str | list[str]) -> list[str]:
    """`all`, `SLUG,SLUG`, or `genre:GENRE` (case-insensitive)."""
    if isinstance(selector, list):
        keys = selector
    elif selector == "all":
        keys = list(dataset.specs)
    elif selector.startswith("genre:"):
        genre = selector.split(":", 1)[1].strip().lower()
        keys = [k for k, s in dataset.specs.items() if genre in {g.lower() for g in s.meta.genres}]
        if not keys:
            raise KeyError(f"no environment has genre {genre!r}")
    else:
        keys = [k.strip() for k in selector.split(",") if k.strip()]
    for k in keys:
        dataset[k]  # raises a clear KeyError for unknown slugs
    return keys


def episode_seed(base: int, env_id: str, replicate: int) -> int:
    digest = hashlib.sha256(f"{base}|{env_id}|{replicate}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def plan(settings: BatchSettings) -> list[EpisodeTask]:
    tasks = [EpisodeTask(f"{env}#{r}", env, r, episode_seed(settings.seed, env, r))
             for env in settings.envs for r in range(settings.replicates)]
    if settings.shard:
        i, n = settings.shard
        tasks = [t for k, t in enumerate(tasks) if k % n == i]
    return tasks


def prompt_hashes() -> dict[str, str]:
    """Hashes of every prompt text, so a result names the exact prompts that produced it."""
    from ncpbench.agents import prompts as agent_prompts
    from ncpbench.auditors import prompts as auditor_prompts

    out = {}
    for module in (agent_prompts, auditor_prompts):
        texts = {k: v for k, v in vars(module).items() if k.isupper() and isinstance(v, (str, dict))}
        out[module.__name__] = hashlib.sha256(json.dumps(texts, sort_keys=True).encode()).hexdigest()[:16]
    return out


TRANSPORT_FIELDS = ("base_url", "api_key_env", "timeout_s", "max_retries", "concurrency")


def run_identity(config: dict[str, Any]) -> dict[str, Any]:
    """What makes two runs the same run: models and sampling, not where the endpoint lives."""
    out = dict(config)
    for role in ("narrator", "player", "auditor"):
        if isinstance(out.get(role), dict):
            out[role] = {k: v for k, v in out[role].items() if k not in TRANSPORT_FIELDS}
    out.pop("cache_path", None)
    return out


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# -- the runner -------------------------------------------------------------------------------------


NarratorFactory = Callable[[EpisodeTask], Narrator]


class BatchRunner:
    def __init__(self, out: Path, config: RunConfig, settings: BatchSettings, *, concurrency: int = 8,
                 budget: Budget | None = None, retry_errors: bool = False, narrator: NarratorFactory | None = None,
                 on_change: Callable[[Progress], None] | None = None, dataset: Dataset | None = None,
                 turn_timeout_s: float | None = 600.0) -> None:
        self.out = out
        self.config = config
        self.settings = settings
        self.concurrency = concurrency
        self.budget = budget or Budget()
        self.retry_errors = retry_errors
        self.narrator_factory = narrator
        self.on_change = on_change
        self.turn_timeout_s = turn_timeout_s
        self.dataset = dataset or load(settings.dataset)
        self.progress = Progress()
        self.records: list[EpisodeRecord] = []
        self.checkpoints = out / "checkpoints"
        self.episodes_path = out / "episodes.jsonl"

    # run.json

    def _run_json(self) -> dict[str, Any]:
        path = self.out / "run.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def _check_same_run(self, existing: dict[str, Any]) -> None:
        if not existing:
            return
        mine = {"batch": self.settings.model_dump(mode="json"), "config": run_identity(self.config.public())}
        theirs = {"batch": existing.get("batch"), "config": run_identity(existing.get("config") or {})}
        if json.dumps(mine, sort_keys=True) != json.dumps(theirs, sort_keys=True):
            raise RunError(f"{self.out} holds a different run (other models, settings or environments); "
                           "rerun with the same options to resume, or choose another --out")

    def _write_run_json(self, status: str, started: str, stats: dict[str, Any] | None = None) -> None:
        from ncpbench import __version__

        existing = self._run_json()
        sessions = existing.get("sessions", [])
        session = {"started_at": started, "ended_at": None if status == "running" else _now(),
                   "status": status, "call_stats": stats or {}, "finished_episodes": len(self.records)}
        if sessions and sessions[-1].get("started_at") == started:
            sessions[-1] = session
        else:
            sessions.append(session)
        specs = {k: self.dataset[k] for k in self.settings.envs}
        data = {
            "name": self.out.name,
            "ncpbench_version": __version__,
            "config": self.config.public(),
            "batch": self.settings.model_dump(mode="json"),
            "dataset_hash": Dataset(root=self.dataset.root, specs=specs).digest(),
            "prompt_hashes": prompt_hashes(),
            "started_at": existing.get("started_at", started),
            "ended_at": None if status == "running" else _now(),
            "status": status,
            "episodes_planned": len(plan(self.settings)),
            "sessions": sessions,
        }
        atomic_write(self.out / "run.json", json.dumps(data, indent=2))

    # checkpoints

    def _checkpoint_path(self, task: EpisodeTask) -> Path:
        safe = task.episode_id.replace("#", "__").replace("/", "_")
        return self.checkpoints / f"{safe}.json"

    def _write_checkpoint(self, task: EpisodeTask, env: NarrativeEnv) -> None:
        data = {"episode_id": task.episode_id, "env_id": task.env_id, "replicate": task.replicate, "seed": task.seed,
                "written_at": _now(), "snapshot": env.snapshot()}
        atomic_write(self._checkpoint_path(task), json.dumps(data, ensure_ascii=False))

    def _read_checkpoint(self, task: EpisodeTask) -> dict[str, Any] | None:
        path = self._checkpoint_path(task)
        if not path.exists():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return data["snapshot"]  # type: ignore[no-any-return]
        except (json.JSONDecodeError, KeyError):
            log.warning("bad_checkpoint_ignored", file=str(path))
            return None

    # main loop

    async def run(self) -> BatchResult:
        self.out.mkdir(parents=True, exist_ok=True)
        with run_lock(self.out):
            self._check_same_run(self._run_json())
            self.checkpoints.mkdir(exist_ok=True)
            remove_stale_temp_files(self.out)
            repair_jsonl(self.episodes_path)
            done = read_records(self.episodes_path)
            if self.retry_errors:
                kept = {k: v for k, v in done.items() if v.get("outcome") != Outcome.ERROR.value}
                if len(kept) != len(done):
                    atomic_write(self.episodes_path, "".join(jsonl_line(v) for v in kept.values()))
                done = kept
            tasks = plan(self.settings)
            for t in tasks:  # a kill between append and checkpoint delete leaves a stale checkpoint
                if t.episode_id in done:
                    self._checkpoint_path(t).unlink(missing_ok=True)
            pending = [t for t in tasks if t.episode_id not in done]
            self.progress.total = len(tasks)
            self.progress.skipped = self.progress.done = len(tasks) - len(pending)
            for rec in done.values():
                if rec.get("outcome") == Outcome.CONFLICT.value:
                    self.progress.conflicts += 1
                if rec.get("outcome") == Outcome.ERROR.value:
                    self.progress.errors += 1
            started = _now()
            self._write_run_json("running", started)
            cache = ResponseCache(self.config.cache_path) if self.config.cache_path else None
            # calls.jsonl: every model call of the run, appended and fsynced (a resumed run adds lines).
            calls = CallLog(self.out / "calls.jsonl")
            client = ModelClient(cache=cache, call_sink=calls)
            status = "interrupted"
            try:
                with self.episodes_path.open("a", encoding="utf-8") as sink:
                    await self._run_all(pending, client, sink)
                status = "stopped_by_budget" if self.progress.stopped_by_budget else (
                    "complete" if self.progress.done == self.progress.total else "partial")
            finally:
                stats = client.stats.as_dict()
                stats["cost_usd"] = total_cost(client.stats.usage_by_model, self.budget.prices)
                client_cpu = client.stats.client_cpu_s
                await client.aclose()
                calls.close()
                if cache:
                    cache.close()
                self._write_run_json(status, started, stats)
        return BatchResult(self.out, self.progress, self.records, stats, client_cpu)

    async def _run_all(self, pending: list[EpisodeTask], client: ModelClient, sink: TextIO) -> None:
        gate = asyncio.Semaphore(self.concurrency)

        async def one(task: EpisodeTask) -> None:
            async with gate:
                if self._over_budget():
                    self.progress.stopped_by_budget = True
                    return
                await self._episode(task, client, sink)

        await asyncio.gather(*(one(t) for t in pending))

    def _over_budget(self) -> bool:
        b = self.budget
        if b.max_total_tokens is not None and self.progress.tokens >= b.max_total_tokens:
            return True
        cost = b.cost(self.progress.by_model)
        return b.max_cost_usd is not None and cost is not None and cost >= b.max_cost_usd

    def _model_of(self, role: str) -> str:
        return self.config.role(role).model

    def _count_turn(self, env: NarrativeEnv) -> None:
        turn = env.history[-1]
        for role, usage in turn.usage.items():
            self.progress.add_usage(self._model_of(role), usage)
        self.progress.turns += 1
        if self.on_change:
            self.on_change(self.progress)

    async def _episode(self, task: EpisodeTask, client: ModelClient, sink: TextIO) -> None:
        self.progress.alive += 1
        if self.on_change:
            self.on_change(self.progress)
        env: NarrativeEnv | None = None
        try:
            spec = self.dataset[task.env_id]
            narrator, player, auditor = build_roles(self.config, client, salt=task.episode_id)
            if self.narrator_factory is not None:
                narrator = self.narrator_factory(task)
            env = NarrativeEnv(spec, player=player, auditor=auditor, max_turns=self.settings.max_turns)
            resume = self._read_checkpoint(task)

            def on_step(e: NarrativeEnv, info: dict[str, Any]) -> None:
                self._count_turn(e)
                if not e.state.done:
                    self._write_checkpoint(task, e)

            with call_context(episode=task.episode_id):  # labels this episode's lines of calls.jsonl
                record: EpisodeRecord | None = await play_episode(
                    env, narrator, seed=task.seed, replicate=task.replicate, config=self.config.public(),
                    on_step=on_step, resume=resume, stop=self._over_budget, turn_timeout_s=self.turn_timeout_s)
        except EpisodeInterrupted:
            record = None
        except Exception as e:  # building the episode failed: still an ERROR record, never a crash
            if env is None:
                raise RunError(describe_failure(e)) from e
            env.fail(describe_failure(e))
            record = env.record(replicate=task.replicate, config=self.config.public())
        finally:
            self.progress.alive -= 1
        if record is None:  # stopped between turns by the budget: the checkpoint stays for a rerun
            self.progress.stopped_by_budget = True
            return
        append_line(sink, record.model_dump(mode="json"))
        self._checkpoint_path(task).unlink(missing_ok=True)
        self.records.append(record)
        self.progress.done += 1
        self.progress.conflicts += record.outcome is Outcome.CONFLICT
        self.progress.errors += record.outcome is Outcome.ERROR
        if self.on_change:
            self.on_change(self.progress)


async def run_batch(
    out: str | Path,
    config: RunConfig | None = None,
    *,
    envs: str | list[str] = "all",
    replicates: int = 1,
    max_turns: int = 100,
    concurrency: int = 8,
    seed: int = 0,
    shard: tuple[int, int] | None = None,
    dataset: str | None = None,
    retry_errors: bool = False,
    max_total_tokens: int | None = None,
    max_cost_usd: float | None = None,
    prices: dict[str, Price] | dict[str, tuple[float, ...]] | None = None,
    narrator: NarratorFactory | None = None,
    on_change: Callable[[Progress], None] | None = None,
    turn_timeout_s: float | None = 600.0,
) -> BatchResult:
    """Run (or resume) a batch into `out`. Rerunning the same call continues where it stopped."""
    ds = load(dataset)
    settings = BatchSettings(envs=select_envs(ds, envs), replicates=replicates, max_turns=max_turns, seed=seed,
                             shard=shard, dataset=dataset)
    runner = BatchRunner(Path(out), config or RunConfig(), settings, concurrency=concurrency,
                         budget=Budget(max_total_tokens, max_cost_usd, {m: as_price(p) for m, p in (prices or {}).items()}),
                         retry_errors=retry_errors,
                         narrator=narrator, on_change=on_change, dataset=ds, turn_timeout_s=turn_timeout_s)
    started = time.perf_counter()
    result = await runner.run()
    log.info("batch_done", out=str(out), seconds=round(time.perf_counter() - started, 1),
             finished=len(result.records))
    return result


def merge_runs(shards: list[Path], out: Path) -> dict[str, Any]:
    """Join shard folders of one run into `out`: same config and batch, episodes deduplicated."""
    metas = []
    for s in shards:
        path = s / "run.json"
        if not path.exists():
            raise RunError(f"{s} has no run.json: not a run folder")
        metas.append(json.loads(path.read_text()))
    base = metas[0]

    def key(m: dict[str, Any]) -> str:
        batch = dict(m.get("batch") or {})
        batch.pop("shard", None)
        return json.dumps({"batch": batch, "config": run_identity(m.get("config") or {})}, sort_keys=True)

    for s, m in zip(shards[1:], metas[1:], strict=True):
        if key(m) != key(base):
            raise RunError(f"{s} is not a shard of the same run as {shards[0]} (different config or batch)")
    records: dict[str, dict[str, Any]] = {}
    for s in shards:
        records.update(read_records(s / "episodes.jsonl"))
    out.mkdir(parents=True, exist_ok=True)
    with run_lock(out):
        batch = dict(base["batch"])
        batch["shard"] = None
        planned = len(plan(BatchSettings(**batch)))
        merged = {**base, "batch": batch, "name": out.name, "merged_from": [str(s) for s in shards],
                  "status": "complete" if len(records) == planned else "partial", "episodes_planned": planned,
                  "sessions": [sess for m in metas for sess in m.get("sessions", [])]}
        atomic_write(out / "episodes.jsonl", "".join(jsonl_line(r) for r in records.values()))
        atomic_write(out / "run.json", json.dumps(merged, indent=2))
    return merged
