"""How a chat request travels to an endpoint: the openai SDK, or a lean HTTP/1.1 client of ours.

Both transports do the same thing for `ModelClient`: POST one JSON body to `{base_url}{path}` and
hand back the status, the headers and the whole body, raising `TransportError` when no HTTP
answer came (refused, reset, a broken response). Everything that decides what an answer means
(retries, status codes, malformed bodies, the whole-call deadline) stays in the client, so the
two transports are interchangeable and a run's results do not depend on which one carried it.

- `sdk`: `openai.AsyncOpenAI.post(..., cast_to=httpx.Response)`, the SDK's raw path (its request
  transform and response models are skipped; its HTTP stack, TLS, proxies and auth are used).
- `direct`: keep-alive HTTP/1.1 over asyncio streams, one small pool per endpoint and event loop.
  It costs about a tenth of the SDK's CPU per call (docs/PERFORMANCE.md), which is what lets one
  process drive a fast local endpoint at a hundred episodes in flight. It speaks plain HTTP/1.1
  with Content-Length or chunked bodies, gzip/deflate when a server compresses anyway, and TLS;
  it does not use proxies.
- `auto` (the default): `direct` for plain `http://` endpoints that no proxy setting applies to
  (loopback, vLLM, llama.cpp, Ollama, the mock), `sdk` for everything else (hosted HTTPS APIs,
  where the network, not our CPU, is the cost).
"""

from __future__ import annotations

import asyncio
import ssl
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol
from urllib.parse import parse_qsl, urlsplit, urlunsplit
from urllib.request import getproxies, proxy_bypass

TransportName = Literal["auto", "sdk", "direct"]
TRANSPORTS: tuple[str, ...] = ("auto", "sdk", "direct")
MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024
"""A chat completion is kilobytes; a body past this is a broken endpoint, not an answer to read whole."""


class TransportError(Exception):
    """No usable HTTP answer: the connection failed, was reset, or the response was not HTTP."""


class TransportTimeout(TransportError):
    """The transport's own timeout (the SDK's); the client's whole-call deadline is separate."""


@dataclass(frozen=True)
class HTTPReply:
    status: int
    headers: Mapping[str, str]
    """Lower-case header names."""
    body: bytes

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


class Transport(Protocol):
    async def post(self, path: str, body: bytes, headers: Mapping[str, str]) -> HTTPReply: ...

    async def aclose(self) -> None: ...


def choose(name: str, base_url: str) -> Literal["sdk", "direct"]:
    """The transport `name` means for this endpoint (`auto` resolved as the module docstring says)."""
    if name == "sdk":
        return "sdk"
    if name == "direct":
        return "direct"
    parts = urlsplit(base_url)
    if parts.scheme != "http":
        return "sdk"
    proxied = "http" in getproxies() and not proxy_bypass(parts.hostname or "")
    return "sdk" if proxied else "direct"


# -- sdk ----------------------------------------------------------------------------------------


class SDKTransport:
    """The openai SDK's own HTTP stack, on its raw path (no request transform, no response model)."""

    def __init__(self, client: Any) -> None:
        # openai and httpx2 are imported here, not at module level, so `import ncpbench` stays light.
        import httpx2
        import openai

        self.client = client  # an openai.AsyncOpenAI
        self._raw = httpx2.Response
        self._errors = openai

    async def post(self, path: str, body: bytes, headers: Mapping[str, str]) -> HTTPReply:
        errors = self._errors
        try:
            raw = await self.client.post(path, content=body, cast_to=self._raw, options={"headers": dict(headers)})
        except errors.APIStatusError as e:
            return _reply_of(e.response)
        except errors.APITimeoutError:
            raise TransportTimeout("timed out") from None
        except errors.APIConnectionError as e:
            raise TransportError(type(e.__cause__).__name__ if e.__cause__ else type(e).__name__) from None
        return _reply_of(raw)

    async def aclose(self) -> None:
        await self.client.close()


