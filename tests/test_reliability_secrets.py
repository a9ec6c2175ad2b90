"""Secrets: API keys never appear in logs, records, checkpoints, reports or exception messages.

docs/RELIABILITY.md lists the guarantees this file proves.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import secrets
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import structlog
from ncpbench.agents import ReplayPlayer
from ncpbench.auditors.scripted import ReplayAuditor

from ncpbench import NarrativeEnv, Outcome
from ncpbench.episode import play_episode
from ncpbench.logs import configure
from ncpbench.models.calllog import CallEntry
from ncpbench.models.client import ModelCallError, ModelClient, redact
from ncpbench.models.config import RoleConfig, RunConfig
from ncpbench.models.mock_server import MockConfig, MockServer
from ncpbench.models.redaction import redact_url, remember_url_credentials
from ncpbench.protocols import NarratorRequest
from ncpbench.record import EpisodeRecord
from ncpbench.roles import build_roles
from ncpbench.spec import Spec

MESSAGES = [{"role": "user", "content": "Say something."}]


def canary(prefix: str = "sk-ncpbench-canary-") -> str:
    return prefix + secrets.token_hex(12)


def leaks(folder: Path, keys: list[str]) -> list[str]:
    """Every file under `folder` (any format, binary included) that holds one of `keys`."""
    found = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        found += [f"{path}: {k[:12]}..." for k in keys if k.encode() in data]
    return found


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ncpbench", *args], capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.mark.slow
def test_api_keys_appear_in_no_artifact_of_a_batch_with_debug_logs(tmp_path: Path) -> None:
    keys = {"NCPB_NARRATOR_KEY": canary(), "NCPB_PLAYER_CRED": canary("ncpbench-canary-plain-"),
            "OPENAI_API_KEY": canary()}
    out = tmp_path / "run"
    with MockServer(MockConfig(fault_rate=0.3, seed=5, hang_s=0.5, conflict_turns=frozenset({3}))) as server:
        url = server.base_url
        config = tmp_path / "run.yaml"  # the auditor comes from a config file, keyed by OPENAI_API_KEY
        config.write_text(f"auditor: {{model: openai/auditor-model, base_url: '{url}', timeout_s: 0.3}}\n")
        env = {**os.environ, **keys, "OPENAI_LOG": "debug"}
        args = ["--log-level", "DEBUG", "run", "--envs", "iron-man,zombieland,alien", "--max-turns", "4",
                "--out", str(out), "--cache", str(out / "cache.sqlite"), "--config", str(config),
                "--narrator", "openai/narrator-model", "--narrator-base-url", url,
                "--narrator-api-key-env", "NCPB_NARRATOR_KEY", "--narrator-timeout", "0.3",
                "--player", "openai/player-model", "--player-base-url", url,
                "--player-api-key-env", "NCPB_PLAYER_CRED", "--player-timeout", "0.3", "--no-progress",
                "--circuit-breaker", "0"]  # the 30% faults must become records here, not stop the batch
        stopped = run_cli([*args, "--max-total-tokens", "1"], env)  # stops between turns: checkpoints stay
        checkpoints = list((out / "checkpoints").glob("*.json"))
        early_leaks = leaks(out, list(keys.values()))
        finished = run_cli(args, env)
    # exit 5: stopped by the budget; then 0, or 4 when the 30% faults left an episode as ERROR
    assert stopped.returncode == 5 and finished.returncode in (0, 4), stopped.stderr[-2000:] + finished.stderr[-2000:]
    assert checkpoints, "the budget stop left checkpoints to inspect"
    assert "model_call" in finished.stderr, "DEBUG logs were on"
    assert (out / "episodes.jsonl").read_text().count("\n") == 3

    report_dir = tmp_path / "report"
    has_report = run_cli(["report", "--help"], env).returncode == 0
    if has_report:
        report = run_cli(["report", str(out), "--out", str(report_dir)], env)
        assert report.returncode == 0, report.stderr
        assert any(report_dir.iterdir())
        streams = [report.stdout, report.stderr]
    else:
        streams = []

    streams += [stopped.stdout, stopped.stderr, finished.stdout, finished.stderr]
    for key in keys.values():
        assert not any(key in s for s in streams), "a key reached stdout or stderr"
    assert early_leaks == [] and leaks(out, list(keys.values())) == []
    if has_report:
        assert leaks(report_dir, list(keys.values())) == []
    assert "NCPB_NARRATOR_KEY" in (out / "run.json").read_text(), "the variable's name is recorded, its value never"


@pytest.mark.parametrize("transport", ["direct", "sdk"])
def test_a_key_from_an_oddly_named_variable_is_redacted_where_the_endpoint_echoes_it(
        monkeypatch: pytest.MonkeyPatch, transport: str) -> None:
    key = canary("ncpbench-canary-plain-")  # no sk- prefix, in a variable whose name says nothing
    monkeypatch.setenv("NCPB_ODD_NAME", key)
    server = ThreadingHTTPServer(("127.0.0.1", 0), EchoKeyHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    role = RoleConfig(model="openai/x", base_url=url, api_key_env="NCPB_ODD_NAME", max_retries=0,
                      transport=transport)
    entries: list[CallEntry] = []

    async def go() -> str:
        client = ModelClient(call_sink=entries.append)
        try:
            await client.chat(role, MESSAGES)
        except ModelCallError as e:
            return str(e)
        finally:
            await client.aclose()
        raise AssertionError("the call should have failed")

    try:
        message = asyncio.run(go())
    finally:
        server.shutdown()
        server.server_close()
    assert message == "openai/x: HTTP 401 after 1 attempt(s)"
    [entry] = entries
    assert entry.outcome == "http 401" and "Incorrect API key provided: [redacted]" in (entry.response or "")
    assert key not in entry.model_dump_json()
    assert key not in redact(f"later: the key {key} again"), "a key the client read stays known to redact"


class EchoKeyHandler(BaseHTTPRequestHandler):
    """An endpoint that rejects every call and quotes the presented key back, as hosted APIs do."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        key = self.headers.get("Authorization", "").removeprefix("Bearer ")
        body = json.dumps({"error": {"message": f"Incorrect API key provided: {key}", "code": "invalid_api_key",
                                     "type": "invalid_request_error"}}).encode()
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


