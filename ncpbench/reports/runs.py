"""Reading run folders (docs/RUN_FORMAT.md): run.json plus episodes.jsonl, records only.

`episodes.jsonl` holds one `EpisodeRecord` a line. When an `episode_id` repeats, the last line
wins (a resumed or re-run episode). Lines are read by `ncpbench.jsonl.scan_jsonl` with the same
test the runner uses: a torn final line or a damaged line is skipped and noted (the runner moves
the same lines to `episodes.jsonl.quarantine`); `strict=True` makes a damaged line an error.
Checkpoints of in-flight episodes are not read: reports cover finished episodes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ncpbench.jsonl import BadLine, episode_line, scan_jsonl
from ncpbench.record import EpisodeRecord

ROLES = ("narrator", "player", "auditor")


class RunFormatError(ValueError):
    """A run folder that cannot be read (missing episodes.jsonl, a damaged line)."""


@dataclass(frozen=True)
class Run:
    """One run folder, read."""

    path: Path
    name: str
    meta: dict[str, Any]
    """run.json as written by the runner ({} when the folder has none)."""
    records: list[EpisodeRecord]
    """One per episode_id (the last line wins), in order of first appearance."""
    notes: list[str] = field(default_factory=list)
    """What the reader had to handle (a skipped partial last line, repeated episode ids, no run.json)."""

    @property
    def config(self) -> dict[str, Any]:
        """The run config: run.json's `config`, else the first record's."""
        cfg = self.meta.get("config")
        if isinstance(cfg, dict) and cfg:
            return cfg
        return self.records[0].config if self.records else {}

    def model(self, role: str) -> str:
        """The model string of a role (`provider/model`), or "" when the run does not say."""
        value = self.config.get(role)
        if isinstance(value, dict):
            value = value.get("model")
        return str(value) if value is not None else ""

    @property
    def mock_roles(self) -> list[str]:
        """Roles answered by the mock server (run.json's tag, else the records'); [] for real models."""
        tagged = self.config.get("mock_roles")
        if isinstance(tagged, list):
            return [str(r) for r in tagged]
        scripted = self.config.get("player_mode") == "scripted"
        return [r for r in ROLES if self.model(r).startswith("mock/") and not (r == "player" and scripted)]

    @property
    def player_mode(self) -> str:
        mode = self.config.get("player_mode")
        return str(mode) if mode is not None else ""

    @property
    def protocols(self) -> list[str]:
        """The protocols (`name/version`) its records were played under, else run.json's."""
        found = sorted({r.protocol for r in self.records})
        if found:
            return found
        proto = self.meta.get("protocol")
        return [str(proto)] if proto else []

    @property
    def limits(self) -> list[int]:
        """The turn limits of its episodes (one, normally)."""
        return sorted({r.max_turns for r in self.records})

    @property
    def limit(self) -> int:
        return max(self.limits, default=0)

    @property
    def env_versions(self) -> dict[str, int]:
        return {r.env_id: r.env_version for r in self.records}

    def sampling(self, role: str) -> str:
        """"T 0.6 · top-p 0.95 · max 8092" from the role's config; "" when the run does not say."""
        value = self.config.get(role)
        if not isinstance(value, dict):
            return ""
        parts = []
        for key, label in (("temperature", "T"), ("top_p", "top-p"), ("max_tokens", "max")):
            v = value.get(key)
            parts.append(f"{label} {'default' if v is None else f'{v:g}'}")
        return " · ".join(parts)


def episode_key(record: EpisodeRecord) -> str:
    """The record's episode_id, or `<env_id>#<replicate>` for records written without one."""
    return record.episode_id or f"{record.env_id}#{record.replicate}"


