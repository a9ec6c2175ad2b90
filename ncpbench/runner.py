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
- a failure in one episode becomes an ERROR record for that episode and never stops the others,
  except that N identical infrastructure errors in a row (a revoked key, a dead server) trip the
  circuit breaker: the batch stops with one message, and those episodes stay pending for a rerun;
- episodes are planned lazily: memory does not grow with --replicates;
- the run's identity (package version, protocol, models and sampling, batch settings with the turn
  limit, dataset hash, hashes of the rendered prompts and stage schemas) is pinned in run.json and in
  every record and checkpoint, so a folder refuses a different setup even when run.json was deleted,
  and only records carrying it count as done (a line another setup wrote never stands in for one);
- the preflight (roles and keys, one probe per endpoint) runs before the folder exists;
- a full disk or an unwritable file stops the run (RunIOError) and leaves it resumable.
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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from pydantic import BaseModel, ConfigDict, Field

from ncpbench.dataset import Dataset, load
from ncpbench.env import NarrativeEnv
from ncpbench.episode import (
    DEFAULT_TURN_TIMEOUT_S,
    EpisodeInterrupted,
    describe_failure,
    play_episode,
    restorable,
)
from ncpbench.jsonl import episode_line, fsync_dir, iter_jsonl, jsonl_line
from ncpbench.jsonl import repair_jsonl as _repair_jsonl
from ncpbench.logs import get_logger
from ncpbench.models.cache import ResponseCache
from ncpbench.models.calllog import CallLog, call_context
from ncpbench.models.client import ModelClient
from ncpbench.models.config import ConfigError, RoleConfig, RunConfig, did_you_mean
from ncpbench.preflight import check_roles, probe_endpoints
from ncpbench.pricing import Price, as_price, cached_share, total_cost
from ncpbench.protocol import get_protocol
from ncpbench.protocols import Narrator, Player
from ncpbench.record import EpisodeRecord
from ncpbench.roles import build_roles, plugin_refs
from ncpbench.state import Outcome
from ncpbench.verdict import Usage

log = get_logger("ncpbench.runner")


class RunError(RuntimeError):
    """A run folder that cannot be used as asked (locked, or holding a different run)."""


class RunIOError(RuntimeError):
    """The run folder cannot be written (disk full, permission, read-only); the run is resumable."""


IO_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.EFBIG})
"""Errors of the run folder itself: they stop the run instead of becoming ERROR records."""


def io_failure(path: Path, e: OSError) -> RunIOError:
    what = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
            errno.EROFS: "the file system is read-only", errno.EFBIG: "a file is too large"}.get(
        e.errno or 0, "permission denied")
    return RunIOError(f"cannot write to {path}: {what} ({os.strerror(e.errno or 0)}); free space or fix the "
                      "permissions, then rerun the same command to resume")


class BatchSettings(BaseModel):
    """What a batch covers; a rerun into the same folder must ask for the same thing."""

    model_config = ConfigDict(frozen=True)

    envs: list[str]
    """Environment keys, in run order."""
    replicates: int = Field(default=1, ge=1)
    max_turns: int = Field(default=100, ge=1)
    seed: int = 0
    shard: tuple[int, int] | None = None
    """(i, n): this runner takes the episodes whose index % n == i."""
    dataset: str | None = None
    turn_timeout_s: float | None = Field(default=DEFAULT_TURN_TIMEOUT_S, gt=0)
    """Wall-clock limit of one turn (None: no limit). It decides which episodes end as ERROR
    (TurnTimeout), so a session with another limit is another run."""


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
    stopped_by_breaker: str | None = None
    """The repeated infrastructure error that tripped the circuit breaker, if it did."""

    def add_usage(self, model: str, usage: Usage) -> None:
        self.by_model[model] = self.by_model.get(model, Usage()).add(usage)
        self.tokens += usage.prompt_tokens + usage.completion_tokens

    def cached_share(self) -> float | None:
        total = Usage()
        for u in self.by_model.values():
            total = total.add(u)
        return cached_share(total)


@dataclass(repr=False)
class BatchResult:
    out: Path
    progress: Progress
    records: list[EpisodeRecord]
    """Records finished in this invocation."""
    call_stats: dict[str, Any]
    client_cpu_s: float = 0.0
    """CPU time spent while model calls were in flight (exact only at concurrency 1)."""

    def __repr__(self) -> str:
        # A summary: asyncio.run reprs the finished main task (and so its result) when it restores
        # the SIGINT handler, and the full repr of every record cost ~1 s at the end of a batch.
        return f"BatchResult(out={str(self.out)!r}, records={len(self.records)}, calls={self.call_stats.get('calls')})"


# -- files ----------------------------------------------------------------------------------------


