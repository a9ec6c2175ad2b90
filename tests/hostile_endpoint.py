"""A loopback OpenAI-compatible endpoint that misbehaves on purpose, for the reliability tests.

`HostileEndpoint(mode, bad=N)` answers its first N chat requests (all, when N is None) the way
`mode` names, and the rest like the mock server would. Every mode is a 200 (or a dripping body),
so nothing at the HTTP status level warns the client.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ncpbench.models.mock_server import MockConfig, answer_for

MODES = ("empty_choices", "null_content", "missing_content", "blank_content", "content_filter", "length_structured",
         "html", "not_json", "error_object")
"""Every bad 200 the client must refuse (length only on a structured stage)."""


def _completion(content: Any, finish: str = "stop", *, message_extra: dict[str, Any] | None = None,
                usage: dict[str, Any] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", **(message_extra or {})}
    if content is not ...:
        message["content"] = content
    return {"id": "hostile", "object": "chat.completion", "created": 0, "model": "hostile",
            "choices": [{"index": 0, "finish_reason": finish, "message": message}],
            "usage": usage or {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: HostileEndpoint

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _send(self, payload: bytes, content_type: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        srv = self.server
        with srv.lock:
            srv.requests += 1
            bad = srv.bad is None or srv.requests <= srv.bad
            srv.bodies.append(body)
        _, good = answer_for(body, MockConfig())
        mode = srv.mode if bad else "good"
        if mode == "drip":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "100000")
            self.end_headers()
            try:
                while not srv.closing.is_set():
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(srv.drip_s)
            except OSError:  # the client gave up: the point of the test
                pass
            self.close_connection = True
            return
        if mode == "html":
            self._send(b"<html><body><h1>502 Bad Gateway</h1></body></html>", "text/html; charset=utf-8")
            return
        if mode == "not_json":
            self._send(b"upstream hiccup, try later")
            return
        payloads = {
            "good": {**_completion(srv.reply if srv.reply is not None else good, usage=srv.usage), **srv.top},
            "empty_choices": {"id": "hostile", "object": "chat.completion", "choices": [],
                              "usage": {"prompt_tokens": 10, "completion_tokens": 0, "total_tokens": 10}},
            "null_content": _completion(None),
            "missing_content": _completion(...),
            "blank_content": _completion("  \n "),
            "content_filter": _completion("The story cont", "content_filter"),
            "length_structured": _completion(good, "length"),
            "error_object": {"error": {"message": "model overloaded", "type": "server_error"}},
        }
        self._send(json.dumps(payloads[mode]).encode())


class HostileEndpoint(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, mode: str, bad: int | None = None, *, drip_s: float = 0.3, reply: str | None = None,
                 usage: dict[str, Any] | None = None, top: dict[str, Any] | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.mode = mode
        self.bad = bad
        self.drip_s = drip_s
        self.reply = reply
        self.usage = usage
        self.top = top or {}
        """Extra top-level fields of a good answer (llama.cpp's `timings`)."""
        self.requests = 0
        self.bodies: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def __enter__(self) -> HostileEndpoint:
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing.set()
        self.shutdown()
        self.server_close()