def sdk_client(base_url: str, *, sync: bool = False, **kwargs: Any) -> Any:
    """An openai.AsyncOpenAI (or OpenAI) for `base_url`; its query becomes the SDK's default query
    (appended to a base URL as is, the request path would land after it)."""
    import openai

    parts = urlsplit(base_url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    make = openai.OpenAI if sync else openai.AsyncOpenAI
    return make(base_url=urlunsplit(parts._replace(query="", fragment="")), default_query=query or None, **kwargs)


def _reply_of(response: Any) -> HTTPReply:
    try:
        body = bytes(response.content)
    except Exception as e:  # a body that broke off mid-read is a failed transfer, not an answer
        raise TransportError(f"body unreadable ({type(e).__name__})") from None
    return HTTPReply(int(response.status_code), {k.lower(): v for k, v in response.headers.items()}, body)


# -- direct -------------------------------------------------------------------------------------


_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class DirectTransport:
    """Keep-alive HTTP/1.1 POSTs on asyncio streams. Belongs to the event loop that first uses it.

    A connection goes back to the pool only after a whole response was read from it and the server
    did not ask to close; anything else (an error, a cancellation mid-request) closes it, so a
    half-read response can never be taken for the next one.
    """

    def __init__(self, base_url: str, *, api_key: str | None = None, max_idle: int = 256) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        # A base URL's query (Azure's api-version, a gateway's key) goes on every request.
        self.query = f"?{parts.query}" if parts.query else ""
        self.tls = parts.scheme == "https"
        self.authority = parts.netloc.rpartition("@")[2]  # credentials never go in the Host header
        self.max_idle = max_idle
        if api_key and ("\r" in api_key or "\n" in api_key):
            raise ValueError("the API key contains a line break: check the variable it is read from")
        self._auth = f"Authorization: Bearer {api_key}" if api_key else None
        self._idle: list[_Conn] = []
        self._ssl: ssl.SSLContext | None = None

    async def _connect(self) -> _Conn:
        context = None
        if self.tls:
            if self._ssl is None:
                self._ssl = _tls_context()
            context = self._ssl
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port, ssl=context,
                                                           limit=MAX_HEADER_BYTES)
        except (OSError, ssl.SSLError) as e:
            raise TransportError(type(e).__name__) from None
        return reader, writer

    def _take_idle(self) -> _Conn | None:
        while self._idle:
            reader, writer = self._idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()  # the server closed it while it sat idle
        return None

    async def post(self, path: str, body: bytes, headers: Mapping[str, str]) -> HTTPReply:
        conn = self._take_idle() or await self._connect()
        reader, writer = conn
        keep = False
        try:
            head = [f"POST {self.prefix}{path}{self.query} HTTP/1.1", f"Host: {self.authority}",
                    f"Content-Length: {len(body)}", "Accept-Encoding: gzip, deflate"]
            head += [f"{name}: {value}" for name, value in headers.items()]
            if self._auth:
                head.append(self._auth)
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
            await writer.drain()
            reply, keep = await _read_response(reader)
            return reply
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ssl.SSLError) as e:
            raise TransportError(type(e).__name__) from None
        finally:
            if keep and len(self._idle) < self.max_idle:
                self._idle.append(conn)
            else:
                writer.close()

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()


def _tls_context() -> ssl.SSLContext:
    try:
        import certifi  # the CA bundle the SDK's stack uses; the system store otherwise

        return ssl.create_default_context(cafile=certifi.where())
    except ImportError:
        return ssl.create_default_context()


async def _read_response(reader: asyncio.StreamReader) -> tuple[HTTPReply, bool]:
    """(the reply, whether the connection may carry another request)."""
    while True:
        raw = await reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code = rest.partition(" ")[0]
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise TransportError(f"not an HTTP response ({lines[0][:40]!r})")
        status = int(code)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                key = name.strip().lower()
                headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
        if 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
            continue
        break
    connection = headers.get("connection", "").lower()
    keep = "close" not in connection and (version == "HTTP/1.1" or "keep-alive" in connection)
    if status in (204, 304):  # no body by definition, whatever the headers say
        return HTTPReply(status, headers, b""), keep
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader)
    elif "content-length" in headers:
        try:
            length = int(headers["content-length"].split(",")[0])
        except ValueError:
            raise TransportError("bad Content-Length") from None
        if length < 0 or length > MAX_BODY_BYTES:
            raise TransportError(f"Content-Length {length} out of bounds")
        body = await reader.readexactly(length)
    else:  # the body runs until the server closes
        body = await reader.read(MAX_BODY_BYTES + 1)
        while len(body) <= MAX_BODY_BYTES:
            more = await reader.read(MAX_BODY_BYTES + 1 - len(body))
            if not more:
                break
            body += more
        if len(body) > MAX_BODY_BYTES:
            raise TransportError("body too large")
        keep = False
    encoding = headers.get("content-encoding", "").lower()
    if encoding in ("gzip", "deflate"):
        inflate = zlib.decompressobj(wbits=47 if encoding == "gzip" else 15)
        try:
            body = inflate.decompress(body, MAX_BODY_BYTES)
        except zlib.error:
            raise TransportError(f"bad {encoding} body") from None
        if inflate.unconsumed_tail:
            raise TransportError("body too large")
    return HTTPReply(status, headers, body), keep


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        line = await reader.readuntil(b"\r\n")
        try:
            n = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise TransportError("bad chunk size") from None
        if n == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers, then the blank line
                pass
            return b"".join(parts)
        size += n
        if size > MAX_BODY_BYTES:
            raise TransportError("body too large")
        parts.append(await reader.readexactly(n))
        await reader.readexactly(2)
