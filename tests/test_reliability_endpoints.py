"""Endpoint faults are infrastructure, never verdicts; every call has a whole-call deadline.

Real HTTP to loopback endpoints that misbehave with a 200 (tests/hostile_endpoint.py), through
the real openai client, the LLM narrator, the LLM auditor and whole batches. docs/RELIABILITY.md
§1 lists these guarantees.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from hostile_endpoint import MODES, HostileEndpoint
from ncpbench.agents import LLMNarrator
from ncpbench.auditors import LLMAuditor

from ncpbench.errors import MalformedResponse, ModelCallError
from ncpbench.models.client import ModelClient
from ncpbench.models.config import RoleConfig, RunConfig
from ncpbench.models.mock_server import MockConfig, MockServer
from ncpbench.protocols import AuditRequest, NarratorRequest
from ncpbench.runner import run_batch
from ncpbench.spec import Spec
from ncpbench.state import EpisodeState
from ncpbench.trajectory import TrajectoryGraph
from ncpbench.views import narrator_request

NARRATOR_MODES = [m for m in MODES if m != "length_structured"]
"""A narrator reply cut at max_tokens is still the narrator's text; everything else is a fault."""


def hostile_role(endpoint: HostileEndpoint, **kw: object) -> RoleConfig:
    return RoleConfig(model="openai/hostile", base_url=endpoint.base_url, **{"max_retries": 1, **kw})  # type: ignore[arg-type]


def opening_request(spec: Spec) -> NarratorRequest:
    return narrator_request(spec, TrajectoryGraph(spec), EpisodeState.initial(spec), None)


def audit_request(spec: Spec) -> AuditRequest:
    state = EpisodeState.initial(spec)
    return AuditRequest(spec=spec, state=state, player_action="I open the door.",
                        reply="The door opens onto the lighthouse stairs.",
                        frontier=tuple(TrajectoryGraph(spec).frontier([])))


@pytest.mark.parametrize("mode", NARRATOR_MODES)
def test_a_bad_200_to_the_narrator_is_retried_then_a_malformed_response_never_a_reply(tiny: Spec, mode: str) -> None:
    with HostileEndpoint(mode) as endpoint:
        async def go() -> None:
            client = ModelClient()
            try:
                await LLMNarrator(client, hostile_role(endpoint)).narrate(opening_request(tiny))
            finally:
                await client.aclose()

        with pytest.raises(MalformedResponse, match="unusable response"):
            asyncio.run(go())
    assert endpoint.requests == 2, "one try and one retry (max_retries=1)"


@pytest.mark.parametrize("mode", MODES)
def test_a_bad_200_to_an_audit_stage_is_retried_then_a_malformed_response_not_reasked(tiny: Spec, mode: str) -> None:
    with HostileEndpoint(mode) as endpoint:
        async def go() -> ModelClient:
            client = ModelClient()
            try:
                await LLMAuditor(client, hostile_role(endpoint)).audit(audit_request(tiny))
            finally:
                await client.aclose()
            return client

        with pytest.raises(MalformedResponse):
            asyncio.run(go())
    # The first stage to fail stops the audit; its sibling (run concurrently) may also have been
    # asked. No request is a re-ask: an endpoint fault is not an answer to correct.
    assert 2 <= endpoint.requests <= 4
    assert not any("That answer cannot be used" in json.dumps(b) for b in endpoint.bodies)


def test_a_transient_bad_200_is_recovered_by_a_retry(tiny: Spec) -> None:
    with HostileEndpoint("empty_choices", bad=1) as endpoint:
        async def go() -> tuple[str, dict[str, object]]:
            client = ModelClient()
            try:
                reply = await LLMNarrator(client, hostile_role(endpoint)).narrate(opening_request(tiny))
            finally:
                await client.aclose()
            return reply.text, client.stats.as_dict()

        text, stats = asyncio.run(go())
    assert text and endpoint.requests == 2
    assert stats["recovered"] == 1 and stats["malformed"] == 1 and stats["failed"] == 0