def test_an_endpoint_that_echoes_the_key_leaves_it_out_of_errors_records_and_logs(
        tiny: Spec, monkeypatch: pytest.MonkeyPatch) -> None:
    key = canary()
    monkeypatch.setenv("NCPB_ECHO_KEY", key)
    server = ThreadingHTTPServer(("127.0.0.1", 0), EchoKeyHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    role = RoleConfig(model="openai/x", base_url=url, api_key_env="NCPB_ECHO_KEY", max_retries=0)
    logs = io.StringIO()
    saved = structlog.get_config()
    monkeypatch.setattr(sys, "stderr", logs)
    configure("DEBUG")  # structlog to `logs`, as the CLI's --log-level DEBUG does to stderr
    try:
        async def go() -> tuple[str, EpisodeRecord]:
            client = ModelClient()
            try:
                try:
                    await client.chat(role, MESSAGES)
                except ModelCallError as e:
                    message = str(e)
                narrator, player, auditor = build_roles(RunConfig(narrator=role, player=role, auditor=role), client)
                env = NarrativeEnv(tiny, player=player, auditor=auditor, max_turns=2)
                return message, await play_episode(env, narrator)
            finally:
                await client.aclose()

        message, record = asyncio.run(go())
    finally:
        structlog.configure(**saved)
        server.shutdown()
        server.server_close()
    assert message == "openai/x: HTTP 401 after 1 attempt(s)"
    assert record.outcome is Outcome.ERROR and "HTTP 401" in (record.error or "")
    assert key not in record.model_dump_json()
    assert "episode_error" in logs.getvalue()
    assert key not in logs.getvalue()


@pytest.mark.parametrize("prefix", ["sk-ncpbench-canary-", "ncpbench-canary-plain-"])
def test_a_role_that_fails_with_a_key_in_its_message_leaves_a_redacted_record(
        tiny: Spec, monkeypatch: pytest.MonkeyPatch, prefix: str) -> None:
    key = canary(prefix)
    monkeypatch.setenv("NCPBENCH_TEST_API_KEY", key)

    class Leaky:
        def narrate(self, request: NarratorRequest) -> str:
            if request.turn == 1:
                raise RuntimeError(f"upstream said: invalid key {key} (Authorization: Bearer {key})")
            return "An opening."

    env = NarrativeEnv(tiny, player=ReplayPlayer(["I wait."]), auditor=ReplayAuditor(), max_turns=3)
    record = asyncio.run(play_episode(env, Leaky()))
    assert record.outcome is Outcome.ERROR and "invalid key" in (record.error or "")
    assert key not in record.model_dump_json()


@pytest.mark.slow
def test_canaries_in_the_key_the_url_and_a_reply_reach_no_file_of_the_run_cache_report_or_logs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hostile_endpoint import HostileEndpoint

    from ncpbench.models.cache import ResponseCache
    from ncpbench.models.calllog import read_calls
    from ncpbench.reports import build_report
    from ncpbench.runner import run_batch

    key = canary("ncpbench-canary-key-")  # no sk- prefix, in a variable whose name says nothing
    password = canary("ncpbench-canary-pass-")
    monkeypatch.setenv("NCPB_NARRATOR_CRED", key)
    secrets_ = [key, password]
    logs = io.StringIO()
    saved = structlog.get_config()
    configure("DEBUG", json=True)
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=logs))
    # The narrator endpoint echoes the key and the URL's password inside an ordinary 200 reply.
    reply = f"The door opens. (debug: key={key} auth=Bearer {key} url=http://reader:{password}@10.0.0.1/v1)"
    try:
        with HostileEndpoint("good", reply=reply) as endpoint, MockServer() as mock:
            host = endpoint.base_url.removeprefix("http://")
            narrator = RoleConfig(model="openai/narrator", base_url=f"http://reader:{password}@{host}",
                                  api_key_env="NCPB_NARRATOR_CRED")
            good = RoleConfig(model="mock/default", base_url=mock.base_url)
            config = RunConfig(narrator=narrator, player=good, auditor=good, cache_path=str(tmp_path / "cache.sqlite"))
            out = tmp_path / "run"
            asyncio.run(run_batch(out, config, envs="iron-man,zombieland", max_turns=2))
            asyncio.run(run_batch(out, config, envs="iron-man,zombieland", max_turns=2))  # resume: all done
            sent = json.dumps(endpoint.bodies)
        build_report([out], tmp_path / "report", resamples=50)
    finally:
        structlog.configure(**saved)
    assert sent and "door opens" in (out / "episodes.jsonl").read_text(), "the reply itself is kept"
    assert "[redacted]" in (out / "episodes.jsonl").read_text()
    assert (out / "calls.jsonl").exists() and read_calls(out / "calls.jsonl"), "the call log was written"
    ResponseCache(tmp_path / "cache.sqlite").close()  # the cache exists and is whole
    assert key not in sent, "our own requests never carry the key in a message"
    run_json = json.loads((out / "run.json").read_text())
    assert run_json["config"]["narrator"]["base_url"] == f"http://[redacted]@{host}"
    assert leaks(out, secrets_) == [] and leaks(tmp_path / "report", secrets_) == []
    assert leaks(tmp_path, secrets_) == [], "nothing under the test folder at all (cache included)"
    assert "model_call" in logs.getvalue() and not any(s in logs.getvalue() for s in secrets_)



