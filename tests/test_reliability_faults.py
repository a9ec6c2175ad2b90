"""Faulty endpoints: a batch against an endpoint that fails 20% of calls in every way it can.

Every episode ends with a real outcome or a recorded error, nothing crashes, and the run record's
call statistics agree with the faults the server says it injected. docs/RELIABILITY.md lists the
guarantees this file proves.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from ncpbench.models.config import RoleConfig, RunConfig
from ncpbench.models.mock_server import FAULT_KINDS, MockConfig, MockServer
from ncpbench.record import EpisodeRecord
from ncpbench.registry import bundled_slugs
from ncpbench.runner import run_batch

TRANSPORT = ("429", "500", "reset", "timeout")
BODY = ("malformed", "empty")
"""A 200 that is not a usable completion: retried like a transport fault, never taken as an answer."""
RETRIED = TRANSPORT + BODY
"""Faults the client retries: each is followed by another attempt, or ends its call as failed."""
MAX_RETRIES = 2
ERROR_TEXT = re.compile(r"^(ModelCallError|MalformedResponse|InvalidOutputError): mock/default: ")


def server_stats(server: MockServer) -> dict[str, Any]:
    with urllib.request.urlopen(server.base_url + "/stats", timeout=10) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


@pytest.mark.slow
def test_a_batch_against_an_endpoint_failing_a_fifth_of_calls_records_every_episode_and_every_retry(
        tmp_path: Path) -> None:
    envs = bundled_slugs()[:25]
    out = tmp_path / "run"
    assert set(TRANSPORT) < set(FAULT_KINDS) and len(FAULT_KINDS) == 8
    # A hang outlasts the whole-call deadline, so a `timeout` fault ends its call; the deadline
    # leaves room for the backoff of the other faults' retries.
    mock = MockConfig(fault_rate=0.2, seed=11, hang_s=2.5, retry_after_s=0.05)
    with MockServer(mock) as server:
        role = RoleConfig(model="mock/default", base_url=server.base_url, timeout_s=2.0, max_retries=MAX_RETRIES)
        config = RunConfig(narrator=role, player=role, auditor=role)  # every role calls the faulty endpoint
        started = time.perf_counter()
        result = asyncio.run(run_batch(out, config, envs=envs, replicates=2, max_turns=2, concurrency=8,
                                        breaker=0))  # every fault becomes a record here
        elapsed = time.perf_counter() - started
        time.sleep(0.2)  # let the server finish counting requests already on the wire
        served = server_stats(server)
    assert elapsed < 60, f"took {elapsed:.0f} s"

    # Every episode ends once, with a real outcome or a recorded error.
    lines = (out / "episodes.jsonl").read_text(encoding="utf-8").splitlines()
    records = [EpisodeRecord.model_validate(json.loads(line)) for line in lines]
    assert sorted(r.episode_id for r in records) == sorted(f"{e}#{i}" for e in envs for i in range(2))
    errors = [r for r in records if r.outcome.value == "ERROR"]
    for r in records:
        if r.outcome.value == "ERROR":
            assert r.error and ERROR_TEXT.match(r.error), r.error
            assert [t.turn for t in r.history] == list(range(len(r.history))) and all(t.committed for t in r.history)
        else:
            assert r.error is None and r.outcome.value in {"SURVIVAL", "SUCCESS", "CONFLICT"}
    assert len(errors) < len(records) // 2, "retries and re-asks absorb most faults"

    # The faults were mixed and at the asked-for rate.
    faults = served["faults"]
    assert set(faults) == set(FAULT_KINDS), faults
    total_faults = sum(faults.values())
    assert 0.15 < total_faults / served["requests"] < 0.25

    # The run record's call statistics agree with what the server injected.
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "complete"
    stats = meta["sessions"][-1]["call_stats"]
    assert stats == result.call_stats
    # Calls abandoned mid-flight when the stats were taken (normally 0), and calls cancelled from
    # outside mid-attempt (a failed audit stage cancels its sibling): their request may or may not
    # have reached the server.
    slack = stats["in_flight"] + stats["cancelled"]
    assert slack <= 2 * len(errors)
    calls = [json.loads(x) for x in (out / "calls.jsonl").read_text().splitlines()]
    assert len(calls) == stats["attempts"], "calls.jsonl holds every attempt, the cancelled ones too"
    retryable = sum(faults.get(k, 0) for k in RETRIED)
    assert abs(stats["attempts"] - served["requests"]) <= slack, "every attempt reached the server, and only those"
    assert abs(stats["retried"] + stats["failed"] - retryable) <= slack, \
        "each transport or body fault was retried, or was the last straw of a failed call"
    assert 0 < stats["recovered"] <= stats["retried"]
    assert abs(stats["malformed"] - sum(faults.get(k, 0) for k in BODY)) <= slack, "every bad body was seen as one"
    assert stats["deadline_exceeded"] <= faults.get("timeout", 0) + slack
    content = sum(faults.get(k, 0) for k in ("truncated", "schema_miss"))
    assert 0 < stats["reasks"] <= stats["invalid_outputs"] <= content, "only a bad answer is re-asked"
    gave_up = sum("InvalidOutputError" in (r.error or "") for r in errors)
    assert stats["invalid_outputs"] - stats["reasks"] >= gave_up, "each give-up follows a last invalid answer"
    print(f"{len(records)} episodes in {elapsed:.1f} s; {len(errors)} errors; server {served}; client {stats}")
