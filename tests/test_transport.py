"""The two transports: the same answers through either, and the direct one's HTTP/1.1 handled right.

The direct transport is ours, so it is tested against a raw socket server that writes exactly the
bytes a test scripts (chunked bodies, gzip, `Connection: close`, a server that drops idle
connections, a response cut off mid-body), and against the mock server's faults beside the SDK.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from ncpbench.models.calllog import CallEntry
from ncpbench.models.client import MalformedResponse, ModelCallError, ModelClient
from ncpbench.models.config import RoleConfig
from ncpbench.models.mock_server import MockConfig, MockServer, answer_for
from ncpbench.models.transport import MAX_BODY_BYTES, DirectTransport, TransportError, choose

MESSAGES = [{"role": "user", "content": "Say something."}]


def completion(content: str) -> bytes:
    return json.dumps({"id": "x", "object": "chat.completion", "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2}}).encode()


def reply(body: bytes, *headers: str, status: str = "200 OK", version: str = "HTTP/1.1") -> bytes:
    head = [f"{version} {status}", "Content-Type: application/json", *headers]
    if not any(h.lower().startswith(("content-length", "transfer-encoding")) for h in headers):
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class RawServer:
    """Answers the n-th request with `script(n)`: the bytes to send and whether to close after."""

    def __init__(self, script: Callable[[int], tuple[bytes, bool]]) -> None:
        self.script = script
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.requests = 0
        self.connections = 0
        self.bodies: list[bytes] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                while len(buf) < length:
                    buf += conn.recv(65536)
                body, buf = buf[:length], buf[length:]
                with self.lock:
                    n = self.requests
                    self.requests += 1
                    self.bodies.append(head + b"\r\n\r\n" + body)
                data, close = self.script(n)
                conn.sendall(data)
                if close:
                    return

    def close(self) -> None:
        self.sock.close()


@contextmanager
def raw_server(script: Callable[[int], tuple[bytes, bool]]) -> Iterator[RawServer]:
    server = RawServer(script)
    try:
        yield server
    finally:
        server.close()


def post_all(url: str, n: int) -> list[bytes]:
    async def go() -> list[bytes]:
        t = DirectTransport(url, api_key="sk-test-key-123")
        try:
            return [(await t.post("/chat/completions", b'{"x": 1}', {"Content-Type": "application/json"})).body
                    for _ in range(n)]
        finally:
            await t.aclose()

    return asyncio.run(go())


# -- which transport -----------------------------------------------------------------------------


def test_auto_sends_plain_http_direct_and_https_or_proxied_endpoints_through_the_sdk(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "no_proxy", "NO_PROXY", "all_proxy",
                "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    assert choose("auto", "http://127.0.0.1:8000/v1") == "direct"
    assert choose("auto", "https://api.openai.com/v1") == "sdk"
    assert choose("sdk", "http://127.0.0.1:8000/v1") == "sdk"
    assert choose("direct", "https://api.openai.com/v1") == "direct"
    monkeypatch.setenv("http_proxy", "http://proxy.internal:3128")
    assert choose("auto", "http://gpu-box:8000/v1") == "sdk", "only the SDK's stack speaks to proxies"
    monkeypatch.setenv("no_proxy", "gpu-box")
    assert choose("auto", "http://gpu-box:8000/v1") == "direct"


# -- the direct transport's HTTP/1.1 ----------------------------------------------------------------


def test_sequential_calls_reuse_one_keep_alive_connection_and_send_the_key_as_a_bearer_token() -> None:
    with raw_server(lambda n: (reply(completion(f"answer {n}")), False)) as server:
        bodies = post_all(server.url, 3)
    assert [json.loads(b)["choices"][0]["message"]["content"] for b in bodies] == ["answer 0", "answer 1", "answer 2"]
    assert server.connections == 1
    request = server.bodies[0]
    assert request.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"\r\nAuthorization: Bearer sk-test-key-123\r\n" in request and request.endswith(b'{"x": 1}')


def test_a_chunked_body_with_trailers_is_read_whole() -> None:
    body = completion("chunked answer")
    chunks = b"".join(f"{len(part):x}\r\n".encode() + part + b"\r\n" for part in (body[:7], body[7:30], body[30:]))
    data = reply(chunks + b"0\r\nX-Trailer: yes\r\n\r\n", "Transfer-Encoding: chunked")
    with raw_server(lambda n: (data, False)) as server:
        bodies = post_all(server.url, 2)
    assert bodies == [body, body] and server.connections == 1


def test_a_gzip_body_is_decoded() -> None:
    body = completion("squeezed")
    with raw_server(lambda n: (reply(gzip.compress(body), "Content-Encoding: gzip"), False)) as server:
        assert post_all(server.url, 1) == [body]


def test_connection_close_and_http_1_0_answers_are_not_reused() -> None:
    answers = [reply(completion("a"), "Connection: close"), reply(completion("b"), version="HTTP/1.0"),
               reply(completion("c"))]
    with raw_server(lambda n: (answers[n], n < 2)) as server:
        bodies = post_all(server.url, 3)
    assert [json.loads(b)["choices"][0]["message"]["content"] for b in bodies] == ["a", "b", "c"]
    assert server.connections == 3


def test_a_connection_the_server_dropped_while_idle_is_replaced_without_an_error() -> None:
    # The server closes after every answer but says nothing (no Connection: close header).
    with raw_server(lambda n: (reply(completion(str(n))), True)) as server:

        async def go() -> list[str]:
            t = DirectTransport(server.url)
            out = []
            for _ in range(3):
                r = await t.post("/chat/completions", b"{}", {})
                out.append(json.loads(r.body)["choices"][0]["message"]["content"])
                await asyncio.sleep(0.05)  # the FIN arrives while the connection sits idle
            await t.aclose()
            return out

        assert asyncio.run(go()) == ["0", "1", "2"]
    assert server.connections == 3 and server.requests == 3


def test_a_call_cancelled_mid_body_never_leaves_its_connection_for_the_next_call() -> None:
    body = completion("slow")
    slow = reply(body)[:-10]  # everything but the last 10 bytes, which never come

    def script(n: int) -> tuple[bytes, bool]:
        return (slow, False) if n == 0 else (reply(completion(f"fresh {n}")), False)

    with raw_server(script) as server:

        async def go() -> str:
            t = DirectTransport(server.url)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.3):
                    await t.post("/chat/completions", b"{}", {})
            r = await t.post("/chat/completions", b"{}", {})
            await t.aclose()
            return str(json.loads(r.body)["choices"][0]["message"]["content"])

        assert asyncio.run(go()) == "fresh 1"
    assert server.connections == 2


@pytest.mark.parametrize("data, why", [
    (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "not an HTTP response"),
    (reply(b"", f"Content-Length: {MAX_BODY_BYTES + 1}"), "out of bounds"),
    (reply(b"zz\r\n", "Transfer-Encoding: chunked"), "bad chunk size"),
    (reply(b"not gzip at all", "Content-Encoding: gzip"), "bad gzip body"),
    (reply(completion("cut"))[:-5], "IncompleteReadError"),
])
def test_a_broken_response_is_a_transport_error_naming_what_broke(data: bytes, why: str) -> None:
    with raw_server(lambda n: (data, True)) as server, pytest.raises(TransportError, match=why):
        post_all(server.url, 1)


def test_a_204_has_no_body_and_leaves_the_connection_usable() -> None:
    answers = [b"HTTP/1.1 204 No Content\r\n\r\n", reply(completion("after"))]
    with raw_server(lambda n: (answers[n], False)) as server:
        assert post_all(server.url, 2) == [b"", completion("after")]
    assert server.connections == 1


def test_a_key_with_a_line_break_is_refused_before_it_can_forge_a_header() -> None:
    with pytest.raises(ValueError, match="line break"):
        DirectTransport("http://127.0.0.1:9/v1", api_key="sk-abc\r\nX-Evil: 1")


def test_a_refused_connection_is_a_transport_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(TransportError, match="ConnectionRefusedError"):
        post_all(f"http://127.0.0.1:{port}/v1", 1)


# -- both transports, the same client behaviour -----------------------------------------------------


def ask(role: RoleConfig, entries: list[CallEntry] | None = None) -> str:
    async def go() -> str:
        client = ModelClient(call_sink=entries.append if entries is not None else None)
        try:
            return (await client.chat(role, MESSAGES)).text
        finally:
            await client.aclose()

    return asyncio.run(go())


@pytest.mark.parametrize("transport", ["sdk", "direct"])
def test_both_transports_carry_the_same_request_and_bring_back_the_same_answer(transport: str) -> None:
    seen: list[dict[str, object]] = []
    with MockServer(on_request=seen.append) as server:
        role = RoleConfig(model="mock/default", base_url=server.base_url, temperature=0.6, top_p=0.95, max_tokens=50,
                          transport=transport)
        text = ask(role)
    assert seen == [{"model": "default", "messages": MESSAGES, "temperature": 0.6, "top_p": 0.95, "max_tokens": 50}]
    assert text == answer_for(seen[0], MockConfig())[1]


@pytest.mark.parametrize("transport", ["sdk", "direct"])
@pytest.mark.parametrize("fault, error, outcome", [
    ("500", ModelCallError, "http 500"),
    ("429", ModelCallError, "http 429"),
    ("reset", ModelCallError, "connection failed"),
    ("malformed", MalformedResponse, "body is not JSON"),
])
def test_every_fault_reads_the_same_through_either_transport(transport: str, fault: str, error: type[Exception],
                                                             outcome: str) -> None:
    entries: list[CallEntry] = []
    with MockServer(MockConfig(fault_rate=1.0, fault_kinds=(fault,), retry_after_s=0)) as server:
        role = RoleConfig(model="mock/default", base_url=server.base_url, max_retries=1,
                          transport=transport)
        with pytest.raises(error):
            ask(role, entries)
        assert server.stats.requests == 2
    assert [(e.attempt, e.outcome, e.retry) for e in entries] == [(1, outcome, True), (2, outcome, False)]


def test_a_body_past_the_bound_is_a_transport_fault_the_client_retries() -> None:
    answers = [reply(b"", f"Content-Length: {MAX_BODY_BYTES + 1}"), reply(completion("after the retry"))]
    entries: list[CallEntry] = []
    with raw_server(lambda n: (answers[n], n == 0)) as server:
        role = RoleConfig(model="openai/x", base_url=server.url, max_retries=1, transport="direct")
        assert ask(role, entries) == "after the retry"
    assert [(e.attempt, e.outcome) for e in entries] == [(1, "connection failed"), (2, "ok")]


@pytest.mark.parametrize("transport", ["sdk", "direct"])
def test_a_base_url_query_goes_on_every_request_after_the_path(transport: str) -> None:
    with raw_server(lambda n: (reply(completion(f"answer {n}")), False)) as server:
        role = RoleConfig(model="openai/x", base_url=server.url + "?api-version=2024-10-21", transport=transport)
        assert ask(role) == "answer 0"
    assert server.bodies[0].startswith(b"POST /v1/chat/completions?api-version=2024-10-21 HTTP/1.1\r\n")
