"""Re-audit a finished run with another auditor: `rescore(run_dir, config, out)`.

The narrator's replies and the player's actions of every recorded episode are replayed, turn by
turn, through the new auditor; neither the narrator nor the player model is called. The result is
a normal run folder (written by `ncpbench.runner.run_batch`: run.json, episodes.jsonl,
calls.jsonl, resumable like any run) whose run.json also says `rescore_of` (the original folder)
from its first write, so an interrupted rescore is never mistaken for an ordinary run.
`ncpbench report RUN RUN2` then shows how the two auditors agree.

The new auditor may end an episode earlier than the original one (a conflict it sees first). When
it lets an episode go on past the original's last turn (the original auditor's conflict is one
the new one does not confirm), there is no recorded reply to go on with: that episode ends as
ERROR with `RescoreExhausted: ...` (excluded from scores, like every ERROR), and its verdicts up to
there still count in the auditor agreement.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ncpbench.episode import DEFAULT_TURN_TIMEOUT_S
from ncpbench.jsonl import episode_line, iter_jsonl
from ncpbench.models.config import RoleConfig, RunConfig
from ncpbench.protocols import NarratorRequest, PlayerRequest
from ncpbench.record import EpisodeRecord
from ncpbench.runner import BatchResult, EpisodeTask, Progress, RunError, run_batch


class RescoreExhausted(RuntimeError):
    """The new auditor let an episode go on past the last turn the original run recorded."""


class _Replay:
    def __init__(self, record: EpisodeRecord | None, episode_id: str) -> None:
        self.episode_id = episode_id
        self.record = record
        self.replies = {t.turn: t.narrator_reply for t in record.history} if record else {}
        self.actions = {t.turn: t.player_action for t in record.history if t.player_action is not None} if record else {}

    def missing(self, what: str, turn: int) -> RescoreExhausted:
        if self.record is None:
            return RescoreExhausted(f"{self.episode_id} is not in the original run")
        return RescoreExhausted(f"the original run recorded no {what} for turn {turn} of {self.episode_id} (it ended "
                                f"at turn {self.record.turns} as {self.record.outcome.value}); the new auditor let "
                                "the episode go on")


class ReplayedNarrator:
    """The recorded narrator replies, by turn (0 = the opening); past them: RescoreExhausted."""

    def __init__(self, replay: _Replay) -> None:
        self.replay = replay

    def narrate(self, request: NarratorRequest) -> str:
        if request.turn not in self.replay.replies:
            raise self.replay.missing("narrator reply", request.turn)
        return self.replay.replies[request.turn]


class ReplayedPlayer:
    """The recorded player actions, by turn; past them: RescoreExhausted."""

    def __init__(self, replay: _Replay) -> None:
        self.replay = replay

    def act(self, request: PlayerRequest) -> str:
        if request.turn not in self.replay.actions:
            raise self.replay.missing("player action", request.turn)
        return self.replay.actions[request.turn]


def _original(run_dir: Path) -> tuple[dict[str, Any], dict[str, EpisodeRecord]]:
    meta_path = run_dir / "run.json"
    if not meta_path.is_file() or not (run_dir / "episodes.jsonl").is_file():
        raise RunError(f"{run_dir}: not a finished run folder (run.json and episodes.jsonl are needed)")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    records: dict[str, EpisodeRecord] = {}
    for data in iter_jsonl(run_dir / "episodes.jsonl", accept=episode_line):
        record = EpisodeRecord.model_validate(data)
        records[record.episode_id] = record
    if not records or not isinstance(meta.get("batch"), dict):
        raise RunError(f"{run_dir}: no recorded episodes or no batch settings in run.json")
    return meta, records


def rescore_config(meta: dict[str, Any], auditor: RunConfig | RoleConfig) -> RunConfig:
    """The original run's config with the new auditor (and the new config's cache, if any)."""
    original = dict(meta.get("config") or {})
    original.pop("mock_roles", None)
    base = RunConfig.model_validate(original)
    role = auditor.auditor if isinstance(auditor, RunConfig) else auditor
    update: dict[str, Any] = {"auditor": role}
    if isinstance(auditor, RunConfig):
        update["cache_path"] = auditor.cache_path
    return base.model_copy(update=update)


async def arescore(run_dir: str | Path, config: RunConfig | RoleConfig, out: str | Path, *, concurrency: int = 8,
                   on_change: Callable[[Progress], None] | None = None, probe: bool = True) -> BatchResult:
    """`rescore`, inside an event loop."""
    src, dst = Path(run_dir), Path(out)
    if src.resolve() == dst.resolve():
        raise RunError("--out must be a new folder, not the run being re-audited")
    meta, records = _original(src)
    batch = meta["batch"]
    cfg = rescore_config(meta, config)

    def replay(task: EpisodeTask) -> _Replay:
        return _Replay(records.get(task.episode_id), task.episode_id)

    origin = {"rescore_of": str(src.resolve()), "rescore_of_name": str(meta.get("name") or src.resolve().name),
              "rescore_of_identity_hash": meta.get("identity_hash")}
    return await run_batch(dst, cfg, envs=list(batch["envs"]), replicates=int(batch.get("replicates", 1)),
                             max_turns=int(batch.get("max_turns", 100)), seed=int(batch.get("seed", 0)),
                             shard=(int(batch["shard"][0]), int(batch["shard"][1])) if batch.get("shard") else None,
                             dataset=batch.get("dataset"), concurrency=concurrency, on_change=on_change,
                             # the original's limit when it recorded one (older runs did not)
                             turn_timeout_s=batch.get("turn_timeout_s", DEFAULT_TURN_TIMEOUT_S),
                             narrator=lambda t: ReplayedNarrator(replay(t)), player=lambda t: ReplayedPlayer(replay(t)),
                             probe=probe, run_meta=origin)


def rescore(run_dir: str | Path, config: RunConfig | RoleConfig, out: str | Path, *, concurrency: int = 8,
            on_change: Callable[[Progress], None] | None = None, probe: bool = True) -> BatchResult:
    """Replay a finished run through another auditor into `out` (a normal, resumable run folder).

    `config`: the new auditor, as a RunConfig (its `auditor` and `cache_path` are used; the narrator,
    player, protocol and batch settings come from the original run) or a RoleConfig. The new auditor
    is preflighted like any run (its key, one probe of its endpoint unless `probe=False`; the replayed
    roles call nothing) before `out` exists; run.json says `rescore_of` from its first write.
    """
    return asyncio.run(arescore(run_dir, config, out, concurrency=concurrency, on_change=on_change, probe=probe))