def read_episodes(path: str | Path, *, strict: bool = False) -> tuple[list[EpisodeRecord], list[str]]:
    """Parse an episodes.jsonl file: (records, notes), through the runner's own line reader.

    Tolerant (the default) skips what the runner would quarantine (a torn last line, a damaged
    line, a line that is not an episode record) and notes each; `strict=True` raises
    RunFormatError on any of them except a torn last line.
    """
    p = Path(path)
    by_id: dict[str, EpisodeRecord] = {}
    notes: list[str] = []
    repeated = 0

    def skipped(bad: BadLine) -> None:
        if bad.torn:
            notes.append(f"{p.name}: skipped an incomplete last line (line {bad.lineno})")
        else:
            notes.append(f"{p.name}: skipped damaged line {bad.lineno} ({bad.reason})")

    try:
        for lineno, data, bad in scan_jsonl(p, accept=episode_line):
            if bad is not None:
                if strict and not bad.torn:
                    kind = "not JSON" if bad.reason.startswith("not JSON") else "not an episode record"
                    raise RunFormatError(f"{p}:{lineno}: {kind} ({bad.reason})")
                skipped(bad)
                continue
            try:
                record = EpisodeRecord.model_validate(data)
            except ValueError as e:
                if strict:
                    raise RunFormatError(f"{p}:{lineno}: not an episode record ({str(e).splitlines()[0]})") from None
                notes.append(f"{p.name}: skipped line {lineno}: not an episode record ({str(e).splitlines()[0]})")
                continue
            key = episode_key(record)
            if key in by_id:
                repeated += 1
            by_id[key] = record
    except OSError as e:
        raise RunFormatError(f"{p}: cannot read ({e.strerror or e})") from None
    if repeated:
        notes.append(f"{p.name}: {repeated} repeated episode line(s); the last one of each was kept")
    return list(by_id.values()), notes


def load_run(path: str | Path, name: str | None = None) -> Run:
    """Read a run folder (or its episodes.jsonl). Raises RunFormatError when it is not a run."""
    p = Path(path)
    folder = p.parent if p.is_file() else p
    episodes = folder / "episodes.jsonl"
    if not episodes.is_file():
        raise RunFormatError(f"{folder}: no episodes.jsonl (not a run folder?)")
    records, notes = read_episodes(episodes)
    meta: dict[str, Any] = {}
    run_json = folder / "run.json"
    if run_json.is_file():
        try:
            loaded = json.loads(run_json.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RunFormatError(f"{run_json}: not JSON ({e})") from None
        if not isinstance(loaded, dict):
            raise RunFormatError(f"{run_json}: expected a JSON object")
        meta = loaded
    else:
        notes.append("no run.json: models taken from the episode records")
    default = str(meta.get("name") or "") or folder.resolve().name
    return Run(path=folder, name=name or default, meta=meta, records=records, notes=notes)


def load_runs(paths: list[str | Path] | list[Path] | list[str]) -> list[Run]:
    """Read several runs; names are made unique (`name`, `name (2)`, ...)."""
    runs: list[Run] = []
    seen: dict[str, int] = {}
    for path in paths:
        run = load_run(path)
        count = seen.get(run.name, 0) + 1
        seen[run.name] = count
        if count > 1:
            run = Run(path=run.path, name=f"{run.name} ({count})", meta=run.meta, records=run.records, notes=run.notes)
        runs.append(run)
    return runs


AUDIT_RESPONSE_CAP = 4000
"""Characters of one raw auditor answer kept in the report."""


def read_auditor_calls(folder: str | Path) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """The auditor's raw answers from a run's calls.jsonl, per (episode, turn); {} without the file.

    Plain JSON lines (the format of ncpbench.models.calllog: episode, turn, role, stage, attempt,
    outcome, response); a line that is not JSON or not an auditor call is skipped.
    """
    path = Path(folder) / "calls.jsonl"
    out: dict[tuple[str, int], list[dict[str, Any]]] = {}
    if not path.is_file():
        return out
    try:
        handle = path.open(encoding="utf-8", errors="replace")
    except OSError:
        return out
    with handle:
        for line in handle:
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(data, dict) or data.get("role") != "auditor":
                continue
            episode, turn = data.get("episode"), data.get("turn")
            if not isinstance(episode, str) or not isinstance(turn, int):
                continue
            response = data.get("response")
            text = response if isinstance(response, str) else ""
            out.setdefault((episode, turn), []).append({
                "stage": str(data.get("stage") or ""), "attempt": data.get("attempt"),
                "reask": data.get("reask", 0), "outcome": str(data.get("outcome") or ""),
                "response": text[:AUDIT_RESPONSE_CAP] + ("…" if len(text) > AUDIT_RESPONSE_CAP else "")})
    return out
