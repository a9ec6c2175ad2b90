"""Runs you can trust: never mix setups, never lose or invent an episode, stop cleanly.

Over real HTTP to the mock server (and a hostile loopback server from conftest), through
`run_batch` and the real CLI.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Answer, HostileServer, error_body

from ncpbench.cli import main
from ncpbench.jsonl import quarantine_path
from ncpbench.models.config import RoleConfig, RunConfig
from ncpbench.models.mock_server import MockConfig, MockServer
from ncpbench.preflight import (
    EXIT_BREAKER,
    EXIT_BUDGET,
    EXIT_ERRORS,
    EXIT_IO,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_SIGTERM,
    PreflightError,
)
from ncpbench.reports import MOCK_NOTICE, build_report, read_episodes
from ncpbench.runner import RunError, RunIOError, planned_count, read_records, run_batch

Start = Callable[[Callable[[str, str, dict[str, object]], Answer]], HostileServer]
BUNDLED = Path(__file__).resolve().parents[1] / "environments"


def cfg(server: MockServer, model: str = "mock/default", **kw: Any) -> RunConfig:
    r = RoleConfig(model=model, base_url=server.base_url)
    return RunConfig(narrator=r, player=RoleConfig(model="mock/default", base_url=server.base_url),
                     auditor=RoleConfig(model="mock/default", base_url=server.base_url), **kw)


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ncpbench", *args], capture_output=True, text=True, timeout=timeout)


# -- run identity ---------------------------------------------------------------------------------


def test_run_json_and_every_record_pin_the_identity(tmp_path: Path) -> None:
    with MockServer() as server:
        asyncio.run(run_batch(tmp_path / "r", cfg(server), envs="iron-man", max_turns=1))
    meta = json.loads((tmp_path / "r" / "run.json").read_text())
    ident = meta["identity"]
    assert ident["ncpbench_version"] == meta["ncpbench_version"] and ident["protocol"]["name"] == "published"
    assert ident["roles"]["narrator"] == {"model": "mock/default", "temperature": None, "top_p": None,
                                          "max_tokens": None, "seed": None, "structured": "auto"}
    assert len(ident["dataset_hash"]) == 16 and {"narrator", "player", "auditor:fact_update",
                                                 "auditor:double_check"} <= set(ident["prompt_hashes"])
    (record,) = lines(tmp_path / "r" / "episodes.jsonl")
    assert record["config"]["run_identity"] == ident, "a record alone says which run it belongs to"


def test_resume_refuses_a_changed_model_even_without_run_json(tmp_path: Path) -> None:
    with MockServer() as server:
        asyncio.run(run_batch(tmp_path / "r", cfg(server), envs="iron-man", max_turns=1))
        (tmp_path / "r" / "run.json").unlink()
        with pytest.raises(RunError, match=r"\(episodes\.jsonl\): roles\.narrator\.model: mock/default -> mock/other"):
            asyncio.run(run_batch(tmp_path / "r", cfg(server, "mock/other"), envs="iron-man", max_turns=1))
        again = asyncio.run(run_batch(tmp_path / "r", cfg(server), envs="iron-man", max_turns=1))
    assert again.progress.skipped == 1, "the same setup still resumes"


def test_resume_refuses_a_changed_dataset_spec_even_without_run_json(tmp_path: Path) -> None:
    spec = tmp_path / "iron-man.yaml"
    spec.write_text((BUNDLED / "iron-man.yaml").read_text())
    with MockServer() as server:
        asyncio.run(run_batch(tmp_path / "r", cfg(server), envs="iron-man", max_turns=1, dataset=str(spec)))
        (tmp_path / "r" / "run.json").unlink()
        spec.write_text(spec.read_text().replace("title: Iron Man", "title: Iron Man (edited)"))
        with pytest.raises(RunError, match=r"dataset_hash: \w+ -> \w+"):
            asyncio.run(run_batch(tmp_path / "r", cfg(server), envs="iron-man", max_turns=1, dataset=str(spec)))


def test_resume_refuses_a_changed_prompt_function_even_with_only_checkpoints(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ncpbench.auditors import prompts

    with MockServer() as server:
        stopped = asyncio.run(run_batch(tmp_path / "r", cfg(server), envs="iron-man,alien", max_turns=3,
                                        max_total_tokens=1))
        assert stopped.progress.stopped_by_budget and not (tmp_path / "r" / "episodes.jsonl").read_text()
        (tmp_path / "r" / "run.json").unlink()
        original = prompts.fence
        # a change in a prompt *function* (not an upper-case constant): the rendered prompt differs
        monkeypatch.setattr(prompts, "fence", lambda text, tag="narrator_reply": original(text, tag) + "\n")
        with pytest.raises(RunError, match=r"\(checkpoints/.*\): prompt_hashes\.auditor:\w+: \w+ -> \w+"):
            asyncio.run(run_batch(tmp_path / "r", cfg(server), envs="iron-man,alien", max_turns=3))


def test_a_changed_protocol_or_setting_is_refused_by_the_cli_with_exit_3_naming_the_field(tmp_path: Path) -> None:
    with MockServer() as server:
        base = ["run", "--envs", "iron-man", "--max-turns", "1", "--out", str(tmp_path / "r"), "--no-progress",
                "--player-mode", "scripted", "--narrator", "mock/default", "--narrator-base-url", server.base_url,
                "--auditor", "mock/default", "--auditor-base-url", server.base_url]
        assert cli(*base).returncode == EXIT_OK
        (tmp_path / "r" / "run.json").unlink()
        refused = cli(*base, "--protocol", "grounded")
        assert refused.returncode == EXIT_REFUSED
        err = [x for x in refused.stderr.splitlines() if x.startswith("ncpbench: ")]
        assert len(err) == 1 and "protocol.name: published -> grounded" in err[0] and "Traceback" not in refused.stderr
        sampled = cli(*base, "--narrator-temperature", "0.3")
        assert sampled.returncode == EXIT_REFUSED and "roles.narrator.temperature: 0.6 -> 0.3" in sampled.stderr
        timed = cli(*base, "--turn-timeout", "30")  # it decides which episodes end as ERROR
        assert timed.returncode == EXIT_REFUSED and "batch.turn_timeout_s: 600.0 -> 30.0" in timed.stderr


def test_the_turn_timeout_is_in_run_json_and_a_different_one_is_refused_even_without_run_json(tmp_path: Path) -> None:
    out = tmp_path / "r"
    with MockServer() as server:
        asyncio.run(run_batch(out, cfg(server), envs="iron-man", max_turns=1, turn_timeout_s=30))
        meta = json.loads((out / "run.json").read_text())
        assert meta["batch"]["turn_timeout_s"] == meta["identity"]["batch"]["turn_timeout_s"] == 30.0
        with pytest.raises(RunError, match=r"\(run\.json\): batch\.turn_timeout_s: 30\.0 -> 31\.0"):
            asyncio.run(run_batch(out, cfg(server), envs="iron-man", max_turns=1, turn_timeout_s=31))
        (out / "run.json").unlink()
        with pytest.raises(RunError, match=r"\(episodes\.jsonl\): batch\.turn_timeout_s: 30\.0 -> null"):
            asyncio.run(run_batch(out, cfg(server), envs="iron-man", max_turns=1, turn_timeout_s=None))
        again = asyncio.run(run_batch(out, cfg(server), envs="iron-man", max_turns=1, turn_timeout_s=30))
    assert again.progress.skipped == 1, "the same limit still resumes"


def test_the_python_api_runs_the_preflight_before_anything_is_created(
        hostile: Start, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    hosted = RunConfig(narrator=RoleConfig(model="openai/gpt-4o-mini"), player_mode="scripted")
    with pytest.raises(PreflightError, match="the API key variable OPENAI_API_KEY is not set"):
        asyncio.run(run_batch(tmp_path / "r", hosted, envs="iron-man", max_turns=1))
    assert not (tmp_path / "r").exists(), "no folder, no ERROR record"
    server = hostile(refuse_chat)
    refused = RunConfig(narrator=RoleConfig(model="openai/m", base_url=server.base_url), player_mode="scripted")
    with pytest.raises(PreflightError, match=r"answered HTTP 401"):
        asyncio.run(run_batch(tmp_path / "r", refused, envs="iron-man", max_turns=1))
    assert not (tmp_path / "r").exists() and not [p for _, p in server.requests if p.endswith("/chat/completions")]
    # probe=False skips the probe only (an endpoint that cannot be probed): the run meets the 401 itself
    skipped = asyncio.run(run_batch(tmp_path / "r", refused, envs="iron-man", max_turns=1, probe=False, breaker=0))
    assert [r.outcome.value for r in skipped.records] == ["ERROR"]
    with pytest.raises(PreflightError, match="OPENAI_API_KEY is not set"):  # the roles are checked all the same
        asyncio.run(run_batch(tmp_path / "r2", hosted, envs="iron-man", max_turns=1, probe=False))


# -- no silent mock ---------------------------------------------------------------------------------


def test_mock_roles_are_tagged_and_every_report_says_it_is_not_a_benchmark(tmp_path: Path) -> None:
    assert main(["run", "--envs", "iron-man", "--max-turns", "1", "--mock", "--player-mode", "scripted",
                 "--out", str(tmp_path / "r"), "--no-progress"]) == EXIT_OK
    meta = json.loads((tmp_path / "r" / "run.json").read_text())
    assert meta["mock_roles"] == ["narrator", "auditor"] and meta["config"]["mock_roles"] == ["narrator", "auditor"]
    (record,) = lines(tmp_path / "r" / "episodes.jsonl")
    assert record["config"]["mock_roles"] == ["narrator", "auditor"]
    index = build_report([tmp_path / "r"], tmp_path / "rep")
    for name in ("comparison.md", "genres.md", "envs.md", "index.html"):
        assert MOCK_NOTICE in (tmp_path / "rep" / name).read_text(), name
    metrics = json.loads((tmp_path / "rep" / "metrics.json").read_text())
    assert metrics["runs"][0]["benchmark_result"] is False and index.exists()


def test_real_models_are_not_tagged(tmp_path: Path) -> None:
    with MockServer() as server:
        r = RoleConfig(model="openai/some-model", base_url=server.base_url)
        asyncio.run(run_batch(tmp_path / "r", RunConfig(narrator=r, player=r, auditor=r), envs="iron-man",
                              max_turns=1))
    assert json.loads((tmp_path / "r" / "run.json").read_text())["mock_roles"] == []
    build_report([tmp_path / "r"], tmp_path / "rep")
    assert MOCK_NOTICE not in (tmp_path / "rep" / "comparison.md").read_text()


# -- exit codes and the circuit breaker -------------------------------------------------------------


def refuse_chat(method: str, path: str, body: dict[str, object]) -> Answer:
    return 401, error_body("Incorrect API key provided")


def breaker_args(url: str, out: Path, *extra: str) -> list[str]:
    return ["run", "--envs", "iron-man,alien,heat,up,zombieland,the-bourne-identity,mission-impossible,casino-royale", "--max-turns", "2", "--out", str(out),
            "--narrator", "openai/m", "--narrator-base-url", url, "--auditor", "mock/default", "--player-mode",
            "scripted", "--concurrency", "1", "--skip-preflight", "--no-progress", *extra]


def test_repeated_identical_infrastructure_errors_trip_the_breaker_with_one_message(
        hostile: Start, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server = hostile(refuse_chat)
    code = main(breaker_args(server.base_url, tmp_path / "r", "--circuit-breaker", "3"))
    err = capsys.readouterr().err
    assert code == EXIT_BREAKER
    assert err.count("ncpbench: stopped: 3 episodes in a row failed") == 1 and "HTTP 401" in err
    assert (tmp_path / "r" / "episodes.jsonl").read_text() == "", "no ERROR records for a dead endpoint"
    assert json.loads((tmp_path / "r" / "run.json").read_text())["status"] == "stopped_by_breaker"
    chats = [p for m, p in server.requests if p.endswith("/chat/completions")]
    assert len(chats) == 3, "the batch stopped instead of failing all 8 episodes"


def test_without_the_breaker_each_failure_is_an_error_record_and_exit_4(
        hostile: Start, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server = hostile(refuse_chat)
    assert main(breaker_args(server.base_url, tmp_path / "r", "--circuit-breaker", "0")) == EXIT_ERRORS
    assert "8 episode(s) ended as ERROR" in capsys.readouterr().err
    assert [r["outcome"] for r in lines(tmp_path / "r" / "episodes.jsonl")] == ["ERROR"] * 8


def test_a_tripped_batch_resumes_once_the_endpoint_is_fixed(hostile: Start, tmp_path: Path) -> None:
    server = hostile(refuse_chat)
    assert main(breaker_args(server.base_url, tmp_path / "r", "--circuit-breaker", "2")) == EXIT_BREAKER
    with MockServer() as fixed:  # same model names, a working endpoint (where it lives is not identity)
        args = breaker_args(fixed.base_url, tmp_path / "r", "--circuit-breaker", "2")
        assert main(args) == EXIT_OK
    records = lines(tmp_path / "r" / "episodes.jsonl")
    assert len(records) == 8 and all(r["outcome"] != "ERROR" for r in records)


# -- bounds -------------------------------------------------------------------------------------------


def test_a_billion_replicates_stream_in_bounded_memory(tmp_path: Path) -> None:
    # The child reports its own peak RSS, so earlier children of this test process do not count.
    probe = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(p.returncode)")
    out = tmp_path / "r"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", probe, sys.executable, "-m", "ncpbench", "run", "--envs", "iron-man",
                           "--replicates", "1000000000", "--max-turns", "1", "--mock", "--player-mode", "scripted",
                           "--max-total-tokens", "1", "--concurrency", "4", "--out", str(out), "--no-progress"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == EXIT_BUDGET, proc.stderr
    peak_kb = int(proc.stdout.strip().splitlines()[-1])
    assert peak_kb < 200 * 1024, f"peak RSS {peak_kb} KB"
    assert time.monotonic() - started < 120
    assert json.loads((out / "run.json").read_text())["episodes_planned"] == 1_000_000_000


def test_planning_is_lazy_and_counts_shards_without_iterating() -> None:
    from ncpbench.runner import BatchSettings, plan

    s = BatchSettings(envs=["a", "b", "c"], replicates=10**12, shard=(1, 7))
    assert planned_count(s) == (3 * 10**12) // 7 + (1 if 1 < (3 * 10**12) % 7 else 0)
    first = next(iter(plan(s)))
    assert first.episode_id == "a#1"
    small = BatchSettings(envs=["a", "b", "c"], replicates=5, shard=(2, 4))
    assert planned_count(small) == len(list(plan(small)))


def test_torn_and_undecodable_lines_are_quarantined_and_read_the_same_by_runner_and_report(tmp_path: Path) -> None:
    out = tmp_path / "r"
    with MockServer() as server:
        config = cfg(server, player_mode="scripted")
        asyncio.run(run_batch(out, config, envs="iron-man,alien,heat", max_turns=1))
        episodes = out / "episodes.jsonl"
        good = episodes.read_bytes().splitlines(keepends=True)
        damaged = good[0] + b"\xff\xfe not utf-8 at all\n" + good[1] + b'{"episode_id": "x#0", "outcome": "SUCCESS"}\n'
        damaged += b'["a list"]\n' + good[2][:120]  # the last one torn by a kill
        episodes.write_bytes(damaged)
        records, notes = read_episodes(episodes)
        kept = {json.loads(good[0])["episode_id"], json.loads(good[1])["episode_id"]}  # finishing order varies
        assert set(read_records(episodes)) == {r.episode_id for r in records} == kept, \
            "the runner and the report accept the same lines"
        assert any("incomplete last line" in n for n in notes) and any("not UTF-8" in n for n in notes)
        assert any("not an episode record" in n for n in notes) and len(notes) == 4
        again = asyncio.run(run_batch(out, config, envs="iron-man,alien,heat", max_turns=1))
    quarantined = quarantine_path(episodes).read_bytes()
    for bad in (b"not utf-8", b'"x#0"', b'["a list"]', good[2][:120]):
        assert bad in quarantined, "moved, not deleted"
    assert sorted(r["episode_id"] for r in lines(episodes)) == ["alien#0", "heat#0", "iron-man#0"]
    assert len(again.records) == 1, "only the torn episode ran again"


def test_a_checkpoint_of_the_wrong_shape_is_ignored_with_a_warning(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "iron-man__0.json").write_text(json.dumps({"episode_id": "iron-man#0",
                                                                       "snapshot": {"state": 5, "history": "x"}}))
    (out / "checkpoints" / "alien__0.json").write_text("{not json")
    from ncpbench.logs import configure

    configure("WARNING")  # log to this test's captured stderr
    with MockServer() as server:
        result = asyncio.run(run_batch(out, cfg(server), envs="iron-man,alien", max_turns=2))
    assert sorted(r.outcome.value for r in result.records) == ["SURVIVAL", "SURVIVAL"], "restarted, not ERROR"
    assert capsys.readouterr().err.count("bad_checkpoint_ignored") == 2


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES], ids=["disk-full", "permission"])
def test_a_full_disk_stops_the_run_with_one_line_and_leaves_it_resumable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], code: int) -> None:
    import ncpbench.runner as runner

    real = runner.append_line
    calls = [0]

    def fails_on_second_append(handle: Any, data: dict[str, Any]) -> None:
        calls[0] += 1
        if calls[0] >= 2:
            raise OSError(code, os.strerror(code))
        real(handle, data)

    out = tmp_path / "r"
    with MockServer() as server:
        args = ["run", "--envs", "iron-man,alien,heat", "--max-turns", "1", "--out", str(out), "--no-progress",
                "--concurrency", "1", "--player-mode", "scripted", "--narrator", "mock/default", "--narrator-base-url",
                server.base_url, "--auditor", "mock/default", "--auditor-base-url", server.base_url]
        monkeypatch.setattr(runner, "append_line", fails_on_second_append)
        assert main(args) == EXIT_IO
        err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("ncpbench: ")]
        assert len(err) == 1 and "rerun the same command to resume" in err[0]
        assert json.loads((out / "run.json").read_text())["status"] == "stopped_by_io_error"
        assert [r["outcome"] for r in lines(out / "episodes.jsonl")] == ["SURVIVAL"], "no ERROR record for the disk"
        monkeypatch.setattr(runner, "append_line", real)
        assert main(args) == EXIT_OK
    assert sorted(r["episode_id"] for r in lines(out / "episodes.jsonl")) == ["alien#0", "heat#0", "iron-man#0"]


def test_a_checkpoint_that_cannot_be_written_stops_the_run_without_an_error_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ncpbench.runner as runner

    real = runner.atomic_write

    def full_for_checkpoints(path: Path, text: str) -> None:
        if path.parent.name == "checkpoints":
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, text)

    monkeypatch.setattr(runner, "atomic_write", full_for_checkpoints)
    with MockServer() as server, pytest.raises(RunIOError, match="the disk is full"):
        asyncio.run(run_batch(tmp_path / "r", cfg(server), envs="iron-man,alien", max_turns=3, concurrency=1))
    assert (tmp_path / "r" / "episodes.jsonl").read_text() == ""


@pytest.mark.slow
def test_sigterm_stops_like_ctrl_c_and_the_same_command_resumes(tmp_path: Path) -> None:
    out = tmp_path / "r"
    with MockServer(MockConfig(latency_ms=60)) as server:
        args = [sys.executable, "-m", "ncpbench", "run", "--envs", "iron-man,alien,heat", "--max-turns", "4",
                "--out", str(out), "--concurrency", "1", "--player-mode", "scripted", "--no-progress",
                "--narrator", "mock/default", "--narrator-base-url", server.base_url,
                "--auditor", "mock/default", "--auditor-base-url", server.base_url]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 90
        while not list((out / "checkpoints").glob("*.json")) and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == EXIT_SIGTERM, err
        assert "ncpbench: stopped; rerun the same command to resume" in err and "Traceback" not in err
        meta = json.loads((out / "run.json").read_text())
        assert meta["status"] == "interrupted" and meta["ended_at"], "run.json is not left running"
        assert list((out / "checkpoints").glob("*.json")), "in-flight work kept for the rerun"
        resumed = subprocess.run(args, capture_output=True, text=True, timeout=240)
    assert resumed.returncode == EXIT_OK, resumed.stderr
    assert sorted(r["episode_id"] for r in lines(out / "episodes.jsonl")) == ["alien#0", "heat#0", "iron-man#0"]


def test_no_progress_prints_no_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--envs", "iron-man", "--max-turns", "1", "--mock", "--player-mode", "scripted",
                 "--out", str(tmp_path / "r"), "--no-progress"]) == EXIT_OK
    captured = capsys.readouterr()
    assert "outcomes" not in captured.err + captured.out and "1/1 episodes (complete)" in captured.out


def test_a_single_run_is_cut_at_its_turn_timeout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with MockServer(MockConfig(latency_ms=4000)) as server:
        started = time.monotonic()
        code = main(["run", "iron-man", "--turns", "3", "--player-mode", "scripted", "--turn-timeout", "0.5",
                     "--narrator", "mock/default", "--narrator-base-url", server.base_url, "--auditor", "mock/default",
                     "--auditor-base-url", server.base_url, "--out", str(tmp_path / "rec.json"), "--quiet"])
        elapsed = time.monotonic() - started
    assert code == EXIT_ERRORS and elapsed < 4, "the turn was cut, not waited for"
    record = json.loads((tmp_path / "rec.json").read_text())
    assert record["outcome"] == "ERROR" and record["error"].startswith("TurnTimeout")
    assert record["config"]["run_identity"]["batch"]["envs"] == ["iron-man"], "a single record is pinned too"
    assert "outcome ERROR" in capsys.readouterr().out