def atomic_write(path: Path, text: str) -> None:
    """Write a whole file or leave the old one: temp file, fsync, rename, fsync the folder."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


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
    """Move torn and damaged lines to `episodes.jsonl.quarantine` (see ncpbench.jsonl), with a warning."""
    _repair_jsonl(path, accept=episode_line)


def read_records(path: Path) -> dict[str, dict[str, Any]]:
    """episode_id -> record data; the last line per id wins; lines the report would skip are skipped."""
    return {d["episode_id"]: d for d in iter_jsonl(path, accept=episode_line)}


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


class UnknownEnvError(ConfigError, KeyError):
    """An environment slug or genre that the dataset does not have (a KeyError, as the dataset raises)."""

    def __str__(self) -> str:
        return f"{self.what}: {self.fix}"


def unknown_env(slug: str, known: list[str]) -> UnknownEnvError:
    return UnknownEnvError(f"no environment {slug!r}{did_you_mean(slug, known)}",
                           "see `ncpbench list` for the slugs, or --envs all")


def select_envs(dataset: Dataset, selector: str | list[str]) -> list[str]:
    """`all`, `SLUG,SLUG`, or `genre:GENRE` (case-insensitive); unknown names get a did-you-mean."""
    if isinstance(selector, list):
        keys = selector
    elif selector.strip() == "all":
        keys = list(dataset.specs)
    elif selector.startswith("genre:"):
        genre = selector.split(":", 1)[1].strip().lower()
        keys = [k for k, s in dataset.specs.items() if genre in {g.lower() for g in s.meta.genres}]
        if not keys:
            genres = sorted({g.lower() for s in dataset.specs.values() for g in s.meta.genres})
            raise UnknownEnvError(f"no environment has genre {genre!r}{did_you_mean(genre, genres)}",
                                  f"genres: {', '.join(genres)}")
    else:
        keys = [k.strip() for k in selector.split(",") if k.strip()]
    if not keys:
        raise UnknownEnvError(f"--envs {selector!r} names no environment", "give all, SLUG,SLUG or genre:GENRE")
    for k in keys:
        if k not in dataset.specs:
            raise unknown_env(k, list(dataset.specs))
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise UnknownEnvError(f"--envs names {dup!r} twice", "list each environment once (use --replicates for more)")
    return keys


def episode_seed(base: int, env_id: str, replicate: int) -> int:
    digest = hashlib.sha256(f"{base}|{env_id}|{replicate}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def plan(settings: BatchSettings) -> Iterator[EpisodeTask]:
    """The episodes of a batch, lazily (a billion replicates cost no memory), in run order."""
    i, n = settings.shard or (0, 1)
    k = 0
    for env in settings.envs:
        for r in range(settings.replicates):
            if k % n == i:
                yield EpisodeTask(f"{env}#{r}", env, r, episode_seed(settings.seed, env, r))
            k += 1


def planned_count(settings: BatchSettings) -> int:
    """How many episodes `plan` yields, without iterating it."""
    total = len(settings.envs) * settings.replicates
    if not settings.shard:
        return total
    i, n = settings.shard
    return total // n + (1 if i < total % n else 0)


def is_planned(settings: BatchSettings, env_id: str, replicate: int, positions: dict[str, int]) -> bool:
    """Whether (env_id, replicate) is one of this batch's (and this shard's) episodes."""
    pos = positions.get(env_id)
    if pos is None or not 0 <= replicate < settings.replicates:
        return False
    i, n = settings.shard or (0, 1)
    return (pos * settings.replicates + replicate) % n == i


PROMPT_FIXTURE_ENV = "iron-man"
"""The bundled spec the fingerprint episode is played on (any fixed spec would do)."""


def _short(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


def prompt_hashes(config: RunConfig | None = None) -> dict[str, str]:
    """Hashes of the prompts and stage schemas exactly as they are sent, one per narrator, player, stage.

    A three-turn fingerprint episode on a fixed spec is played through the real roles (LLMNarrator,
    LLMPlayer, LLMAuditor) with a client that records every request instead of sending it and
    answers with the mock server's canned replies (a conflict is planted and overturned, so the
    double check runs too). Any change to a prompt text, a prompt function, the request layout or a
    stage schema therefore changes a hash, not only changes to module constants.
    """
    config = config or RunConfig()
    try:
        calls = asyncio.run(_fingerprint_calls(config)) if not _loop_running() else _in_thread(config)
    except Exception as e:  # a fingerprint must never stop a run; its failure is itself pinned
        log.warning("prompt_fingerprint_failed", error=describe_failure(e))
        return {"unrenderable": _short(describe_failure(e))}
    grouped: dict[str, list[Any]] = {}
    for kind, body in calls:
        grouped.setdefault(kind, []).append(body)
    return {kind: _short(bodies) for kind, bodies in sorted(grouped.items())}


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _in_thread(config: RunConfig) -> list[tuple[str, Any]]:
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(_fingerprint_calls(config))).result()


async def _fingerprint_calls(config: RunConfig) -> list[tuple[str, Any]]:
    from ncpbench.agents import LLMNarrator, LLMPlayer, ScriptedPlayer
    from ncpbench.auditors import LLMAuditor
    from ncpbench.dataset import get_spec
    from ncpbench.models.client import Completion
    from ncpbench.models.mock_server import MockConfig, answer_for
    from ncpbench.verdict import Usage

    mock = MockConfig(conflict_turns=frozenset({2}), overturn_turns=frozenset({2}))
    calls: list[tuple[str, Any]] = []

    class RecordingClient(ModelClient):
        async def chat(self, role: Any, messages: Any, *, response_format: dict[str, Any] | None = None,
                       salt: str = "") -> Completion:
            body = {"messages": list(messages), "response_format": response_format}
            who, text = answer_for(body, mock)
            if who == "auditor" and response_format:
                who = "auditor:" + str((response_format.get("json_schema") or {}).get("name", "stage"))
            calls.append((who, body))
            return Completion(text, Usage(calls=1))

    def fixed(role: Any) -> Any:  # schemas always in the body, whatever the run's structured mode
        return role.model_copy(update={"structured": "json_schema"})

    client = RecordingClient()
    narrator = LLMNarrator(client, fixed(config.narrator), salt="fingerprint")
    player: Any = (ScriptedPlayer() if config.player_mode == "scripted" else
                   LLMPlayer(client, fixed(config.player), mode=config.player_mode, salt="fingerprint"))
    auditor = LLMAuditor(client, fixed(config.auditor), salt="fingerprint")
    env = NarrativeEnv(get_spec(PROMPT_FIXTURE_ENV), player=player, auditor=auditor, max_turns=3,
                       protocol=config.audit_protocol())
    await play_episode(env, narrator, seed=0)
    if env.error:
        raise RuntimeError(env.error)
    return calls


SAMPLING_FIELDS = ("model", "temperature", "top_p", "max_tokens", "seed", "structured")
"""What of a role decides its answers (where the endpoint lives does not)."""


def batch_identity(config: RunConfig, settings: BatchSettings, dataset_hash: str,
                   prompts: dict[str, str] | None = None) -> dict[str, Any]:
    """Everything that makes two sessions the same run; resuming with any difference is refused."""
    from ncpbench import __version__

    roles = {r: {k: v for k, v in config.role(r).model_dump(mode="json").items() if k in SAMPLING_FIELDS}
             for r in config.active_roles()}
    return {
        "ncpbench_version": __version__,
        "protocol": {"name": config.protocol, "version": _protocol_version(config.protocol),
                     "label": config.audit_protocol().label},
        "player_mode": config.player_mode,
        "roles": roles,
        "plugins": plugin_refs(config),
        "mock_roles": config.mock_roles(),
        "batch": settings.model_dump(mode="json"),
        "dataset_hash": dataset_hash,
        "prompt_hashes": prompts if prompts is not None else prompt_hashes(config),
    }


def _protocol_version(name: str) -> int:
    """The protocol preset's version (part of the run identity: a changed rule set is another run)."""
    return get_protocol(name).version


