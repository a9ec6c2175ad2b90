from __future__ import annotations

from pathlib import Path

import pytest

from ncpbench.dataset import load_file
from ncpbench.spec import Spec

FIXTURES = Path(__file__).parent / "fixtures"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-local", action="store_true", help="run tests that need the embedded local model")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-local"):
        return
    skip = pytest.mark.skip(reason="needs the embedded local model: pass --run-local")
    for item in items:
        if "local_model" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def tiny() -> Spec:
    return load_file(FIXTURES / "tiny.yaml")


# -- small hostile OpenAI-compatible servers on loopback (preflight and circuit-breaker tests) ----------

import json  # noqa: E402
import threading  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: E402

Answer = tuple[int, dict[str, object]]
"""(HTTP status, JSON body)."""


class HostileServer:
    """A loopback HTTP server whose every answer is chosen by `route(method, path, body)`.

    It counts the requests it gets, so a test can check that a refused run never called a model.
    """

    def __init__(self, route: Callable[[str, str, dict[str, object]], Answer]) -> None:
        self.route = route
        self.requests: list[tuple[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def _answer(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw.strip() else {}
                outer.requests.append((method, self.path))
                status, payload = outer.route(method, self.path, body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self._answer("POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def base_url(self) -> str:
        return self.root + "/v1"

    def __enter__(self) -> HostileServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def error_body(message: str, code: str | None = None) -> dict[str, object]:
    return {"error": {"message": message, "type": "invalid_request_error", "code": code}}


def chat_answer(text: str = "OK") -> dict[str, object]:
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


@pytest.fixture
def hostile() -> Iterator[Callable[[Callable[[str, str, dict[str, object]], Answer]], HostileServer]]:
    servers: list[HostileServer] = []

    def start(route: Callable[[str, str, dict[str, object]], Answer]) -> HostileServer:
        server = HostileServer(route).__enter__()
        servers.append(server)
        return server

    yield start
    for s in servers:
        s.__exit__()


@pytest.fixture(autouse=True)
def _logs_to_the_real_stderr() -> Iterator[None]:
    """`ncpbench.cli.main` called in-process binds structlog to the test's captured stderr; rebind after."""
    yield
    from ncpbench.logs import configure

    configure("WARNING")