@pytest.mark.slow
@pytest.mark.parametrize("transport", ["direct", "sdk"])
def test_a_secret_in_a_base_urls_query_reaches_no_file_of_a_cli_batch_its_checkpoints_report_or_logs(
        tmp_path: Path, transport: str) -> None:
    # Azure-style `?api-key=` and a signed-URL `Sig=`: values, not user:pass, so only the query masking
    # and the remembered query secrets keep them out. Both transports send the query on every request
    # (the preflight probe too), so each plays a whole batch: a budget stop with checkpoints, then a
    # resume; run.json and the records name the URL.
    key, sig = canary("ncpbench-canary-query-"), canary("ncpbench-canary-sig-")
    out, report_dir = tmp_path / "run", tmp_path / "report"
    with MockServer() as server:
        url = f"{server.base_url}?api-key={key}&Sig={sig}&api-version=2024-10-21"
        env = {**os.environ, "OPENAI_LOG": "debug"}
        args = ["--log-level", "DEBUG", "run", "--envs", "iron-man,alien", "--max-turns", "3", "--out", str(out),
                "--no-progress", "--circuit-breaker", "0"]
        for role in ("narrator", "player", "auditor"):
            args += [f"--{role}", "mock/default", f"--{role}-base-url", url, f"--{role}-transport", transport,
                     f"--{role}-max-retries", "0"]
        runs = [run_cli([*args, "--max-total-tokens", "1"], env)]  # stops between turns: checkpoints stay
        checkpoints = list((out / "checkpoints").glob("*.json"))
        early_leaks = leaks(out, [key, sig])
        runs.append(run_cli(args, env))
    runs.append(run_cli(["report", str(out), "--out", str(report_dir)], env))
    codes = [r.returncode for r in runs]
    assert codes == [5, 0, 0], "".join(r.stderr[-1500:] for r in runs)
    assert checkpoints, "the budget stop left checkpoints"
    assert (out / "calls.jsonl").read_text().strip(), "the endpoint was called"
    assert "model_call" in runs[0].stderr, "DEBUG logs were on"
    assert (out / "episodes.jsonl").read_text().count("\n") == 2
    run_json = (out / "run.json").read_text()
    assert "api-key=[redacted]" in run_json and "api-version=2024-10-21" in run_json, "masked, the rest kept"
    assert early_leaks == [] and leaks(out, [key, sig]) == [] and leaks(report_dir, [key, sig]) == []
    streams = [text for r in runs for text in (r.stdout, r.stderr)]
    assert not any(s in text for s in (key, sig) for text in streams), "a query secret reached stdout or stderr"