def identity_hash(identity: dict[str, Any]) -> str:
    return _short(identity)


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out or {prefix: {}}
    return {prefix: data}


def identity_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """`field: old -> new` for every field that differs: what a person decides by first (protocol,
    roles, dataset), the prompt hashes that follow from them last."""
    a, b = _flatten(old), _flatten(new)
    out = []
    for key in sorted(set(a) | set(b), key=lambda k: (k.startswith("prompt_hashes"), k)):
        if a.get(key, "<absent>") != b.get(key, "<absent>"):
            out.append(f"{key}: {_show(a.get(key, '<absent>'))} -> {_show(b.get(key, '<absent>'))}")
    return out


def _show(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


TRANSPORT_FIELDS = ("base_url", "api_key_env", "timeout_s", "max_retries", "concurrency", "transport")


def run_identity(config: dict[str, Any]) -> dict[str, Any]:
    """What makes two runs the same run: models and sampling, not where the endpoint lives."""
    out = dict(config)
    for role in ("narrator", "player", "auditor"):
        if isinstance(out.get(role), dict):
            out[role] = {k: v for k, v in out[role].items() if k not in TRANSPORT_FIELDS}
    out.pop("cache_path", None)
    return out


def record_identity(data: dict[str, Any]) -> dict[str, Any] | None:
    """The run identity a record (or checkpoint data) was written under, or None (a play record, an old record)."""
    config = data.get("config")
    ident = config.get("run_identity") if isinstance(config, dict) else data.get("run_identity")
    return ident if isinstance(ident, dict) else None


def folder_identity(folder: Path, meta: dict[str, Any] | None = None) -> tuple[dict[str, Any] | None, str]:
    """The identity a run folder was started with and where it was found: run.json's (`meta`, its
    parsed content), else a record's, else a checkpoint's; (None, "") when nothing pins one."""
    if meta is not None and isinstance(meta.get("identity"), dict):
        return meta["identity"], "run.json"
    for data in iter_jsonl(folder / "episodes.jsonl", accept=episode_line):
        ident = record_identity(data)
        if ident is not None:
            return ident, "episodes.jsonl"
    checkpoints = folder / "checkpoints"
    if checkpoints.is_dir():
        for path in sorted(checkpoints.glob("*.json")):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                ident = record_identity(json.loads(path.read_text(encoding="utf-8")))
                if ident is not None:
                    return ident, f"checkpoints/{path.name}"
    return None, ""


def canonical(data: Any) -> Any:
    """`data` as it reads back from JSON (tuples become lists), so a live identity equals a recorded one."""
    return json.loads(json.dumps(data))


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# -- the runner -------------------------------------------------------------------------------------


NarratorFactory = Callable[[EpisodeTask], Narrator]
PlayerFactory = Callable[[EpisodeTask], Player]

EXECUTORS = ("local", "ray")
"""Where a batch's episodes are played: this process's event loop, or Ray worker actors."""

BREAKER_DEFAULT = 5
"""Identical infrastructure errors in a row that stop a batch (`--circuit-breaker N`; 0 turns it off)."""
_BREAKER_KINDS = ("ModelCallError", "MalformedResponse")
"""Errors of the endpoint itself: the same one again and again means it is down or refusing us."""


def _breaker_signature(record: EpisodeRecord) -> str | None:
    if record.outcome is not Outcome.ERROR or not record.error:
        return None
    return record.error if record.error.split(":", 1)[0] in _BREAKER_KINDS else None


class BatchRunner:
    def __init__(self, out: Path, config: RunConfig, settings: BatchSettings, *, concurrency: int = 8,
                 budget: Budget | None = None, retry_errors: bool = False, narrator: NarratorFactory | None = None,
                 on_change: Callable[[Progress], None] | None = None, dataset: Dataset | None = None,
                 breaker: int = BREAKER_DEFAULT,
                 player: PlayerFactory | None = None, executor: str = "local", ray_address: str | None = None,
                 ray_workers: int | None = None, probe: bool = True, run_meta: dict[str, Any] | None = None) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1 (0 would wait forever)")
        if executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
        if ray_workers is not None and ray_workers < 1:
            raise ValueError("ray_workers must be at least 1")
        self.out = out
        self.config = config
        self.settings = settings
        self.concurrency = concurrency
        self.budget = budget or Budget()
        self.retry_errors = retry_errors
        self.narrator_factory = narrator
        self.player_factory = player
        self.on_change = on_change
        self.turn_timeout_s = settings.turn_timeout_s  # from the settings: part of the identity
        self.breaker = breaker
        self.executor = executor
        self.ray_address = ray_address
        self.ray_workers = ray_workers
        self.probe = probe
        self.run_meta = dict(run_meta or {})
        self.dataset = dataset or load(settings.dataset)
        self.progress = Progress()
        self.records: list[EpisodeRecord] = []
        self.checkpoints = out / "checkpoints"
        self.episodes_path = out / "episodes.jsonl"
        specs = {k: self.dataset[k] for k in self.settings.envs}
        self.dataset_hash = Dataset(root=self.dataset.root, specs=specs).digest()
        self.identity = batch_identity(config, settings, self.dataset_hash)
        self.record_config = {**config.public(), "run_identity": self.identity}
        self._streak: list[tuple[EpisodeTask, EpisodeRecord]] = []
        self._io_error: RunIOError | None = None

    # run.json

    def _run_json(self) -> dict[str, Any]:
        path = self.out / "run.json"
        if not path.exists():
            return {}
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise RunError(f"{self.out}/run.json is not JSON; move it away and rerun (the records pin the run too)") from None
        return data if isinstance(data, dict) else {}

    def _check_same_run(self, existing: dict[str, Any]) -> bool:
        """Refuse a folder holding another run; True when the folder pins an identity (then only
        records carrying this run's identity count as done)."""
        theirs, source = folder_identity(self.out, existing)
        if theirs is not None:
            diffs = identity_differences(theirs, self.identity)
            if diffs:
                raise RunError(f"{self.out} holds a different run ({source}): " + "; ".join(diffs[:6])
                               + ("; ..." if len(diffs) > 6 else "")
                               + ". Rerun with the same setup to resume, or choose another --out")
            return True
        if not existing:
            return False
        # A folder written before identities were pinned: compare what it recorded.
        new_config = run_identity(self.config.public())
        old_config = run_identity(existing.get("config") or {})
        for added in ("mock_roles", "protocol"):  # fields such folders never had
            new_config.pop(added, None)
            old_config.pop(added, None)
        batch = self.settings.model_dump(mode="json")
        batch.pop("turn_timeout_s", None)  # not recorded then either
        mine = {"batch": batch, "config": new_config}
        old = {"batch": existing.get("batch"), "config": old_config}
        diffs = identity_differences(old, mine)
        if diffs:
            raise RunError(f"{self.out} holds a different run (run.json): " + "; ".join(diffs[:6])
                           + ". Rerun with the same setup to resume, or choose another --out")
        return False

    def _write_run_json(self, status: str, started: str, stats: dict[str, Any] | None = None) -> None:
        existing = self._run_json()
        sessions = existing.get("sessions", [])
        session = {"started_at": started, "ended_at": None if status == "running" else _now(),
                   "status": status, "call_stats": stats or {}, "finished_episodes": len(self.records)}
        if self.progress.stopped_by_breaker:
            session["breaker"] = self.progress.stopped_by_breaker
        if sessions and sessions[-1].get("started_at") == started:
            sessions[-1] = session
        else:
            sessions.append(session)
        data = {
            "name": self.out.name,
            "ncpbench_version": self.identity["ncpbench_version"],
            "protocol": self.identity["protocol"],
            "config": self.config.public(),
            "mock_roles": self.config.mock_roles(),
            "batch": self.settings.model_dump(mode="json"),
            "dataset_hash": self.dataset_hash,
            "prompt_hashes": self.identity["prompt_hashes"],
            "identity": self.identity,
            "identity_hash": identity_hash(self.identity),
            "started_at": existing.get("started_at", started),
            "ended_at": None if status == "running" else _now(),
            "status": status,
            "episodes_planned": planned_count(self.settings),
            "sessions": sessions,
        }
        # Written with the first run.json, before any episode: an interrupted rescore still says what it is.
        data.update({k: v for k, v in self.run_meta.items() if k not in data})
        atomic_write(self.out / "run.json", json.dumps(data, indent=2))

    # checkpoints

    def _checkpoint_path(self, task: EpisodeTask) -> Path:
        return self._checkpoint_path_of(task.episode_id)

    def _checkpoint_path_of(self, episode_id: str) -> Path:
        safe = episode_id.replace("#", "__").replace("/", "_")
        return self.checkpoints / f"{safe}.json"

    def _write_snapshot(self, task: EpisodeTask, snapshot: dict[str, Any]) -> None:
        data = {"episode_id": task.episode_id, "env_id": task.env_id, "replicate": task.replicate, "seed": task.seed,
                "written_at": _now(), "run_identity": self.identity, "snapshot": snapshot}
        atomic_write(self._checkpoint_path(task), json.dumps(data, ensure_ascii=False))

    def _read_checkpoint(self, task: EpisodeTask, env: NarrativeEnv) -> dict[str, Any] | None:
        """The snapshot to resume from, or None; a checkpoint of the wrong shape is ignored with a warning."""
        return restorable(env, task.seed, self.stored_snapshot(task), file=str(self._checkpoint_path(task)))

    # the executor interface: what the local executor and ncpbench.executors.ray call

    def stored_snapshot(self, task: EpisodeTask) -> dict[str, Any] | None:
        """The snapshot `task`'s checkpoint holds, or None. Only the JSON is checked here (a bad file is
        ignored with a warning); the env that restores it checks its shape."""
        path = self._checkpoint_path(task)
        if not path.exists():
            return None
        try:
            snapshot = json.loads(path.read_text(encoding="utf-8"))["snapshot"]
            if not isinstance(snapshot, dict):
                raise TypeError(f"the snapshot is a {type(snapshot).__name__}, not an object")
            return snapshot
        except Exception as e:  # not JSON, no snapshot, unreadable: the episode restarts
            log.warning("bad_checkpoint_ignored", file=str(path), error=describe_failure(e)[:200])
            return None

    def on_committed_turn(self, task: EpisodeTask, usage_by_role: dict[str, Usage],
                          snapshot: dict[str, Any] | None) -> None:
        """A turn of `task` committed: count its usage and checkpoint `snapshot` (None once the episode
        is over). A folder that cannot be written stops the run between turns, never an ERROR record."""
        for role, usage in usage_by_role.items():
            self.progress.add_usage(self._model_of(role), usage)
        self.progress.turns += 1
        if self.on_change:
            self.on_change(self.progress)
        if snapshot is None or self._io_error is not None:
            return
        try:
            self._write_snapshot(task, snapshot)
        except OSError as err:
            self.fail_io(self._checkpoint_path(task), err)

    def should_stop(self) -> bool:
        """Start no more work and stop episodes between turns: the folder failed, the breaker tripped,
        or the budget is spent (then marked `stopped_by_budget`)."""
        if self._over_budget():
            self.progress.stopped_by_budget = True
            return True
        return self._io_error is not None or self.progress.stopped_by_breaker is not None

    def fail_io(self, path: Path, err: OSError) -> None:
        """Stop the run for an error of the folder itself (IO_ERRNOS: the first one is reported);
        any other OSError is not the folder's and is raised again."""
        if err.errno not in IO_ERRNOS:
            raise err
        if self._io_error is None:
            self._io_error = io_failure(path, err)

    def settle(self, task: EpisodeTask, record: EpisodeRecord | None, sink: TextIO) -> None:
        """What becomes of a played episode (`record`, or None when it stopped between turns): kept
        pending, held by the circuit breaker, or committed to episodes.jsonl."""
        if record is None:  # stopped between turns (budget, breaker, disk): the checkpoint stays for a rerun
            if self._over_budget():
                self.progress.stopped_by_budget = True
            return
        if self._io_error is not None and record.outcome is Outcome.ERROR:
            return  # the failure may be the disk's; the checkpoint stays and a rerun retries it
        signature = _breaker_signature(record)
        if self.breaker > 0 and signature is not None:
            if self._streak and _breaker_signature(self._streak[0][1]) != signature:
                self._flush_streak(sink)
            if self.progress.stopped_by_breaker:
                return  # more of the same after the trip: left pending with the others
            # Hold the record: if this error keeps repeating it is the endpoint, not the episode,
            # and the held episodes stay pending instead of becoming N identical ERROR records.
            self._streak.append((task, record))
            if len(self._streak) >= self.breaker:
                self.progress.stopped_by_breaker = signature
                log.error("circuit_breaker_tripped", error=signature, episodes=len(self._streak))
                self._streak.clear()
            return
        self._flush_streak(sink)
        self._commit(task, record, sink)

    # main loop

    def preflight_config(self) -> RunConfig:
        """The config of the roles this batch calls through it: a narrator or player given as a factory
        (a rescore's replayed replies) never reaches its configured endpoint, so it is not checked."""
        update: dict[str, Any] = {}
        if self.narrator_factory is not None:
            update["narrator"] = RoleConfig()  # the in-process mock: no key, no endpoint to probe
        if self.player_factory is not None:
            update["player_mode"] = "scripted"  # out of the active roles
        return self.config.model_copy(update=update)

    async def preflight(self) -> None:
        """Roles and keys, then one probe per endpoint (unless `probe=False`): PreflightError before
        the folder or any record exists."""
        config = self.preflight_config()
        check_roles(config)
        if self.probe:
            await asyncio.to_thread(probe_endpoints, config)  # blocking HTTP, off the event loop

    async def run(self) -> BatchResult:
        await self.preflight()
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise io_failure(self.out, e) if e.errno in IO_ERRNOS else e from None
        with run_lock(self.out):
            pinned = self._check_same_run(self._run_json())
            try:
                self.checkpoints.mkdir(exist_ok=True)
                remove_stale_temp_files(self.out)
                repair_jsonl(self.episodes_path)
            except OSError as e:
                if e.errno in IO_ERRNOS:
                    raise io_failure(self.out, e) from None
                raise
            done: dict[str, str] = {}
            positions = {env: k for k, env in enumerate(self.settings.envs)}
            mine = canonical(self.identity)
            foreign = 0
            for d in iter_jsonl(self.episodes_path, accept=episode_line):
                # Only this run's own records are done: a line another setup wrote (a person's
                # `ncpbench play` episode, an older tool) must not stand in for this run's episode.
                if pinned and record_identity(d) != mine:
                    foreign += 1
                    continue
                done[d["episode_id"]] = d["outcome"]
            if foreign:
                log.warning("foreign_records_not_counted", records=foreign, file=str(self.episodes_path),
                            why="their run identity is not this run's; those episodes run again")
            if self.retry_errors and any(o == Outcome.ERROR.value for o in done.values()):
                kept = "".join(jsonl_line(d) for d in iter_jsonl(self.episodes_path, accept=episode_line)
                               if done.get(d["episode_id"]) != Outcome.ERROR.value)
                atomic_write(self.episodes_path, kept)
                done = {k: v for k, v in done.items() if v != Outcome.ERROR.value}
            for episode_id in done:  # a kill between append and checkpoint delete leaves a stale checkpoint
                self._checkpoint_path_of(episode_id).unlink(missing_ok=True)
            finished_here = 0
            for episode_id, outcome in done.items():
                env_id, _, rep = episode_id.rpartition("#")
                if not rep.isdigit() or not is_planned(self.settings, env_id, int(rep), positions):
                    continue
                finished_here += 1
                self.progress.conflicts += outcome == Outcome.CONFLICT.value
                self.progress.errors += outcome == Outcome.ERROR.value
            self.progress.total = planned_count(self.settings)
            self.progress.skipped = self.progress.done = finished_here
            pending = (t for t in plan(self.settings) if t.episode_id not in done)
            started = _now()
            try:
                self._write_run_json("running", started)
            except OSError as e:
                if e.errno in IO_ERRNOS:
                    raise io_failure(self.out, e) from None
                raise
            cache = ResponseCache(self.config.cache_path) if self.config.cache_path else None
            # calls.jsonl: every model call of the run, appended and fsynced (a resumed run adds lines).
            calls = CallLog(self.out / "calls.jsonl")
            client = ModelClient(cache=cache, call_sink=calls)
            status = "interrupted"
            stats: dict[str, Any] = {}
            client_cpu = 0.0
            try:
                try:
                    with self.episodes_path.open("a", encoding="utf-8") as sink:
                        await self._execute(pending, client, sink)
                        if not self.progress.stopped_by_breaker:
                            self._flush_streak(sink)
                except OSError as e:
                    if e.errno in IO_ERRNOS:
                        self._io_error = io_failure(self.episodes_path, e)
                    else:
                        raise
                if self._io_error is not None:
                    status = "stopped_by_io_error"
                    raise self._io_error
                status = ("stopped_by_breaker" if self.progress.stopped_by_breaker else
                          "stopped_by_budget" if self.progress.stopped_by_budget else
                          "complete" if self.progress.done == self.progress.total else "partial")
            finally:
                stats = client.stats.as_dict()
                stats["cost_usd"] = total_cost(client.stats.usage_by_model, self.budget.prices)
                client_cpu = client.stats.client_cpu_s
                await client.aclose()
                calls.close()
                if cache:
                    cache.close()
                try:
                    self._write_run_json(status, started, stats)
                except OSError as e:  # the disk may still be full: the original error is the one to show
                    log.warning("run_json_not_updated", error=str(e))
        return BatchResult(self.out, self.progress, self.records, stats, client_cpu)

    async def _execute(self, pending: Iterable[EpisodeTask], client: ModelClient, sink: TextIO) -> None:
        """The executor seam: episodes here (the default), or on Ray workers (ncpbench.executors.ray)."""
        if self.executor == "ray":
            from ncpbench.executors.ray import run_on_ray

            await run_on_ray(self, pending, client, sink)
        else:
            await self._run_all(pending, client, sink)

    async def _run_all(self, pending: Iterable[EpisodeTask], client: ModelClient, sink: TextIO) -> None:
        tasks = iter(pending)

        async def worker() -> None:
            for task in tasks:  # one shared lazy iterator: workers take the next episode as they free up
                if self.should_stop():
                    return
                try:
                    await self._episode(task, client, sink)
                except OSError as e:  # the folder itself failed: stop every worker between turns
                    self.fail_io(self.out, e)
                    return

        n = min(self.concurrency, max(self.progress.total - self.progress.done, 0)) or 1
        try:
            async with asyncio.TaskGroup() as group:
                for _ in range(n):
                    group.create_task(worker())
        except BaseExceptionGroup as group_error:  # callers see the first failure itself, not a group
            raise group_error.exceptions[0] from None

    def _over_budget(self) -> bool:
        b = self.budget
        if b.max_total_tokens is not None and self.progress.tokens >= b.max_total_tokens:
            return True
        cost = b.cost(self.progress.by_model)
        return b.max_cost_usd is not None and cost is not None and cost >= b.max_cost_usd

    def _model_of(self, role: str) -> str:
        return self.config.role(role).model

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
            if self.player_factory is not None:
                player = self.player_factory(task)
            env = NarrativeEnv(spec, player=player, auditor=auditor, max_turns=self.settings.max_turns,
                               protocol=self.config.audit_protocol())
            resume = self._read_checkpoint(task, env)

            def on_step(e: NarrativeEnv, info: dict[str, Any]) -> None:
                self.on_committed_turn(task, e.history[-1].usage, None if e.state.done else e.snapshot())

            with call_context(episode=task.episode_id):  # labels this episode's lines of calls.jsonl
                record: EpisodeRecord | None = await play_episode(
                    env, narrator, seed=task.seed, replicate=task.replicate, config=self.record_config,
                    on_step=on_step, resume=resume, stop=self.should_stop, turn_timeout_s=self.turn_timeout_s)
        except EpisodeInterrupted:
            record = None
        except Exception as e:  # building the episode failed: still an ERROR record, never a crash
            if env is None:
                raise RunError(describe_failure(e)) from e
            env.fail(describe_failure(e))
            record = env.record(replicate=task.replicate, config=self.record_config)
        finally:
            self.progress.alive -= 1
        self.settle(task, record, sink)

    def _flush_streak(self, sink: TextIO) -> None:
        held, self._streak = self._streak, []
        for task, record in held:
            self._commit(task, record, sink)

    def _commit(self, task: EpisodeTask, record: EpisodeRecord, sink: TextIO) -> None:
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
    player: PlayerFactory | None = None,
    on_change: Callable[[Progress], None] | None = None,
    turn_timeout_s: float | None = DEFAULT_TURN_TIMEOUT_S,
    breaker: int = BREAKER_DEFAULT,
    executor: str = "local",
    ray_address: str | None = None,
    ray_workers: int | None = None,
    probe: bool = True,
    run_meta: dict[str, Any] | None = None,
) -> BatchResult:
    """Run (or resume) a batch into `out`. Rerunning the same call continues where it stopped.

    `executor="ray"` plays the episodes in Ray worker actors (the `ncpbench[ray]` extra; a local Ray
    instance, or the cluster at `ray_address`; `ray_workers` actors, default one per cluster CPU)
    while this process stays the only writer of the folder: see ncpbench.executors.ray.

    Before anything is created the roles are checked (provider, model, key variable) and each
    distinct endpoint is probed once (`probe=False` skips the probe only: for endpoints that cannot
    be probed, or when the caller has just probed them); a failure raises PreflightError (a
    ConfigError) and leaves no folder.

    `run_meta`: extra run.json fields (a rescore's `rescore_of`), in run.json from its first write,
    before any episode starts; they cannot replace the runner's own fields.

    Raises RunError when the folder is in use or holds a different run, RunIOError when it cannot
    be written, ValueError for settings out of range (e.g. replicates or max_turns below 1).
    """
    ds = load(dataset)
    settings = BatchSettings(envs=select_envs(ds, envs), replicates=replicates, max_turns=max_turns, seed=seed,
                             shard=shard, dataset=dataset, turn_timeout_s=turn_timeout_s)
    runner = BatchRunner(Path(out), config or RunConfig(), settings, concurrency=concurrency,
                         budget=Budget(max_total_tokens, max_cost_usd,
                                       {m: as_price(p) for m, p in (prices or {}).items()}),
                         retry_errors=retry_errors, narrator=narrator, on_change=on_change, dataset=ds,
                         breaker=breaker, player=player, executor=executor,
                         ray_address=ray_address, ray_workers=ray_workers, probe=probe, run_meta=run_meta)
    started = time.perf_counter()
    result = await runner.run()
    log.info("batch_done", out=str(out), seconds=round(time.perf_counter() - started, 1),
             finished=len(result.records))
    return result