def test_an_endpoint_answering_empty_choices_makes_every_batch_episode_an_error_never_a_conflict(tmp_path: Path) -> None:
    with HostileEndpoint("empty_choices") as endpoint, MockServer() as mock:
        good = RoleConfig(model="mock/default", base_url=mock.base_url)
        config = RunConfig(narrator=hostile_role(endpoint), player=good, auditor=good)
        result = asyncio.run(run_batch(tmp_path / "r", config, envs="iron-man,zombieland", replicates=5, max_turns=3,
                                       concurrency=4, breaker=0))  # each episode becomes its ERROR record
    records = [json.loads(x) for x in (tmp_path / "r" / "episodes.jsonl").read_text().splitlines()]
    assert len(records) == 10 and result.progress.conflicts == 0
    assert {r["outcome"] for r in records} == {"ERROR"}
    assert all("MalformedResponse" in r["error"] and "empty choices" in r["error"] for r in records)


def test_a_mock_batch_whose_every_fault_is_an_empty_or_malformed_body_has_no_conflict(tmp_path: Path) -> None:
    mock = MockConfig(fault_rate=0.3, fault_kinds=("empty", "malformed"), seed=3)
    with MockServer(mock) as server:
        r = RoleConfig(model="mock/default", base_url=server.base_url, max_retries=0)
        asyncio.run(run_batch(tmp_path / "r", RunConfig(narrator=r, player=r, auditor=r), envs="iron-man",
                              replicates=6, max_turns=4, concurrency=3, breaker=0))
    records = [json.loads(x) for x in (tmp_path / "r" / "episodes.jsonl").read_text().splitlines()]
    assert len(records) == 6 and server.stats.faults
    assert all(rec["outcome"] in ("ERROR", "SURVIVAL", "SUCCESS") for rec in records), \
        "without a planted conflict, no fault may turn into a CONFLICT"
    assert any(rec["outcome"] == "ERROR" and "MalformedResponse" in rec["error"] for rec in records)


# -- the whole-call deadline ------------------------------------------------------------------------


def test_a_body_dripping_a_byte_at_a_time_ends_at_the_whole_call_deadline(tiny: Spec) -> None:
    # Each byte arrives well within any per-read timeout, so only a deadline on the whole call ends it.
    with HostileEndpoint("drip", drip_s=0.2) as endpoint:
        async def go() -> None:
            client = ModelClient()
            try:
                await LLMNarrator(client, hostile_role(endpoint, timeout_s=1.5, max_retries=3)).narrate(
                    opening_request(tiny))
            finally:
                await client.aclose()

        started = time.perf_counter()
        with pytest.raises(ModelCallError, match=r"1\.5 s call deadline"):
            asyncio.run(asyncio.wait_for(go(), 10))  # without the deadline: TimeoutError here, not a hang
        elapsed = time.perf_counter() - started
    assert 1.4 < elapsed < 3.0 and endpoint.requests == 1


def test_the_deadline_covers_retries_too(tiny: Spec) -> None:
    # Every answer is bad and retried with backoff; the retries stop when the deadline would pass.
    with HostileEndpoint("html") as endpoint:
        async def go() -> None:
            client = ModelClient()
            try:
                await LLMNarrator(client, hostile_role(endpoint, timeout_s=1.0, max_retries=50)).narrate(
                    opening_request(tiny))
            finally:
                await client.aclose()

        started = time.perf_counter()
        with pytest.raises(MalformedResponse, match="wrong content type 'text/html'"):
            asyncio.run(go())
    assert time.perf_counter() - started < 1.5 and 1 < endpoint.requests < 6


def test_a_narrator_reply_cut_at_max_tokens_is_still_the_narrators_reply(tiny: Spec) -> None:
    with HostileEndpoint("length_structured") as endpoint:
        async def go() -> str:
            client = ModelClient()
            try:
                return (await LLMNarrator(client, hostile_role(endpoint)).narrate(opening_request(tiny))).text
            finally:
                await client.aclose()

        assert asyncio.run(go()) and endpoint.requests == 1


def test_a_structured_stage_cut_at_max_tokens_is_refused_even_without_a_response_format(tiny: Spec) -> None:
    # `prompt` mode sends no response_format: the call is still structured, so `length` is a fault.
    with HostileEndpoint("length_structured") as endpoint:
        async def go() -> None:
            client = ModelClient()
            try:
                await LLMAuditor(client, hostile_role(endpoint, structured="prompt")).audit(audit_request(tiny))
            finally:
                await client.aclose()

        with pytest.raises(MalformedResponse, match="finish_reason length"):
            asyncio.run(go())
