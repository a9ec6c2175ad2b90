"""The embedded local model (opt-in: --run-local; needs the `local` extra)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest
from ncpbench.auditors.schemas import FactUpdateOutput

from ncpbench import NarrativeEnv, Outcome
from ncpbench.episode import play_episode
from ncpbench.models.client import ModelClient
from ncpbench.models.config import RoleConfig, RunConfig
from ncpbench.models.local import LocalServer
from ncpbench.roles import build_roles
from ncpbench.spec import Spec

pytestmark = pytest.mark.local_model
LOCAL = RoleConfig(model="local/smollm2-135m", max_tokens=700, temperature=0.0, seed=0)
NARRATOR = LOCAL.model_copy(update={"max_tokens": 100, "temperature": 0.7})


def test_json_object_with_schema_is_grammar_constrained_and_parses() -> None:
    with LocalServer() as server:
        role = LOCAL.model_copy(update={"base_url": server.base_url, "structured": "json_object"})

        async def go() -> FactUpdateOutput:
            client = ModelClient()
            try:
                msgs = [{"role": "user", "content": "The door is now open. List new facts as JSON."}]
                out, _ = await client.structured(role, msgs, FactUpdateOutput, name="fact_update")
                return out
            finally:
                await client.aclose()

        assert isinstance(asyncio.run(go()), FactUpdateOutput)
        pid = server.proc.pid if server.proc else None
    assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_short_episode_runs_end_to_end_on_the_local_model(tiny: Spec) -> None:
    config = RunConfig(narrator=NARRATOR, auditor=LOCAL, player_mode="scripted")

    async def go():  # type: ignore[no-untyped-def]
        client = ModelClient()
        try:
            narrator, player, auditor = build_roles(config, client)
            env = NarrativeEnv(tiny, player=player, auditor=auditor, max_turns=2)
            return await play_episode(env, narrator, seed=0)
        finally:
            await client.aclose()

    record = asyncio.run(go())
    assert record.outcome in {Outcome.SURVIVAL, Outcome.CONFLICT, Outcome.SUCCESS}, record.error
    assert record.usage["auditor"].calls >= 1 and record.usage["narrator"].completion_tokens > 0


def _llama_children() -> list[int]:
    out = subprocess.run(["pgrep", "-f", "llama_cpp.server"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _default_sigint() -> None:
    # CI may start us with SIGINT ignored (a background job); a person's terminal never does.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_run() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "ncpbench", "run", "iron-man", "--turns", "50",
                             "--narrator", "local/smollm2-135m", "--auditor", "local/smollm2-135m",
                             "--player-mode", "scripted", "--quiet"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, preexec_fn=_default_sigint)


def _start_run_and_wait_for_server() -> tuple[subprocess.Popen[bytes], set[int]]:
    before = set(_llama_children())
    proc = _start_run()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (set(_llama_children()) - before):
        time.sleep(0.5)
    started = set(_llama_children()) - before
    assert started, "the local server never started"
    return proc, started


def test_ctrl_c_stops_the_local_server() -> None:
    proc, started = _start_run_and_wait_for_server()
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and set(_llama_children()) & started:
        time.sleep(0.5)
    assert not set(_llama_children()) & started, "the llama.cpp server outlived ncpbench"


def test_sigkill_of_ncpbench_takes_the_local_server_down_too() -> None:
    proc, started = _start_run_and_wait_for_server()
    proc.kill()
    proc.wait(timeout=10)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and set(_llama_children()) & started:
        time.sleep(0.5)
    assert not set(_llama_children()) & started
