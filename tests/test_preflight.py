"""Preflight: a misconfigured run fails in seconds, before any folder or record exists.

Endpoint probes go over real HTTP (the real `openai` client) to the project's mock server and to
small hostile loopback servers from conftest (401, unknown model, wrong path); a closed port is a
port that was bound and released.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Answer, HostileServer, chat_answer, error_body

from ncpbench.cli import main
from ncpbench.models.config import RunConfig
from ncpbench.models.mock_server import MockServer
from ncpbench.models.redaction import redact_url
from ncpbench.preflight import EXIT_USAGE, PreflightError, preflight, probe_endpoints

Start = Callable[[Callable[[str, str, dict[str, object]], Answer]], HostileServer]


def one_line_error(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip() and not x.startswith("mock models")]
    assert len(lines) == 1, err
    assert lines[0].startswith("ncpbench: ") and "Traceback" not in err
    return lines[0]


def run_args(url: str, *extra: str, model: str = "openai/m") -> list[str]:
    return ["run", "iron-man", "--turns", "1", "--player-mode", "scripted", "--narrator", model,
            "--narrator-base-url", url, "--auditor", "mock/default", *extra]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def refuse_key(method: str, path: str, body: dict[str, object]) -> Answer:
    return 401, error_body("Incorrect API key provided", "invalid_api_key")


def only_model_a(method: str, path: str, body: dict[str, object]) -> Answer:
    if path.endswith("/models"):
        return 200, {"object": "list", "data": [{"id": "a", "object": "model", "owned_by": "x"}]}
    if body.get("model") != "a":
        return 404, error_body(f"The model `{body.get('model')}` does not exist.", "model_not_found")
    return 200, chat_answer()


def only_under_v1(method: str, path: str, body: dict[str, object]) -> Answer:
    if not path.startswith("/v1/"):
        return 404, {"detail": "Not Found"}
    return only_model_a(method, path, body)


def test_a_refused_key_fails_in_seconds_with_the_url_the_status_and_the_flag(
        hostile: Start, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_KEY", "sk-canary-do-not-print-1234567890")
    server = hostile(refuse_key)
    url = server.base_url.replace("http://", "http://user:hunter2-secret@")
    started = time.monotonic()
    code = main(run_args(url, "--narrator-api-key-env", "MY_KEY", "--out", str(tmp_path / "out" / "rec.json")))
    line = one_line_error(capsys.readouterr().err)
    assert code == EXIT_USAGE and time.monotonic() - started < 10
    assert "HTTP 401" in line and "127.0.0.1" in line and "--narrator-api-key-env" in line and "MY_KEY" in line
    assert "hunter2" not in line and "sk-canary" not in line, "credentials are redacted"
    assert not (tmp_path / "out").exists(), "nothing is written before the checks pass"
    assert all(path.endswith("/models") for _, path in server.requests), "no chat call before the probe passed"


def test_an_unknown_model_names_what_the_endpoint_serves(hostile: Start, capsys: pytest.CaptureFixture[str]) -> None:
    server = hostile(only_model_a)
    assert main(run_args(server.base_url, model="openai/nope")) == EXIT_USAGE
    line = one_line_error(capsys.readouterr().err)
    assert "HTTP 404" in line and "'nope'" in line and "it lists a" in line and "--narrator" in line


def test_a_refused_connection_names_the_url_and_the_base_url_flag(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    started = time.monotonic()
    assert main(run_args(url)) == EXIT_USAGE
    line = one_line_error(capsys.readouterr().err)
    assert time.monotonic() - started < 10
    assert "cannot connect" in line and url in line and "--narrator-base-url" in line


def test_a_base_url_without_its_v1_path_is_a_404_that_says_so(hostile: Start,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    server = hostile(only_under_v1)
    assert main(run_args(server.root, model="openai/a")) == EXIT_USAGE  # the server lives under /v1
    line = one_line_error(capsys.readouterr().err)
    assert "HTTP 404" in line and "/v1" in line and "--narrator-base-url" in line
    assert main(run_args(server.base_url, model="openai/a")) == 0, "the same server with /v1 runs"


def test_the_right_endpoint_passes_and_an_unlisted_model_is_confirmed_by_one_token(hostile: Start) -> None:
    server = hostile(only_model_a)
    listed = RunConfig.model_validate({"narrator": {"model": "openai/a", "base_url": server.base_url},
                                       "auditor": {"model": "mock/default"}, "player_mode": "scripted"})
    preflight(listed)
    assert server.requests == [("GET", "/v1/models")], "a listed model needs only GET /models"
    with MockServer() as mock:  # lists only "default", but answers any model: one one-token completion
        unlisted = RunConfig.model_validate({"narrator": {"model": "openai/other", "base_url": mock.base_url},
                                             "auditor": {"model": "openai/other", "base_url": mock.base_url},
                                             "player_mode": "scripted"})
        preflight(unlisted)
        assert mock.stats.requests == 1, "one probe per distinct endpoint and model"


def test_transient_trouble_is_only_a_warning(hostile: Start) -> None:
    server = hostile(lambda m, p, b: (503, error_body("overloaded")))
    warnings: list[str] = []
    config = RunConfig.model_validate({"narrator": {"model": "openai/a", "base_url": server.base_url},
                                       "auditor": {"model": "mock/default"}, "player_mode": "scripted"})
    probe_endpoints(config, warn=warnings.append)
    assert warnings and "503" in warnings[0]


def test_skip_preflight_sends_no_probe(hostile: Start, tmp_path: Path) -> None:
    server = hostile(refuse_key)
    code = main(run_args(server.base_url, "--skip-preflight", "--turn-timeout", "20"))
    assert code == 4, "the run went ahead and its episode is an ERROR record"
    assert ("GET", "/v1/models") not in server.requests


def test_python_api_raises_preflight_error(hostile: Start) -> None:
    server = hostile(refuse_key)
    config = RunConfig.model_validate({"narrator": {"model": "openai/m", "base_url": server.base_url},
                                       "auditor": {"model": "mock/default"}, "player_mode": "scripted"})
    with pytest.raises(PreflightError, match="HTTP 401") as info:
        preflight(config)
    assert info.value.code == EXIT_USAGE


def test_urls_lose_their_credentials() -> None:
    assert redact_url("http://u:p@host:1/v1?api_key=abc&x=1") == "http://[redacted]@host:1/v1?api_key=[redacted]&x=1"


@pytest.mark.slow
def test_the_command_fails_in_seconds_as_a_process(hostile: Start, tmp_path: Path) -> None:
    server = hostile(refuse_key)
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "ncpbench", "run", "--envs", "all", "--out", str(tmp_path / "r"),
                          "--narrator", "openai/m", "--narrator-base-url", server.base_url,
                          "--auditor", "mock/default", "--player-mode", "scripted"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == EXIT_USAGE and time.monotonic() - started < 30  # mostly interpreter start on 2 busy cores
    assert "HTTP 401" in one_line_error(out.stderr) and not (tmp_path / "r").exists()