def _without_shard(identity: dict[str, Any]) -> dict[str, Any]:
    """An identity with `batch.shard` set to None: the shard decides which episodes a runner takes, not
    how one is played, so the shards of one run share everything else."""
    batch = dict(identity.get("batch") or {})
    batch["shard"] = None
    out: dict[str, Any] = canonical({**identity, "batch": batch})
    return out


def merge_runs(shards: list[Path], out: Path) -> dict[str, Any]:
    """Join shard folders of one run into `out`: the same run identity but for the shard, episodes
    deduplicated. The merged run.json and records carry that identity with `batch.shard` None, so the
    merged folder resumes like an unsharded run. RunError names every field that differs."""
    metas = []
    for s in shards:
        path = s / "run.json"
        if not path.exists():
            raise RunError(f"{s} has no run.json: not a run folder")
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            raise RunError(f"{s}/run.json is not JSON: not a run folder") from None
        if not isinstance(meta, dict):
            raise RunError(f"{s}/run.json is not a run.json (not an object)")
        metas.append(meta)
    base = metas[0]
    pinned = [isinstance(m.get("identity"), dict) for m in metas]
    identity: dict[str, Any] | None = None
    if all(pinned):
        identity = _without_shard(base["identity"])
        for s, m in zip(shards[1:], metas[1:], strict=True):
            diffs = identity_differences(identity, _without_shard(m["identity"]))
            if diffs:
                raise RunError(f"{s} is not a shard of the same run as {shards[0]}: " + "; ".join(diffs[:6])
                               + ("; ..." if len(diffs) > 6 else ""))
    elif any(pinned):
        raise RunError(f"{shards[pinned.index(False)]} has no run identity and {shards[pinned.index(True)]} has "
                       "one: not shards of the same run (written by different ncpbench versions)")
    else:  # folders written before identities were pinned: compare what they recorded

        def key(m: dict[str, Any]) -> str:
            batch = dict(m.get("batch") or {})
            batch.pop("shard", None)
            return json.dumps({"batch": batch, "config": run_identity(m.get("config") or {})}, sort_keys=True)

        for s, m in zip(shards[1:], metas[1:], strict=True):
            if key(m) != key(base):
                raise RunError(f"{s} is not a shard of the same run as {shards[0]} (different config or batch)")
    records: dict[str, dict[str, Any]] = {}
    skipped = 0
    for s in shards:
        for episode_id, data in read_records(s / "episodes.jsonl").items():
            if identity is not None:
                own = record_identity(data)
                if own is None or _without_shard(own) != identity:
                    skipped += 1  # not this run's record (e.g. a person's play session): not merged
                    continue
                data = {**data, "config": {**data["config"], "run_identity": identity}}
            records[episode_id] = data
    if skipped:
        log.warning("merge_skipped_foreign_records", records=skipped, why="their run identity is not the shards' run")
    out.mkdir(parents=True, exist_ok=True)
    with run_lock(out):
        if identity is not None:  # merging again into the same folder is fine; over another run is not
            theirs, source = folder_identity(out, _read_meta(out))
            diffs = identity_differences(theirs, identity) if theirs is not None else []
            if diffs:
                raise RunError(f"{out} holds a different run ({source}): " + "; ".join(diffs[:6])
                               + "; choose another --out")
        batch = dict(base["batch"])
        batch["shard"] = None
        planned = planned_count(BatchSettings(**batch))
        merged = {**base, "batch": batch, "name": out.name, "merged_from": [str(s) for s in shards],
                  "status": "complete" if len(records) == planned else "partial", "episodes_planned": planned,
                  "sessions": [sess for m in metas for sess in m.get("sessions", [])]}
        if identity is not None:
            merged["identity"] = identity
            merged["identity_hash"] = identity_hash(identity)
        atomic_write(out / "episodes.jsonl", "".join(jsonl_line(r) for r in records.values()))
        atomic_write(out / "run.json", json.dumps(merged, indent=2))
    return merged


def _read_meta(folder: Path) -> dict[str, Any]:
    """run.json of a folder, or {} when it is missing or unreadable (the records still pin the run)."""
    try:
        data = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}