@pytest.mark.parametrize(("url", "shown"), [
    ("https://x.openai.azure.com/openai/v1?api-key=S3CRET", "https://x.openai.azure.com/openai/v1?api-key=[redacted]"),
    ("http://h/v1?API_KEY=a&model=m&Token=b", "http://h/v1?API_KEY=[redacted]&model=m&Token=[redacted]"),
    ("http://h/v1?key=a;sig=b&apikey=c", "http://h/v1?key=[redacted];sig=[redacted]&apikey=[redacted]"),
    ("http://h/v1?access_token=a#x", "http://h/v1?access_token=[redacted]#x"),
    ("http://h/v1#access_token=a&state=s", "http://h/v1#access_token=[redacted]&state=s"),
    ("http://u:p@h:1/v1?signature=a&api-version=2024-10-21",
     "http://[redacted]@h:1/v1?signature=[redacted]&api-version=2024-10-21"),
    ("http://h/v1?X-Amz-Signature=a&X-Amz-Credential=b&X-Amz-Date=20240101",
     "http://h/v1?X-Amz-Signature=[redacted]&X-Amz-Credential=[redacted]&X-Amz-Date=20240101"),
    ("http://h/v1?password=a&secret=b&client_secret=c&api%2Dkey=d&auth=e",
     "http://h/v1?password=[redacted]&secret=[redacted]&client_secret=[redacted]&api%2Dkey=[redacted]&auth=[redacted]"),
    ("http://token@h/v1", "http://[redacted]@h/v1"),
    ("http://h/v1?api-key=", "http://h/v1?api-key="),  # nothing to hide
    ("http://localhost:8000/v1", "http://localhost:8000/v1"),
    ("http://h/v1?model=gpt&api-version=1", "http://h/v1?model=gpt&api-version=1"),
])
def test_redact_url_masks_credentials_and_secret_query_values_and_keeps_the_rest(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert RoleConfig(model="openai/m", base_url=url).public()["base_url"] == shown, "records use the same one"


def test_redact_url_is_the_one_function_preflight_and_the_records_use() -> None:
    import ncpbench.models.config as config
    import ncpbench.preflight as preflight
    from ncpbench.models import redaction

    assert preflight.redact_url is redaction.redact_url and config.redact_url is redaction.redact_url
    assert redact_url(None) is None


def test_query_secrets_of_a_base_url_are_remembered_and_redacted_from_any_text() -> None:
    key, sig = canary("ncpbench-canary-q-"), canary("ncpbench-canary-s-")
    remember_url_credentials(f"https://h.example/v1?api-version=1&api-key={key}&sig={sig}%2B%3D")
    # Wherever the value turns up on its own (an error text, an echoed header), as written or decoded.
    text = redact(f"refused key {key}; signature {sig}%2B%3D, decoded {sig}+=")
    assert key not in text and sig not in text, text


def test_a_url_with_a_secret_query_inside_any_text_is_masked() -> None:
    token = canary("ncpbench-canary-t-")  # never remembered: only the pattern can catch it
    text = redact(f'POST "https://files.example/up?X-Amz-Signature={token}&part=2" failed')
    assert token not in text and "X-Amz-Signature=[redacted]&part=2" in text, text
    assert redact("a=b and ?key=value in prose") == "a=b and ?key=value in prose", "only inside a URL"
