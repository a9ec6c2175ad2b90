"""Resource bounds: no reply, verdict or hanging call can grow memory or time without limit.

docs/RELIABILITY.md lists the guarantees this file proves. The turn wall-clock limit in a batch is
also proved by tests/test_runner.py::test_a_turn_over_its_wall_clock_limit_is_an_error_record.
"""

from __future__ import annotations

import asyncio
import json
import time
import tracemalloc
from typing import Any

import pytest
from ncpbench.agents import ReplayNarrator, ReplayPlayer
from ncpbench.auditors import LLMAuditor
from ncpbench.auditors.pipeline import MAX_TEXT
from ncpbench.auditors.schemas import (
    ConflictCheckOutput,
    DoubleCheckOutput,
    FactUpdateOutput,
    StatusOutput,
    TrajectoryOutput,
)
from ncpbench.auditors.scripted import ReplayAuditor
from pydantic import BaseModel, ValidationError

from ncpbench import NarrativeEnv, Outcome
from ncpbench.env import MAX_REPLY_CHARS
from ncpbench.episode import play_episode
from ncpbench.models.client import ModelClient
from ncpbench.models.config import RoleConfig, RunConfig
from ncpbench.models.mock_server import MockConfig, MockServer
from ncpbench.protocols import AuditRequest, NarratorRequest
from ncpbench.roles import build_roles
from ncpbench.spec import Spec
from ncpbench.state import EpisodeState
from ncpbench.trajectory import TrajectoryGraph
from ncpbench.verdict import Verdict

STAGES: list[type[BaseModel]] = [FactUpdateOutput, ConflictCheckOutput, DoubleCheckOutput, TrajectoryOutput,
                                 StatusOutput]
MEGA = "x" * 1_000_000


