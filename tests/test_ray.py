"""The Ray executor and the Ray vector of envs, on `ray.init(num_cpus=2)` against the loopback mock server.

Skipped when Ray is not installed (`pip install 'ncpbench[ray]'`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="the ray executor needs the ncpbench[ray] extra: pip install 'ncpbench[ray]'")

from ncpbench.executors.ray import RayVectorEnv, split_limit, worker_config, worker_count  # noqa: E402
from ncpbench.models.config import RoleConfig, RunConfig  # noqa: E402
from ncpbench.models.mock_server import MockConfig, MockServer  # noqa: E402
from ncpbench.registry import bundled_slugs  # noqa: E402
from ncpbench.runner import run_batch  # noqa: E402

pytestmark = pytest.mark.slow
TIMING = ("written_at", "started_at", "ended_at", "latency_s", "at", "cached_tokens")
"""Fields that depend on when, not what: timestamps (none is in a record today; dropped in case), and
the cached prompt tokens the mock's prefix-cache model reports, which depend on the order in which
requests from concurrent episodes reach it."""


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """One local Ray instance on 2 CPUs for the module; yields its address for a second driver."""
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def mock_config(server: MockServer, concurrency: int = 64) -> RunConfig:
    r = RoleConfig(model="mock/default", base_url=server.base_url, concurrency=concurrency)
    return RunConfig(narrator=r, player=r, auditor=r, player_mode="scripted")


def records(path: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        d = json.loads(line)
        assert d["episode_id"] not in out, f"{d['episode_id']} recorded twice"
        out[d["episode_id"]] = d
    return out


def untimed(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: untimed(v) for k, v in data.items() if k not in TIMING}
    if isinstance(data, list):
        return [untimed(v) for v in data]
    return data


def call_keys(path: Path) -> collections.Counter[tuple[Any, ...]]:
    """(episode, turn, role, stage, reask, attempt) of every line of calls.jsonl."""
    return collections.Counter(
        (c["episode"], c["turn"], c["role"], c["stage"], c["reask"], c["attempt"])
        for c in map(json.loads, path.read_text().splitlines()))


def worker_pids() -> list[int]:
    """Processes of live EpisodeWorker actors (Ray titles them `ray::EpisodeWorker`)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if b"ray::EpisodeWorker" in (d / "cmdline").read_bytes():
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


def test_the_ray_executor_gives_the_local_executors_records(cluster: str, tmp_path: Path) -> None:
    envs = bundled_slugs()
    with MockServer(MockConfig(conflict_rate=0.3)) as server:
        cfg = mock_config(server)
        local = asyncio.run(run_batch(tmp_path / "local", cfg, envs=envs, replicates=2, max_turns=2, concurrency=16))
        remote = asyncio.run(run_batch(tmp_path / "ray", cfg, envs=envs, replicates=2, max_turns=2, concurrency=16,
                                       executor="ray", ray_workers=2))
    a, b = records(tmp_path / "local" / "episodes.jsonl"), records(tmp_path / "ray" / "episodes.jsonl")
    assert len(a) == 2 * len(envs) and set(a) == set(b)
    assert {r["outcome"] for r in a.values()} >= {"CONFLICT", "SURVIVAL"}  # the comparison covers both endings
    for k in a:
        assert untimed(a[k]) == untimed(b[k]), k
    assert remote.progress.turns == local.progress.turns and remote.progress.tokens == local.progress.tokens
    assert call_keys(tmp_path / "ray" / "calls.jsonl") == call_keys(tmp_path / "local" / "calls.jsonl")
    assert remote.call_stats["calls"] == local.call_stats["calls"]
    meta = json.loads((tmp_path / "ray" / "run.json").read_text())
    assert meta["status"] == "complete" and meta["sessions"][-1]["call_stats"]["calls"] == local.call_stats["calls"]
    assert list((tmp_path / "ray" / "checkpoints").iterdir()) == []


