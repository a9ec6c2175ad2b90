"""Crash safety: SIGKILL a batch runner at many random moments; nothing is lost, duplicated or torn.

docs/RELIABILITY.md lists the guarantees this file proves.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ncpbench.models.config import RoleConfig, RunConfig
from ncpbench.models.mock_server import MockConfig, MockServer
from ncpbench.registry import bundled_slugs
from ncpbench.runner import repair_jsonl, run_batch

ENVS = bundled_slugs()[:20]
REPLICATES = 2
TURNS = 4
KILLS = 12
LATENCY_MS = 80
CONCURRENCY = 2
# The batch is latency-bound, so its length does not depend on CPU speed: 40 episodes x 14 sequential
# rounds (opening 2, each turn 3) x 80 ms / 2 in flight = ~22 s, more than all kill windows together.


def run_cmd(out: Path, url: str) -> list[str]:
    return [sys.executable, "-m", "ncpbench", "run", "--envs", ",".join(ENVS), "--replicates", str(REPLICATES),
            "--max-turns", str(TURNS), "--concurrency", str(CONCURRENCY), "--out", str(out), "--player-mode", "scripted",
            "--no-progress", "--narrator", "mock/default", "--narrator-base-url", url,
            "--auditor", "mock/default", "--auditor-base-url", url]


def wait_for_lock(out: Path, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> bool:
    """True once `proc` holds the folder's lock (run_lock writes the holder's pid into .lock)."""
    deadline = time.monotonic() + timeout
    lock = out / ".lock"
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if lock.read_text().strip() == str(proc.pid):
                return True
        except OSError:
            pass
        time.sleep(0.01)
    return False


def whole_lines(data: bytes) -> list[dict[str, Any]]:
    """Every line of a JSONL file, each required to be complete JSON ending in a newline."""
    assert data == b"" or data.endswith(b"\n"), "a torn last line"
    return [json.loads(line) for line in data.decode("utf-8").split("\n") if line.strip()]


def check_files_after_kill(out: Path, scratch: Path) -> tuple[dict[str, list[Any]], int, bool]:
    """Every file the runner writes parses; returns (checkpoint histories, finished episodes, torn line?)."""
    run_json = out / "run.json"
    if run_json.exists():
        meta = json.loads(run_json.read_text())  # never half-written: atomic rename
        assert meta["status"] in {"running", "interrupted", "complete", "partial"}
    seen: dict[str, list[Any]] = {}
    for path in (out / "checkpoints").glob("*.json") if (out / "checkpoints").exists() else []:
        data = json.loads(path.read_text(encoding="utf-8"))  # never half-written: atomic rename
        seen[data["episode_id"]] = data["snapshot"]["history"]
    episodes = out / "episodes.jsonl"
    if not episodes.exists():
        return seen, 0, False
    raw = episodes.read_bytes()
    torn = bool(raw) and not raw.endswith(b"\n")
    # Only the last line may be torn (a kill mid-append); what the runner's repair keeps is whole lines.
    copy = scratch / "episodes.jsonl"
    shutil.copyfile(episodes, copy)
    repair_jsonl(copy)
    finished = whole_lines(copy.read_bytes())
    return seen, len(finished), torn


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_no_turn_duplicates_no_episode_and_tears_no_file(tmp_path: Path) -> None:
    rng = random.Random(20240610)
    out = tmp_path / "run"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    planned = len(ENVS) * REPLICATES
    checkpoints_seen: list[tuple[str, list[Any]]] = []
    kills_mid_batch = 0
    torn_lines = 0
    refused: subprocess.CompletedProcess[str] | None = None
    started = time.monotonic()
    with MockServer(MockConfig(latency_ms=LATENCY_MS)) as server:
        for k in range(KILLS):
            proc = subprocess.Popen(run_cmd(out, server.base_url), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            if k % 4 == 3:
                time.sleep(rng.uniform(0.0, 2.0))  # anywhere, start-up included
            else:
                assert wait_for_lock(out, proc), "the runner never took the lock"
                if k == 4:  # a second runner on the folder in use is refused, not interleaved
                    refused = subprocess.run(run_cmd(out, server.base_url), capture_output=True, text=True,
                                             timeout=120)
                    assert proc.poll() is None, "the first runner must still hold the folder"
                time.sleep(rng.uniform(0.05, 1.2))
            assert proc.poll() is None, f"kill {k}: the batch finished before the kill; make it longer"
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            seen, finished, torn = check_files_after_kill(out, scratch)
            checkpoints_seen += list(seen.items())
            kills_mid_batch += finished < planned
            torn_lines += torn
        done = subprocess.run(run_cmd(out, server.base_url), capture_output=True, text=True, timeout=300)
    elapsed = time.monotonic() - started

    assert done.returncode == 0, done.stderr
    assert kills_mid_batch >= 10, f"only {kills_mid_batch} kills landed mid-batch"
    assert checkpoints_seen, "kills must have caught episodes in flight"

    assert refused is not None and refused.returncode == 3
    assert "is in use by another ncpbench run" in refused.stderr and "Traceback" not in refused.stderr

    records = whole_lines((out / "episodes.jsonl").read_bytes())
    ids = [r["episode_id"] for r in records]
    assert sorted(ids) == sorted(f"{env}#{r}" for env in ENVS for r in range(REPLICATES)), "each exactly once"
    by_id = {r["episode_id"]: r for r in records}
    for episode_id, history in checkpoints_seen:  # no committed turn of any checkpoint was lost
        assert by_id[episode_id]["history"][: len(history)] == history, episode_id
    assert all(r["outcome"] == "SURVIVAL" and r["turns"] == TURNS for r in records)

    names = sorted(p.name for p in out.iterdir())
    if "episodes.jsonl.quarantine" in names:  # torn lines are moved aside, never deleted; each is a fragment
        names.remove("episodes.jsonl.quarantine")
        for line in (out / "episodes.jsonl.quarantine").read_bytes().splitlines():
            with pytest.raises(ValueError):
                json.loads(line)
    assert names == [".lock", "calls.jsonl", "checkpoints", "episodes.jsonl", "run.json"], "no temp files left behind"
    # Every model call behind a committed turn is in calls.jsonl, whatever the kills interrupted:
    # a call's line is fsynced before the call returns, so before its turn can be committed.
    calls_bytes = (out / "calls.jsonl").read_bytes()
    calls = whole_lines(calls_bytes)
    assert calls_bytes.endswith(b"\n") and len(calls) == calls_bytes.count(b"\n"), "every line whole"
    answered = {(c["episode"], c["turn"]) for c in calls if c["role"] == "narrator" and c["outcome"] == "ok"}
    for r in records:
        assert all((r["episode_id"], t["turn"]) in answered for t in r["history"]), r["episode_id"]
    assert list((out / "checkpoints").iterdir()) == []
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "complete" and len(meta["sessions"]) >= KILLS // 2
    print(f"{KILLS} kills ({kills_mid_batch} mid-batch, {torn_lines} torn lines repaired, "
          f"{len(checkpoints_seen)} checkpoints compared) in {elapsed:.0f} s")


def test_temp_files_of_writes_cut_by_a_kill_are_removed_at_the_next_start(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with MockServer() as server:
        role = RoleConfig(model="mock/default", base_url=server.base_url)
        config = RunConfig(narrator=role, player=role, auditor=role, player_mode="scripted")
        asyncio.run(run_batch(out, config, envs="iron-man", max_turns=1))
        torn = [out / ".run.json.4242.tmp", out / "checkpoints" / ".iron-man__0.json.4242.tmp",
                out / ".episodes.jsonl.77.tmp"]
        for path in torn:
            path.write_text('{"half": "writ')
        keep = [out / "notes.tmp", out / ".keep"]
        for path in keep:
            path.write_text("the user's")
        asyncio.run(run_batch(out, config, envs="iron-man", max_turns=1))
    assert not any(p.exists() for p in torn)
    assert all(p.read_text() == "the user's" for p in keep)