def _walk(schema: dict[str, Any], defs: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    if "$ref" in schema:
        name = schema["$ref"].split("/")[-1]
        return _walk(defs[name], defs, f"{path}<{name}>")
    out = [(path, schema)]
    for key, sub in (schema.get("properties") or {}).items():
        out += _walk(sub, defs, f"{path}.{key}")
    if isinstance(schema.get("items"), dict):
        out += _walk(schema["items"], defs, f"{path}[]")
    for sub in schema.get("anyOf", []):
        out += _walk(sub, defs, path)
    return out


@pytest.mark.parametrize("model", STAGES, ids=lambda m: m.__name__)
def test_every_list_and_every_quote_or_reason_in_a_stage_schema_has_a_cap(model: type[BaseModel]) -> None:
    schema = model.model_json_schema()
    nodes = _walk(schema, schema.get("$defs", {}), model.__name__)
    arrays = [(p, s) for p, s in nodes if s.get("type") == "array"]
    assert arrays and all("maxItems" in s for _, s in arrays), [p for p, s in arrays if "maxItems" not in s]
    prose = [(p, s) for p, s in nodes if p.rsplit(".", 1)[-1] in {"evidence", "reason"} and s.get("type") == "string"]
    assert all(s.get("maxLength", 10**9) <= 300 for _, s in prose), prose


def test_an_answer_over_a_cap_does_not_validate() -> None:
    with pytest.raises(ValidationError):
        FactUpdateOutput.model_validate({"add": ["a fact"] * 9, "negate": []})
    with pytest.raises(ValidationError):
        ConflictCheckOutput.model_validate({"conflicts": [
            {"kind": "fact", "target": "f_0", "evidence": MEGA, "reason": "r"}]})
    with pytest.raises(ValidationError):
        TrajectoryOutput.model_validate({"completed": ["s_0"] * 5})


def _audit_once(spec: Spec, scripted: dict[str, list[str]]) -> tuple[Verdict, dict[str, int]]:
    with MockServer(MockConfig(scripted=scripted)) as server:
        async def go() -> tuple[Verdict, dict[str, int]]:
            client = ModelClient()
            auditor = LLMAuditor(client, RoleConfig(model="mock/default", base_url=server.base_url))
            req = AuditRequest(spec=spec, state=EpisodeState.initial(spec), player_action="I wait.",
                               reply="Mara waits by the rail.", frontier=tuple(TrajectoryGraph(spec).frontier([])))
            try:
                return await auditor.audit(req), client.stats.as_dict()
            finally:
                await client.aclose()

        return asyncio.run(go())


def test_a_runaway_stage_answer_is_reasked_and_never_reaches_the_verdict(tiny: Spec) -> None:
    # ~10 MB: under the direct transport's 64 MiB body bound (a body past it is a transport fault,
    # retried: tests/test_transport.py), so it is the schema's length caps that refuse it.
    runaway = json.dumps({"conflicts": [{"kind": "fact", "target": "f_0", "evidence": MEGA, "reason": MEGA}] * 5})
    verdict, stats = _audit_once(tiny, {"conflict_check": [runaway]})
    assert stats["invalid_outputs"] == stats["reasks"] == 1, "the runaway answer was refused and asked again"
    assert verdict.conflicts == [] and len(verdict.model_dump_json()) < 5_000


def test_runaway_fact_texts_are_cut_before_they_reach_the_ledger(tiny: Spec) -> None:
    verdict, _ = _audit_once(tiny, {"fact_update": [json.dumps({"add": [MEGA] * 8, "negate": []})]})
    # The schema caps each fact (maxLength), so the runaway answer is re-asked, and whatever is kept is short.
    assert all(len(a) <= MAX_TEXT for a in verdict.fact_diff.add)
    assert MEGA not in verdict.model_dump_json()


def test_runaway_commitment_evidence_is_cut_before_it_reaches_the_verdict(tiny: Spec) -> None:
    answer = json.dumps({"updates": [{"id": "c_2", "status": "SATISFIED", "evidence": [MEGA] * 6}]})
    verdict, _ = _audit_once(tiny, {"commitment_status": [answer]})
    assert len(verdict.model_dump_json()) < 100_000


def test_many_turns_of_megabyte_replies_keep_the_episode_small(tiny: Spec) -> None:
    turns = 25
    env = NarrativeEnv(tiny, player=ReplayPlayer(["I keep walking."]), auditor=ReplayAuditor(), max_turns=turns)
    env.reset(seed=0)
    env.step("The ferry docks.")
    tracemalloc.start()
    try:
        for _ in range(turns):
            env.step(MEGA)  # the same 1 MB string each turn: only what the env keeps can grow
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    record = env.record()
    env.close()
    assert record.outcome is Outcome.SURVIVAL and record.turns == turns
    assert all(len(t.narrator_reply) <= MAX_REPLY_CHARS for t in record.history)
    assert len(record.model_dump_json()) < (turns + 1) * MAX_REPLY_CHARS * 2.5
    assert peak < 50_000_000, f"peak {peak / 1e6:.1f} MB while stepping"


def test_a_turn_that_never_finishes_is_cut_at_the_turn_timeout(tiny: Spec) -> None:
    class Stuck:
        async def narrate(self, request: NarratorRequest) -> str:
            if request.turn == 2:
                await asyncio.Event().wait()  # never answers
            return "The story moves on."

    env = NarrativeEnv(tiny, player=ReplayPlayer(["I wait."]), auditor=ReplayAuditor(), max_turns=5)
    started = time.perf_counter()
    record = asyncio.run(play_episode(env, Stuck(), turn_timeout_s=0.3))
    assert time.perf_counter() - started < 3
    assert record.outcome is Outcome.ERROR and "TurnTimeout" in (record.error or "")
    assert [t.turn for t in record.history] == [0, 1] and all(t.committed for t in record.history)


def test_a_hanging_endpoint_cannot_outlast_the_turn_timeout(tiny: Spec) -> None:
    # Retries alone would take minutes here: 6 attempts, each hanging past a 2 s request timeout.
    with MockServer(MockConfig(fault_rate=1.0, fault_kinds=("timeout",), hang_s=3.0)) as server:
        role = RoleConfig(model="mock/default", base_url=server.base_url, timeout_s=2.0, max_retries=5)
        config = RunConfig(narrator=role, player=role, auditor=role, player_mode="scripted")

        async def go() -> tuple[Any, ModelClient]:
            client = ModelClient()
            narrator, player, auditor = build_roles(config, client)
            env = NarrativeEnv(tiny, player=player, auditor=auditor, max_turns=3)
            try:
                return await play_episode(env, narrator, turn_timeout_s=0.5), client
            finally:
                await client.aclose()

        started = time.perf_counter()
        record, client = asyncio.run(go())
        elapsed = time.perf_counter() - started
    assert elapsed < 3, f"took {elapsed:.1f} s"
    assert record.outcome is Outcome.ERROR and "TurnTimeout" in (record.error or "")
    assert client.stats.in_flight == 0, "the cut call is not left counted as in flight"


def test_a_runaway_narrator_is_cut_on_every_turn_and_noted(tiny: Spec) -> None:
    env = NarrativeEnv(tiny, player=ReplayPlayer(["I wait."]), auditor=ReplayAuditor(), max_turns=2)
    record = asyncio.run(play_episode(env, ReplayNarrator(["An opening.", MEGA])))
    assert record.outcome is Outcome.SURVIVAL
    assert all(f"reply truncated from {len(MEGA)} to {MAX_REPLY_CHARS} characters" in t.notes
               for t in record.history[1:])
