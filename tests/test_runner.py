"""Batch runs: resumable, crash-safe, never stopped by one bad episode."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ncpbench.models.config import RoleConfig, RunConfig
from ncpbench.models.mock_server import MockConfig, MockServer
from ncpbench.protocols import NarratorRequest
from ncpbench.registry import bundled_slugs
from ncpbench.runner import EpisodeTask, RunError, merge_runs, read_records, repair_jsonl, run_batch, run_lock


def mock_config(server: MockServer, **kw: object) -> RunConfig:
    r = RoleConfig(model="mock/default", base_url=server.base_url)
    return RunConfig(narrator=r, player=r, auditor=r, **kw)  # type: ignore[arg-type]


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_batch_writes_run_json_episodes_and_no_leftover_checkpoints(tmp_path: Path) -> None:
    with MockServer() as server:
        result = asyncio.run(run_batch(tmp_path / "r", mock_config(server), envs="iron-man,zombieland", replicates=2,
                                       max_turns=3))
    recs = lines(tmp_path / "r" / "episodes.jsonl")
    assert sorted(r["episode_id"] for r in recs) == ["iron-man#0", "iron-man#1", "zombieland#0", "zombieland#1"]
    assert all(r["outcome"] == "SURVIVAL" and r["turns"] == 3 for r in recs)
    meta = json.loads((tmp_path / "r" / "run.json").read_text())
    assert meta["status"] == "complete" and meta["batch"]["replicates"] == 2
    assert meta["config"]["narrator"]["model"] == "mock/default" and len(meta["dataset_hash"]) == 16
    assert {"narrator", "player", "auditor:fact_update", "auditor:conflict_check", "auditor:double_check",
            "auditor:trajectory_check", "auditor:commitment_status"} <= set(meta["prompt_hashes"])
    assert meta["sessions"][0]["call_stats"]["calls"] == result.call_stats["calls"] > 0
    assert list((tmp_path / "r" / "checkpoints").iterdir()) == []


def test_rerunning_a_finished_batch_does_nothing(tmp_path: Path) -> None:
    with MockServer() as server:
        cfg = mock_config(server)
        asyncio.run(run_batch(tmp_path / "r", cfg, envs="iron-man", replicates=2, max_turns=2))
        again = asyncio.run(run_batch(tmp_path / "r", cfg, envs="iron-man", replicates=2, max_turns=2))
    assert again.records == [] and again.progress.skipped == 2
    assert len(lines(tmp_path / "r" / "episodes.jsonl")) == 2


def test_a_folder_holding_a_different_run_is_refused(tmp_path: Path) -> None:
    with MockServer() as server:
        asyncio.run(run_batch(tmp_path / "r", mock_config(server), envs="iron-man", max_turns=2))
        with pytest.raises(RunError, match="different run"):
            asyncio.run(run_batch(tmp_path / "r", mock_config(server), envs="iron-man", max_turns=3))
        other_model = mock_config(server).model_copy(update={"auditor": RoleConfig(model="mock/other")})
        with pytest.raises(RunError, match="different run"):
            asyncio.run(run_batch(tmp_path / "r", other_model, envs="iron-man", max_turns=2))


def test_a_second_runner_on_a_folder_in_use_is_refused(tmp_path: Path) -> None:
    with run_lock(tmp_path / "r"), MockServer() as server, pytest.raises(RunError, match="in use by another"):
        asyncio.run(run_batch(tmp_path / "r", mock_config(server), envs="iron-man", max_turns=2))


def test_one_failing_episode_becomes_an_error_record_and_the_rest_finish(tmp_path: Path) -> None:
    class Boom:
        def narrate(self, request: NarratorRequest) -> str:
            raise RuntimeError("narrator exploded")

    def factory(task: EpisodeTask):  # type: ignore[no-untyped-def]
        if task.env_id == "zombieland":
            return Boom()
        from ncpbench.agents import ReplayNarrator

        return ReplayNarrator(["A reply that moves the story."])

    with MockServer() as server:
        asyncio.run(run_batch(tmp_path / "r", mock_config(server), envs="iron-man,zombieland,alien", max_turns=2,
                              narrator=factory))
    recs = {r["env_id"]: r for r in lines(tmp_path / "r" / "episodes.jsonl")}
    assert recs["zombieland"]["outcome"] == "ERROR" and "narrator exploded" in str(recs["zombieland"]["error"])
    assert recs["iron-man"]["outcome"] == recs["alien"]["outcome"] == "SURVIVAL"


def test_retry_errors_reruns_only_the_errors(tmp_path: Path) -> None:
    with MockServer(MockConfig(fault_rate=1.0, fault_kinds=("schema_miss",))) as bad:
        asyncio.run(run_batch(tmp_path / "r", mock_config(bad, player_mode="scripted"), envs="iron-man", max_turns=2))
    with MockServer() as good:  # another endpoint for the same models is still the same run
        cfg = mock_config(good, player_mode="scripted")
        asyncio.run(run_batch(tmp_path / "r", cfg, envs="iron-man", max_turns=2, retry_errors=True))
    recs = lines(tmp_path / "r" / "episodes.jsonl")
    assert [r["outcome"] for r in recs] == ["SURVIVAL"], "the error line is replaced, not duplicated"


def test_shards_cover_the_batch_and_merge_into_one_run(tmp_path: Path) -> None:
    with MockServer() as server:
        cfg = mock_config(server, player_mode="scripted")
        for i in range(3):
            asyncio.run(run_batch(tmp_path / f"s{i}", cfg, envs="iron-man,zombieland,alien,up", replicates=2,
                                  max_turns=1, shard=(i, 3)))
    sizes = [len(lines(tmp_path / f"s{i}" / "episodes.jsonl")) for i in range(3)]
    assert sizes == [3, 3, 2]
    merged = merge_runs([tmp_path / f"s{i}" for i in range(3)], tmp_path / "all")
    assert merged["status"] == "complete"
    ids = [r["episode_id"] for r in lines(tmp_path / "all" / "episodes.jsonl")]
    assert len(ids) == len(set(ids)) == 8


def test_merge_refuses_shards_of_a_different_dataset_naming_the_field(tmp_path: Path) -> None:
    from ncpbench.cli import main

    spec = tmp_path / "iron-man.yaml"
    spec.write_text((Path(__file__).resolve().parents[1] / "environments" / "iron-man.yaml").read_text())
    with MockServer() as server:
        cfg = mock_config(server, player_mode="scripted")
        asyncio.run(run_batch(tmp_path / "s0", cfg, envs="iron-man", replicates=2, max_turns=1, shard=(0, 2),
                              dataset=str(spec)))
        spec.write_text(spec.read_text().replace("title: Iron Man", "title: Iron Man (edited)"))
        asyncio.run(run_batch(tmp_path / "s1", cfg, envs="iron-man", replicates=2, max_turns=1, shard=(1, 2),
                              dataset=str(spec)))
    with pytest.raises(RunError, match=r"not a shard of the same run as .*: dataset_hash: \w+ -> \w+"):
        merge_runs([tmp_path / "s0", tmp_path / "s1"], tmp_path / "all")
    assert not (tmp_path / "all").exists(), "nothing is written for a refused merge"
    assert main(["merge", str(tmp_path / "s0"), str(tmp_path / "s1"), "--out", str(tmp_path / "all")]) == 3


def test_a_merged_run_has_one_unsharded_identity_and_resumes(tmp_path: Path) -> None:
    from ncpbench.runner import identity_hash

    envs = "iron-man,zombieland,alien,up"
    with MockServer() as server:
        cfg = mock_config(server, player_mode="scripted")
        asyncio.run(run_batch(tmp_path / "s0", cfg, envs=envs, max_turns=1, shard=(0, 2)))
        stopped = asyncio.run(run_batch(tmp_path / "s1", cfg, envs=envs, max_turns=1, shard=(1, 2), concurrency=1,
                                        max_total_tokens=1))  # stopped by its budget: shard 1 still to run
        assert stopped.progress.stopped_by_budget and stopped.progress.done == 0
        merged = merge_runs([tmp_path / "s0", tmp_path / "s1"], tmp_path / "all")
        assert merged["status"] == "partial" and merged["identity"]["batch"]["shard"] is None
        meta = json.loads((tmp_path / "all" / "run.json").read_text())
        assert meta["batch"]["shard"] is None and meta["identity_hash"] == identity_hash(meta["identity"])
        assert all(r["config"]["run_identity"] == meta["identity"] for r in lines(tmp_path / "all" / "episodes.jsonl"))
        resumed = asyncio.run(run_batch(tmp_path / "all", cfg, envs=envs, max_turns=1))
    assert resumed.progress.skipped == 2 and len(resumed.records) == 2, "shard 0's episodes count as done"
    assert sorted(r["episode_id"] for r in lines(tmp_path / "all" / "episodes.jsonl")) == [
        "alien#0", "iron-man#0", "up#0", "zombieland#0"]


def test_token_budget_stops_new_work_and_a_rerun_finishes(tmp_path: Path) -> None:
    with MockServer() as server:
        cfg = mock_config(server, player_mode="scripted")
        first = asyncio.run(run_batch(tmp_path / "r", cfg, envs="iron-man,zombieland,alien,up", max_turns=3,
                                      concurrency=1, max_total_tokens=1))
        assert first.progress.stopped_by_budget and first.progress.done < 4
        assert json.loads((tmp_path / "r" / "run.json").read_text())["status"] == "stopped_by_budget"
        second = asyncio.run(run_batch(tmp_path / "r", cfg, envs="iron-man,zombieland,alien,up", max_turns=3,
                                       concurrency=1))
    assert second.progress.done == 4
    ids = [r["episode_id"] for r in lines(tmp_path / "r" / "episodes.jsonl")]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 4


def test_a_torn_last_line_is_cut_before_appending(tmp_path: Path) -> None:
    path = tmp_path / "episodes.jsonl"
    whole = json.dumps({"episode_id": "a#0", "outcome": "SURVIVAL", "env_id": "a", "title": "A", "genres": [],
                        "turns": 1, "max_turns": 1, "progress": 0.0, "satisfied_share": 0.0, "final_state": {}})
    path.write_text(whole + '\n{"episode_id": "b#0", "outc')
    repair_jsonl(path)
    assert path.read_text() == whole + "\n"
    assert list(read_records(path)) == ["a#0"]
    assert (tmp_path / "episodes.jsonl.quarantine").read_text() == '{"episode_id": "b#0", "outc\n', "moved, not lost"


def _run_cmd(out: Path, url: str, turns: int) -> list[str]:
    return [sys.executable, "-m", "ncpbench", "run", "--envs", "all", "--replicates", "2", "--max-turns", str(turns),
            "--concurrency", "16", "--out", str(out), "--player-mode", "scripted", "--no-progress",
            "--narrator", "mock/default", "--narrator-base-url", url, "--auditor", "mock/default",
            "--auditor-base-url", url]


@pytest.mark.slow
def test_sigkill_mid_batch_then_resume_gives_every_episode_exactly_once(tmp_path: Path) -> None:
    out = tmp_path / "run"
    turns = 4
    with MockServer(MockConfig(latency_ms=15)) as server:
        proc = subprocess.Popen(_run_cmd(out, server.base_url, turns), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        episodes = out / "episodes.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if episodes.exists() and episodes.read_text().count("\n") >= 20:
                break
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        before = read_records(episodes)
        checkpoints = {p.name: json.loads(p.read_text()) for p in (out / "checkpoints").glob("*.json")}
        assert 0 < len(before) < 2 * len(bundled_slugs()), "the kill must land mid-batch"
        assert checkpoints, "in-flight episodes left checkpoints"
        done = subprocess.run(_run_cmd(out, server.base_url, turns), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    recs = lines(episodes)
    ids = [r["episode_id"] for r in recs]
    assert len(ids) == len(set(ids)) == 2 * len(bundled_slugs())
    by_id = {r["episode_id"]: r for r in recs}
    for data in checkpoints.values():  # no committed turn of a checkpoint was lost
        snap = data["snapshot"]
        committed = [t for t in snap["history"]]
        final = by_id[data["episode_id"]]["history"]
        assert final[: len(committed)] == committed
    assert list((out / "checkpoints").iterdir()) == []
    assert json.loads((out / "run.json").read_text())["status"] == "complete"


def test_a_turn_over_its_wall_clock_limit_is_an_error_record(tmp_path: Path) -> None:
    class Slow:
        async def narrate(self, request: NarratorRequest) -> str:
            await asyncio.sleep(5 if request.turn == 2 else 0)
            return "A reply."

    with MockServer() as server:
        asyncio.run(run_batch(tmp_path / "r", mock_config(server, player_mode="scripted"), envs="iron-man",
                              max_turns=4, narrator=lambda task: Slow(), turn_timeout_s=0.5))
    (rec,) = lines(tmp_path / "r" / "episodes.jsonl")
    assert rec["outcome"] == "ERROR" and "TurnTimeout" in str(rec["error"]) and rec["turns"] == 1


def test_the_ray_executor_uses_only_the_runners_public_interface() -> None:
    """Executors drive the runner through stored_snapshot / on_committed_turn / should_stop / fail_io / settle,
    the calls the local executor makes; a private attribute read or written from outside would let the two drift."""
    import ast

    import ncpbench.executors.ray as ray_executor
    from ncpbench.runner import BatchRunner

    tree = ast.parse(Path(ray_executor.__file__).read_text(encoding="utf-8"))
    private = sorted({f"{ast.unparse(n.value)}.{n.attr}" for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                      and isinstance(n.value, ast.Name) and n.value.id == "runner" and n.attr.startswith("_")})
    assert private == []
    for name in ("stored_snapshot", "on_committed_turn", "should_stop", "fail_io", "settle"):
        assert callable(getattr(BatchRunner, name)), name