def test_a_killed_worker_loses_no_committed_turn_and_duplicates_no_episode(cluster: str, tmp_path: Path) -> None:
    envs = bundled_slugs()[:6]
    with MockServer(MockConfig(latency_ms=25)) as server:
        cfg = mock_config(server)
        asyncio.run(run_batch(tmp_path / "ref", cfg, envs=envs, max_turns=6))
        result: dict[str, Any] = {}

        def run() -> None:
            try:
                result["ok"] = asyncio.run(run_batch(tmp_path / "r", cfg, envs=envs, max_turns=6, concurrency=6,
                                                     executor="ray", ray_workers=2))
            except BaseException as e:
                result["error"] = e

        thread = threading.Thread(target=run)
        thread.start()
        checkpoints = tmp_path / "r" / "checkpoints"
        deadline = time.monotonic() + 60
        # Every episode in flight with a committed turn: whichever worker dies, it had committed turns to lose.
        while time.monotonic() < deadline and not (checkpoints.is_dir() and len(list(checkpoints.glob("*.json"))) == len(envs)):
            time.sleep(0.02)
        committed = {}
        for p in checkpoints.glob("*.json"):
            with contextlib.suppress(FileNotFoundError):  # an episode may finish meanwhile
                committed[p.name] = json.loads(p.read_text())["snapshot"]["state"]["turn"]
        pids = worker_pids()
        assert len(committed) >= len(envs) - 1 and pids, "the batch never got going"
        os.kill(pids[0], signal.SIGKILL)
        thread.join(120)
    assert "error" not in result, result.get("error")
    assert result["ok"].progress.done == len(envs)
    got, ref = records(tmp_path / "r" / "episodes.jsonl"), records(tmp_path / "ref" / "episodes.jsonl")
    assert set(got) == set(ref)
    for k in ref:  # every episode whole: none restarted differently, none cut short
        assert untimed(got[k]) == untimed(ref[k]), k
    for name, turn in committed.items():  # no checkpointed episode went backwards
        env_id = name.removesuffix(".json").replace("__", "#")
        assert got[env_id]["turns"] >= turn
    # A committed turn was never played again: each call of each turn is logged once, as in the reference
    # (an episode restarted from scratch would log its early turns twice).
    keys = call_keys(tmp_path / "r" / "calls.jsonl")
    assert max(keys.values()) == 1 and keys == call_keys(tmp_path / "ref" / "calls.jsonl")
    assert list((tmp_path / "r" / "checkpoints").iterdir()) == []


DRIVER = textwrap.dedent("""
    import asyncio, sys
    from pathlib import Path
    from ncpbench.models.config import RoleConfig, RunConfig
    from ncpbench.runner import run_batch
    out, base_url, address, envs = sys.argv[1:5]
    r = RoleConfig(model="mock/default", base_url=base_url)
    cfg = RunConfig(narrator=r, player=r, auditor=r, player_mode="scripted")
    asyncio.run(run_batch(Path(out), cfg, envs=envs, max_turns=6, concurrency=4, executor="ray",
                          ray_address=address, ray_workers=1))
""")


def test_a_killed_driver_resumes_from_its_checkpoints(cluster: str, tmp_path: Path) -> None:
    envs = bundled_slugs()[:4]
    with MockServer(MockConfig(latency_ms=40)) as server:
        cfg = mock_config(server)
        asyncio.run(run_batch(tmp_path / "ref", cfg, envs=envs, max_turns=6))
        out = tmp_path / "r"
        driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(out), server.base_url, cluster, ",".join(envs)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 90
        try:
            while time.monotonic() < deadline and not (
                    (out / "checkpoints").is_dir() and len(list((out / "checkpoints").glob("*.json"))) >= 2):
                time.sleep(0.02)
        finally:
            driver.send_signal(signal.SIGKILL)
            driver.wait(30)
        assert len(list((out / "checkpoints").glob("*.json"))) >= 2, "the driver was killed before any checkpoint"
        first = (out / "episodes.jsonl").read_text().count("\n") if (out / "episodes.jsonl").exists() else 0
        assert first < len(envs)
        kept = {json.loads(p.read_text())["episode_id"]: len(json.loads(p.read_text())["snapshot"]["history"])
                for p in (out / "checkpoints").glob("*.json")}
        resumed = asyncio.run(run_batch(out, cfg, envs=envs, max_turns=6, concurrency=4, executor="ray",
                                        ray_workers=2))
    assert resumed.progress.done == len(envs) and len(resumed.records) == len(envs) - first
    got, ref = records(out / "episodes.jsonl"), records(tmp_path / "ref" / "episodes.jsonl")
    assert set(got) == set(ref) and all(untimed(got[k]) == untimed(ref[k]) for k in ref)
    # The resumed session played only the turns the checkpoints did not hold.
    unfinished = [r.episode_id for r in resumed.records]
    assert resumed.progress.turns == sum(len(ref[k]["history"]) - kept.get(k, 0) for k in unfinished)
    assert json.loads((out / "run.json").read_text())["status"] == "complete"


def test_endpoint_limits_are_split_across_workers_and_never_exceeded() -> None:
    cfg = RunConfig(narrator=RoleConfig(concurrency=5), auditor=RoleConfig(concurrency=3), player_mode="scripted")
    n = worker_count(cfg, concurrency=8, wanted=4)
    assert n == 3  # never more workers than the smallest limit: every worker gets at least one slot
    for role, limit in (("narrator", 5), ("auditor", 3)):
        shares = [worker_config(cfg, n, i).role(role).concurrency for i in range(n)]
        assert sum(shares) == limit and min(shares) >= 1
    assert [split_limit(7, 3, i) for i in range(3)] == [3, 2, 2]


