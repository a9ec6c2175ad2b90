"""calls.jsonl: one fsynced line per model call attempt, labelled, never rewritten on resume."""

from __future__ import annotations

import asyncio
import io
import json
import re
from pathlib import Path

import structlog
from pydantic import BaseModel

from ncpbench.logs import configure
from ncpbench.models import CallEntry, CallLog, call_context, current_context, read_calls
from ncpbench.models.client import ModelClient
from ncpbench.models.config import RoleConfig, RunConfig
from ncpbench.models.mock_server import MockConfig, MockServer
from ncpbench.runner import run_batch

STAGES = {"fact_update", "conflict_check", "double_check", "trajectory_check", "commitment_status"}


class Answer(BaseModel):
    add: list[str]
    negate: list[str]


def mock_config(server: MockServer, **kw: object) -> RunConfig:
    r = RoleConfig(model="mock/default", base_url=server.base_url, **kw)  # type: ignore[arg-type]
    return RunConfig(narrator=r, player=r, auditor=r)


def test_a_batch_logs_every_model_call_with_episode_turn_role_stage_usage_and_response(tmp_path: Path) -> None:
    with MockServer() as server:
        result = asyncio.run(run_batch(tmp_path / "r", mock_config(server), envs="iron-man,zombieland", max_turns=2))
    calls = read_calls(tmp_path / "r" / "calls.jsonl")
    assert len(calls) == server.stats.requests == result.call_stats["attempts"], "one line per HTTP request"
    assert {c.episode for c in calls} == {"iron-man#0", "zombieland#0"}
    assert {c.role for c in calls} == {"narrator", "player", "auditor"}
    assert {c.stage for c in calls if c.role == "auditor"} <= STAGES and all(
        c.stage is None for c in calls if c.role != "auditor")
    assert {c.turn for c in calls} == {0, 1, 2}
    assert all(c.outcome == "ok" and c.attempt == 1 and c.finish_reason == "stop" for c in calls)
    assert all(re.fullmatch(r"[0-9a-f]{64}", c.messages_sha256) and c.latency_s is not None for c in calls)
    assert all(c.usage is not None and c.usage.prompt_tokens > 0 and c.response for c in calls)
    # The raw body is kept: the content inside it is what the record holds.
    narrated = [json.loads(c.response or "")["choices"][0]["message"]["content"] for c in calls if c.role == "narrator"]
    assert len(narrated) == 2 * 3  # two episodes, the opening and two turns


def test_retries_and_reasks_are_separate_lines_with_their_reasons(tmp_path: Path) -> None:
    lines: list[CallEntry] = []
    seen: list[int] = []

    def check(out: Answer) -> list[str]:
        seen.append(1)
        return ["negate: 'f_9' is not an active fact id"] if len(seen) == 1 else []

    with MockServer(MockConfig(fault_rate=0.5, fault_kinds=("429",), seed=1)) as server:
        async def go() -> None:
            client = ModelClient(call_sink=lines.append)
            with call_context(episode="e#0", turn=3, role="auditor"):
                await client.structured(RoleConfig(model="mock/default", base_url=server.base_url, max_retries=9),
                                        [{"role": "user", "content": "Audit stage: fact_update\nTurn: 3"}], Answer,
                                        name="fact_update", check=check)
            await client.aclose()

        asyncio.run(go())
    assert len(lines) == server.stats.requests
    assert all((c.episode, c.turn, c.role, c.stage) == ("e#0", 3, "auditor", "fact_update") for c in lines)
    throttled = [c for c in lines if c.outcome == "http 429"]
    assert throttled and len(throttled) == server.stats.faults["429"] and all(c.retry and c.status == 429 for c in throttled)
    asks = [c for c in lines if c.outcome == "ok"]
    assert [c.reask for c in asks] == [0, 1]
    assert asks[0].reask_reason is None and "f_9" in (asks[1].reask_reason or "")
    assert asks[0].messages_sha256 != asks[1].messages_sha256, "the re-ask is a different request"
    # The attempts of one logical call share its id; the re-ask is a new call.
    assert len({c.call_id for c in lines}) == 2


def test_a_resumed_run_appends_to_calls_jsonl_and_never_rewrites_a_committed_line(tmp_path: Path) -> None:
    out = tmp_path / "r"
    with MockServer() as server:
        cfg = mock_config(server)
        first = asyncio.run(run_batch(out, cfg, envs="iron-man", replicates=3, max_turns=3, concurrency=1,
                                      max_total_tokens=1))
        assert first.progress.stopped_by_budget
        before = (out / "calls.jsonl").read_bytes()
        asyncio.run(run_batch(out, cfg, envs="iron-man", replicates=3, max_turns=3, concurrency=1))
    after = (out / "calls.jsonl").read_bytes()
    assert before and after.startswith(before), "committed lines stay byte for byte"
    calls = read_calls(out / "calls.jsonl")
    assert len(calls) == server.stats.requests
    assert len({(c.call_id, c.attempt) for c in calls}) == len(calls), "no line is written twice"
    assert {c.episode for c in calls} == {"iron-man#0", "iron-man#1", "iron-man#2"}


def test_a_torn_last_line_is_cut_before_the_log_appends(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    path.write_text('{"whole": 1}\n{"torn": ')
    with CallLog(path) as log:
        log(CallEntry(at="t", call_id="c", episode=None, turn=None, role=None, stage=None, model="m", attempt=1,
                      outcome="ok", latency_s=0.1, messages_sha256="0" * 64))
    assert path.read_text().splitlines()[0] == '{"whole": 1}'
    assert len(path.read_text().splitlines()) == 2 and path.read_text().endswith("\n")


def test_call_context_nests_and_is_private_to_concurrent_tasks() -> None:
    async def stage(name: str) -> tuple[str | None, str | None, int | None]:
        with call_context(stage=name):
            await asyncio.sleep(0.01)
            ctx = current_context()
            return ctx.episode, ctx.stage, ctx.turn

    async def go() -> list[tuple[str | None, str | None, int | None]]:
        with call_context(episode="e#1", turn=4):
            return list(await asyncio.gather(stage("fact_update"), stage("conflict_check")))

    assert asyncio.run(go()) == [("e#1", "fact_update", 4), ("e#1", "conflict_check", 4)]
    assert current_context().episode is None, "the labels end with the block"


def test_the_call_log_events_carry_episode_turn_and_stage() -> None:
    buf = io.StringIO()
    configure("DEBUG", json=True)
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=buf))
    try:
        with MockServer() as server:
            async def go() -> None:
                client = ModelClient()
                with call_context(episode="e#2", turn=5, role="auditor"):
                    await client.structured(RoleConfig(model="mock/default", base_url=server.base_url),
                                            [{"role": "user", "content": "Audit stage: fact_update"}], Answer,
                                            name="fact_update")
                await client.aclose()

            asyncio.run(go())
    finally:
        configure("WARNING")
    events = [json.loads(x) for x in buf.getvalue().splitlines() if '"model_call"' in x]
    assert events and all((e["episode"], e["turn"], e["role"], e["stage"]) == ("e#2", 5, "auditor", "fact_update")
                          for e in events)
