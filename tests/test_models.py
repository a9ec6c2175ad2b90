"""The model layer over real HTTP: the openai client against the loopback mock server."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path

import pytest
from pydantic import BaseModel

from ncpbench.errors import MalformedResponse
from ncpbench.models.cache import ResponseCache
from ncpbench.models.client import InvalidOutputError, ModelCallError, ModelClient, extract_json, redact
from ncpbench.models.config import RoleConfig, resolve_run_config
from ncpbench.models.mock_server import MockConfig, MockServer


class Answer(BaseModel):
    add: list[str]
    negate: list[str]


AUDIT_MSGS = [{"role": "system", "content": "Audit stage: fact_update"}, {"role": "user", "content": "Turn: 1"}]


def role(server: MockServer, **kw: object) -> RoleConfig:
    return RoleConfig(model="mock/default", base_url=server.base_url, **kw)  # type: ignore[arg-type]


def test_structured_output_validates_over_http() -> None:
    with MockServer() as server:
        async def go() -> tuple[Answer, int]:
            client = ModelClient()
            out, usage = await client.structured(role(server), AUDIT_MSGS, Answer, name="fact_update")
            await client.aclose()
            return out, usage.calls

        out, calls = asyncio.run(go())
    assert out == Answer(add=[], negate=[]) and calls == 1


@pytest.mark.parametrize("kind", ["429", "500", "reset"])
def test_transport_faults_are_retried_by_the_client(kind: str) -> None:
    with MockServer(MockConfig(fault_rate=0.5, fault_kinds=(kind,), seed=1)) as server:
        async def go() -> dict[str, int]:
            client = ModelClient()
            for _ in range(6):
                await client.structured(role(server, max_retries=8), AUDIT_MSGS, Answer, name="fact_update")
            await client.aclose()
            return client.stats.as_dict()

        stats = asyncio.run(go())
    assert server.stats.faults.get(kind, 0) > 0
    assert stats["retried"] >= server.stats.faults[kind] and stats["failed"] == 0


def test_a_hanging_endpoint_is_cut_at_the_whole_call_deadline_and_reported_as_a_model_call_error() -> None:
    with MockServer(MockConfig(fault_rate=1.0, fault_kinds=("timeout",), hang_s=3.0)) as server:
        async def go() -> None:
            client = ModelClient()
            try:
                await client.chat(role(server, timeout_s=0.4, max_retries=3), AUDIT_MSGS)
            finally:
                await client.aclose()

        started = time.perf_counter()
        with pytest.raises(ModelCallError, match="timed out"):
            asyncio.run(go())
        elapsed = time.perf_counter() - started
    # The deadline covers the whole call, retries included: no retry can start after it.
    assert elapsed < 1.5 and server.stats.requests == 1


@pytest.mark.parametrize("kind", ["truncated", "schema_miss"])
def test_invalid_output_is_reasked_twice_then_raises(kind: str) -> None:
    with MockServer(MockConfig(fault_rate=1.0, fault_kinds=(kind,))) as server:
        async def go() -> ModelClient:
            client = ModelClient()
            try:
                await client.structured(role(server), AUDIT_MSGS, Answer, name="fact_update")
            finally:
                await client.aclose()
            return client

        with pytest.raises(InvalidOutputError, match="after 2 re-asks"):
            asyncio.run(go())
    assert server.stats.requests == 3


@pytest.mark.parametrize("kind", ["malformed", "empty"])
def test_a_malformed_body_or_empty_content_is_retried_then_a_malformed_response_never_an_answer(kind: str) -> None:
    with MockServer(MockConfig(fault_rate=1.0, fault_kinds=(kind,))) as server:
        async def go() -> ModelClient:
            client = ModelClient()
            try:
                await client.structured(role(server, max_retries=2), AUDIT_MSGS, Answer, name="fact_update")
            finally:
                await client.aclose()
            return client

        with pytest.raises(MalformedResponse, match="after 3 attempt"):
            asyncio.run(go())
    assert server.stats.requests == 3, "one try and two retries, no re-ask of an endpoint fault"


def test_semantic_check_failures_are_fed_back_and_reasked() -> None:
    seen: list[int] = []

    def check(out: Answer) -> list[str]:
        seen.append(1)
        return ["negate: f_9 is not an active fact id"] if len(seen) < 2 else []

    with MockServer() as server:
        async def go() -> ModelClient:
            client = ModelClient()
            await client.structured(role(server), AUDIT_MSGS, Answer, name="fact_update", check=check)
            await client.aclose()
            return client

        client = asyncio.run(go())
    assert client.stats.reasks == 1 and server.stats.requests == 2


def test_response_cache_replays_without_calling_the_endpoint(tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite"
    with MockServer() as server:
        async def go() -> list[str]:
            out = []
            for _ in range(2):
                client = ModelClient(cache=ResponseCache(path))
                out.append((await client.chat(role(server, temperature=0.7), AUDIT_MSGS, salt="ep1")).text)
                out.append((await client.chat(role(server, temperature=0.7), AUDIT_MSGS, salt="ep2")).text)
                await client.aclose()
            return out

        texts = asyncio.run(go())
    assert texts[:2] == texts[2:]
    assert server.stats.requests == 2, "the second pass is served from the cache"
    assert sqlite3.connect(path).execute("select count(*) from responses").fetchone()[0] == 2


def test_structured_modes_send_the_backend_specific_response_format() -> None:
    client = ModelClient()
    js = client.response_format(RoleConfig(model="openai/x"), Answer, "fact_update")
    jo = client.response_format(RoleConfig(model="local/smollm2-135m"), Answer, "fact_update")
    none = client.response_format(RoleConfig(model="openai/x", structured="prompt"), Answer, "fact_update")
    assert js is not None and js["type"] == "json_schema" and js["json_schema"]["name"] == "fact_update"
    assert jo is not None and jo["type"] == "json_object" and "properties" in jo["schema"]
    assert none is None


def test_config_precedence_flags_over_env_over_file_over_profile(tmp_path: Path) -> None:
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text("narrator: {model: openai/from-file, temperature: 0.1}\nauditor: {model: openai/judge}\n")
    env = {"NCPBENCH_NARRATOR_MODEL": "openai/from-env", "NCPBENCH_PLAYER_BASE_URL": "http://127.0.0.1:9/v1"}
    cfg = resolve_run_config({"narrator": {"model": "openai/from-flag"}}, environ=env, config_file=cfg_file,
                             profile="default")
    assert cfg.narrator.model == "openai/from-flag" and cfg.narrator.temperature == 0.1
    assert cfg.player.base_url == "http://127.0.0.1:9/v1"
    assert cfg.auditor.model == "openai/judge" and cfg.auditor.temperature == 0.0 and cfg.auditor.seed == 0
    paper = resolve_run_config(environ={}, profile="paper")
    assert all((r.temperature, r.top_p, r.max_tokens) == (0.6, 0.95, 8092) for r in (paper.narrator, paper.player, paper.auditor))


def test_keys_are_redacted_and_never_in_config_dumps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_PROVIDER_KEY", "sk-test-abcdefghijkl")
    cfg = resolve_run_config({"narrator": {"model": "openai/x", "api_key_env": "MY_PROVIDER_KEY"}}, environ={})
    assert "sk-test" not in json.dumps(cfg.public())
    assert "sk-test" not in redact("failed with Bearer sk-test-abcdefghijkl for sk-test-abcdefghijkl")


def test_extract_json_tolerates_fences_and_chatter() -> None:
    assert json.loads(extract_json('Sure!\n```json\n{"a": 1}\n```')) == {"a": 1}
    assert json.loads(extract_json('noise {"a": {"b": 2}} trailing')) == {"a": {"b": 2}}


def test_the_published_protocol_samples_as_published_unless_told_otherwise() -> None:
    published = resolve_run_config({"narrator": {"model": "openai/n", "temperature": 0.2}})
    assert published.profile == "paper" and published.auditor.temperature == 0.6
    assert published.auditor.top_p == 0.95 and published.auditor.max_tokens == 8092
    assert published.narrator.temperature == 0.2, "a flag still wins"
    grounded = resolve_run_config({}, extra={"protocol": "grounded"})
    assert grounded.profile == "default" and grounded.auditor.temperature == 0.0


def test_every_role_config_field_is_a_flag_and_a_variable_for_every_role() -> None:
    import subprocess
    import sys

    from ncpbench.models.config import RoleConfig, role_options

    assert {field for field, _ in role_options().values()} == set(RoleConfig.model_fields) - {"model"}
    cfg = resolve_run_config({}, environ={"NCPBENCH_AUDITOR_MAX_RETRIES": "1", "NCPBENCH_PLAYER_CONCURRENCY": "3"})
    assert cfg.auditor.max_retries == 1 and cfg.player.concurrency == 3
    help_text = subprocess.run([sys.executable, "-m", "ncpbench", "run", "--help"], capture_output=True, text=True,
                               timeout=60).stdout
    assert "-max-retries" in help_text and "-concurrency" in help_text