def test_import_ncpbench_does_not_import_ray() -> None:
    code = "import sys, ncpbench, ncpbench.runner, ncpbench.rl, ncpbench.executors; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_ray_vector_env_steps_like_gymnasiums_sync_vector_env(cluster: str) -> None:
    import functools

    import gymnasium as gym
    import numpy as np
    from ncpbench.agents import ScriptedPlayer
    from ncpbench.auditors import ReplayAuditor

    from ncpbench.env import NarrativeEnv

    # Factories the workers can unpickle (by reference to ncpbench, not to this test module).
    fns = [functools.partial(NarrativeEnv, s, player=ScriptedPlayer(), auditor=ReplayAuditor(advance=True), max_turns=2)
           for s in ("iron-man", "zombieland", "iron-man")]
    remote, local = RayVectorEnv(fns), gym.vector.SyncVectorEnv(fns)
    try:
        assert remote.num_envs == 3 and remote.single_action_space == local.single_action_space
        obs_r, _ = remote.reset(seed=7)
        obs_l, _ = local.reset(seed=7)
        assert obs_r.keys() == obs_l.keys() and all(
            list(np.asarray(obs_r[k])) == list(np.asarray(obs_l[k])) for k in obs_l)
        ended = False
        for step in range(5):  # max_turns=2: the envs end and autoreset (NEXT_STEP) on the step after
            actions = tuple(f"Step {step}: the story goes on for env {i}." for i in range(3))
            r = remote.step(actions)
            s = local.step(actions)
            for got, want in zip(r[1:4], s[1:4], strict=True):
                assert np.array_equal(got, want), (step, got, want)
            assert all(list(np.asarray(r[0][k])) == list(np.asarray(s[0][k])) for k in s[0])
            ended = ended or bool(np.any(r[2] | r[3]))
        assert ended
        assert len(set(remote.worker_pids())) == 3 and os.getpid() not in remote.worker_pids()
    finally:
        remote.close()
        local.close()


def test_an_endpoint_limit_holds_across_the_cluster(cluster: str, tmp_path: Path, hostile: Any) -> None:
    from conftest import chat_answer

    from ncpbench.models.mock_server import answer_for

    lock, state = threading.Lock(), {"now": 0, "max": 0}

    def route(method: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, object]]:
        if method == "GET":
            return 200, {"object": "list", "data": [{"id": "mock/default", "object": "model"}]}
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
        time.sleep(0.03)
        with lock:
            state["now"] -= 1
        return 200, chat_answer(answer_for(body, MockConfig())[1])

    server = hostile(route)
    r = RoleConfig(model="mock/default", base_url=server.base_url, concurrency=3)
    cfg = RunConfig(narrator=r, player=r, auditor=r, player_mode="scripted")
    result = asyncio.run(run_batch(tmp_path / "r", cfg, envs=bundled_slugs()[:8], max_turns=2, concurrency=8,
                                   executor="ray", ray_workers=2))
    assert result.progress.done == 8 and result.progress.errors == 0
    assert state["max"] == 3  # the limit is the cluster's, not each worker's (2 workers x 3 would be 6)


def test_the_cli_runs_a_batch_on_ray_and_refuses_ray_options_without_it(cluster: str, tmp_path: Path) -> None:
    base = [sys.executable, "-m", "ncpbench", "run", "--envs", "iron-man,zombieland", "--mock", "--player-mode",
            "scripted", "--turns", "2", "--no-progress"]
    bad = subprocess.run([*base, "--out", str(tmp_path / "bad"), "--ray-workers", "2"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--executor ray" in bad.stderr and not (tmp_path / "bad").exists()
    ok = subprocess.run([*base, "--out", str(tmp_path / "r"), "--executor", "ray", "--ray-address", cluster,
                         "--ray-workers", "1"], capture_output=True, text=True, timeout=180)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert len(records(tmp_path / "r" / "episodes.jsonl")) == 2


def test_a_budget_stops_ray_workers_between_turns_and_a_rerun_finishes(cluster: str, tmp_path: Path) -> None:
    envs = bundled_slugs()[:4]
    with MockServer(MockConfig(latency_ms=10)) as server:
        cfg = mock_config(server)
        stopped = asyncio.run(run_batch(tmp_path / "r", cfg, envs=envs, max_turns=8, concurrency=4, executor="ray",
                                        ray_workers=2, max_total_tokens=60_000))
        assert stopped.progress.stopped_by_budget and stopped.progress.done < len(envs)
        assert json.loads((tmp_path / "r" / "run.json").read_text())["status"] == "stopped_by_budget"
        assert list((tmp_path / "r" / "checkpoints").glob("*.json"))  # the stopped episodes wait there
        finished = asyncio.run(run_batch(tmp_path / "r", cfg, envs=envs, max_turns=8, concurrency=4,
                                         executor="ray", ray_workers=2))
        asyncio.run(run_batch(tmp_path / "ref", cfg, envs=envs, max_turns=8))
    assert finished.progress.done == len(envs)
    got, ref = records(tmp_path / "r" / "episodes.jsonl"), records(tmp_path / "ref" / "episodes.jsonl")
    assert set(got) == set(ref) and all(untimed(got[k]) == untimed(ref[k]) for k in ref)
