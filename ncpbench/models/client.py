"""One async client for every OpenAI-compatible endpoint, with structured output and usage.

What the client promises (docs/RELIABILITY.md names the tests):
- An endpoint fault is never an answer. A 200 whose body is not a usable chat completion (not
  JSON, a wrong content type, an error object, empty `choices`, missing or blank content,
  `finish_reason` `content_filter`, or `length` on a structured stage) is retried like a 429 / 5xx
  / timeout / reset, up to the role's `max_retries`, then raised as MalformedResponse (or
  ModelCallError for transport failures), so the episode ends as ERROR with the cause.
- The role's `timeout_s` is the deadline of the whole call: every attempt, every backoff and every
  byte of every body. A body that drips forever ends at the deadline.
- `structured` validates every answer against a pydantic model (and an optional semantic check)
  and re-asks at most `reasks` times, telling the model what was wrong, before InvalidOutputError.
- Every HTTP attempt and cache hit goes to the call sink (calls.jsonl in a batch), labelled with
  the `call_context` (episode, turn, role, stage) bound around the call.
- Keys and URL credentials are redacted from everything the client returns or records,
  including a key an endpoint echoes back inside a 200 reply.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
import re
import time
import uuid
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import pydantic_core
from pydantic import BaseModel, ValidationError

from ncpbench.errors import InvalidOutputError as InvalidOutputError  # re-exported: callers name them here
from ncpbench.errors import MalformedResponse as MalformedResponse
from ncpbench.errors import ModelCallError as ModelCallError
from ncpbench.logs import get_logger
from ncpbench.models.cache import ResponseCache
from ncpbench.models.calllog import (
    RESPONSE_CAP,
    CallEntry,
    CallSink,
    context_fields,
    current_context,
    messages_sha256,
)
from ncpbench.models.config import RoleConfig
from ncpbench.models.redaction import redact as redact  # re-exported: the driver and CLI use it
from ncpbench.models.redaction import redact_url as redact_url
from ncpbench.models.redaction import remember_key as remember_key
from ncpbench.models.redaction import remember_url_credentials
from ncpbench.models.transport import (
    DirectTransport,
    SDKTransport,
    Transport,
    TransportError,
    TransportTimeout,
    choose,
    sdk_client,
)
from ncpbench.verdict import Usage

log = get_logger("ncpbench.models")
M = TypeVar("M", bound=BaseModel)
Message = dict[str, str]
REASKS = 2
"""An invalid output is re-asked at most twice (the published setup), then it is an error."""
_REASK: ContextVar[tuple[int, str | None] | None] = ContextVar("ncpbench_reask", default=None)
"""(re-ask number, why) of the structured ask in progress, None outside `structured`; for the call
log and the `length` rule (chat's signature stays as callers and subclasses know it)."""
RETRY_STATUS = frozenset({408, 409, 429})
"""HTTP statuses worth another try (with every 5xx); other 4xx are the request's fault and final."""
MAX_RETRY_AFTER_S = 60.0
USER_AGENT = "ncpbench (OpenAI-compatible client)"
MOCK_CONTEXT_HEADER = "X-Ncpbench-Context"
"""Sent to the mock server only: which episode/role/stage a request is, for its prefix-cache model."""


@dataclass
class Completion:
    text: str
    usage: Usage
    cached: bool = False
    finish_reason: str | None = None


@dataclass
class CallStats:
    """Counts for the run record: calls, transport attempts, re-asks, failures, tokens."""

    calls: int = 0
    attempts: int = 0
    reasks: int = 0
    recovered: int = 0
    failed: int = 0
    invalid: int = 0
    cache_hits: int = 0
    in_flight: int = 0
    """Calls sent and not yet answered or failed (0 once every caller has finished)."""
    malformed: int = 0
    """Attempts answered 200 with a body that is not a usable completion (each one retried or final)."""
    deadline_exceeded: int = 0
    """Calls cut at their whole-call deadline."""
    cancelled: int = 0
    """Calls cancelled from outside while an attempt was on the wire (a failed sibling stage, a turn timeout)."""
    client_cpu_s: float = 0.0
    """Process CPU time spent while model calls were in flight (exact at concurrency 1; benchmarks)."""
    by_status: dict[str, int] = field(default_factory=dict)
    usage_by_model: dict[str, Usage] = field(default_factory=dict)
    """Tokens the endpoints reported for answered calls (cache hits cost nothing and are not here)."""

    @property
    def retried(self) -> int:
        return max(0, self.attempts - self.calls + self.cache_hits)

    def usage(self) -> Usage:
        total = Usage()
        for u in self.usage_by_model.values():
            total = total.add(u)
        return total

    def as_dict(self) -> dict[str, Any]:
        u = self.usage()
        return {"calls": self.calls, "attempts": self.attempts, "retried": self.retried, "reasks": self.reasks,
                "recovered": self.recovered, "failed": self.failed, "invalid_outputs": self.invalid,
                "malformed": self.malformed, "deadline_exceeded": self.deadline_exceeded, "cancelled": self.cancelled,
                "cache_hits": self.cache_hits, "in_flight": self.in_flight,
                "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                "cached_tokens": u.cached_tokens,
                "cached_share": round(u.cached_tokens / u.prompt_tokens, 4) if u.prompt_tokens else None,
                "by_model": {m: v.model_dump() for m, v in sorted(self.usage_by_model.items())}}


class _BodyFault(Exception):
    """A 200 whose body is not a usable completion; the message says what was wrong."""


class _StatusFault(Exception):
    """A non-2xx answer (retried when the status is worth another try)."""


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def read_usage(data: dict[str, Any]) -> Usage:
    """Tokens from a completion body, cached prompt tokens included, in each server's dialect.

    OpenAI and vLLM (with --enable-prompt-tokens-details): usage.prompt_tokens_details.cached_tokens;
    DeepSeek: usage.prompt_cache_hit_tokens; the llama.cpp server: timings.cache_n (prompt tokens
    reused from the slot's KV cache; timings.prompt_n are the ones it evaluated).
    """
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    assert isinstance(usage, dict)
    prompt, completion = _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens"))
    details = usage.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
    cached = cached or _int(usage.get("prompt_cache_hit_tokens"))
    timings = data.get("timings")
    if not cached and isinstance(timings, dict):
        cached = _int(timings.get("cache_n"))
        if not prompt and cached:  # llama.cpp counts prompt_n as the evaluated part only
            prompt = cached + _int(timings.get("prompt_n"))
    return Usage(prompt_tokens=prompt, completion_tokens=completion, calls=1, cached_tokens=min(cached, prompt))


def read_completion(content_type: str, body: str, structured: bool) -> tuple[str, str | None, Usage]:
    """(content, finish_reason, usage) of a 200 body, or _BodyFault naming why it is unusable."""
    if "json" not in content_type.lower():
        raise _BodyFault(f"wrong content type {content_type.split(';')[0].strip() or '(none)'!r}")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise _BodyFault("body is not JSON") from None
    if not isinstance(data, dict):
        raise _BodyFault("body is not a JSON object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        raise _BodyFault("error object in a 200 body" if "error" in data else "empty choices")
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    assert isinstance(message, dict)
    finish = choice.get("finish_reason")
    finish = finish if isinstance(finish, str) else None
    if finish == "content_filter":
        raise _BodyFault("finish_reason content_filter")
    content = message.get("content")
    if content is None:
        raise _BodyFault("refusal instead of content" if message.get("refusal") else "missing content")
    if not isinstance(content, str):
        raise _BodyFault("content is not text")
    if not content.strip():
        raise _BodyFault("empty content")
    if finish == "length" and structured:
        raise _BodyFault("finish_reason length on a structured stage (the answer was cut at max_tokens)")
    return content, finish, read_usage(data)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def extract_json(text: str) -> str:
    """The JSON object inside a reply (tolerates code fences and chatter around it)."""
    stripped = text.strip()
    fence = re.search(r"```(?:json)?\s*(.*?)```", stripped, re.S)
    if fence:
        stripped = fence.group(1).strip()
    start, end = stripped.find("{"), stripped.rfind("}")
    return stripped[start:end + 1] if start != -1 and end > start else stripped


@functools.cache
def _schema_json(model: type[BaseModel]) -> str:
    return json.dumps(model.model_json_schema())


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    """A fresh copy of the model's JSON schema (generating one costs milliseconds; it is cached)."""
    return json.loads(_schema_json(model))  # type: ignore[no-any-return]


class ModelClient:
    """Shared by all roles of a run: one openai.AsyncOpenAI per endpoint, one semaphore per endpoint.

    `call_sink` receives one CallEntry per HTTP attempt and per cache hit (the runner's is
    calls.jsonl). Retries are the client's own (the SDK's are off), so each attempt is seen,
    logged and bounded by the call's deadline.
    """

    def __init__(self, cache: ResponseCache | None = None, reasks: int = REASKS,
                 call_sink: CallSink | None = None) -> None:
        self.cache = cache
        self.reasks = reasks
        self.call_sink = call_sink
        self.stats = CallStats()
        self._transports: dict[tuple[str, str, str, int], Transport] = {}
        self._kinds: dict[tuple[str, str], str] = {}
        self._limits: dict[tuple[str, int], asyncio.Semaphore] = {}
        self._endpoints: dict[str, str] = {}
        self._closers: list[Callable[[], None]] = []

    # -- endpoints ----------------------------------------------------------------------------

    def endpoint(self, role: RoleConfig) -> str:
        if role.base_url:
            remember_url_credentials(role.base_url)
            return role.base_url.rstrip("/")
        key = role.model
        if key not in self._endpoints:
            if role.provider == "mock":
                from ncpbench.models.mock_server import shared_mock_server

                self._endpoints[key] = shared_mock_server().base_url
            elif role.provider == "local":
                from ncpbench.models.local import shared_local_server

                server = shared_local_server(role.model_name)
                self._endpoints[key] = server.base_url
            elif role.provider == "openai":
                self._endpoints[key] = os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1")
                remember_url_credentials(self._endpoints[key])
            else:
                raise ValueError(f"unknown provider {role.provider!r} in {role.model!r}; use openai/, mock/ or local/")
        return self._endpoints[key]

    def _api_key(self, role: RoleConfig) -> str:
        if role.provider in ("mock", "local"):
            return "not-needed"
        var = role.api_key_env or "OPENAI_API_KEY"
        value = os.environ.get(var)
        if value:
            remember_key(value)
            return value
        if role.base_url:
            return "not-needed"  # self-hosted endpoints (vLLM, Ollama, llama.cpp) rarely check keys
        raise ModelCallError(f"{role.model}: set {var} (or --*-api-key-env) to reach the hosted endpoint")

    def _transport(self, role: RoleConfig) -> Transport:
        """The transport for the role's endpoint, made once per endpoint, kind and event loop."""
        url = self.endpoint(role)
        # Connection pools belong to an event loop: one transport per loop, so a ModelClient can be
        # shared by envs stepped from different loops (vector envs, threads, forked workers).
        loop = id(asyncio.get_running_loop())
        kind = self._kinds.get((url, role.transport))
        if kind is None:  # reading the proxy settings walks os.environ: once per endpoint
            kind = self._kinds[(url, role.transport)] = choose(role.transport, url)
        ident = (url, role.api_key_env or "", kind, loop)
        if ident not in self._transports:
            key = self._api_key(role)
            if kind == "direct":
                made: Transport = DirectTransport(url, api_key=key)
            else:
                import httpx2

                # max_retries=0: the retry loop is ours (_attempts), so body faults are retried
                # alike and no attempt can outlive the call's deadline.
                http = httpx2.AsyncClient(limits=httpx2.Limits(max_connections=role.concurrency + 8))
                made = SDKTransport(sdk_client(url, api_key=key, max_retries=0, timeout=role.timeout_s,
                                               http_client=http))
            self._transports[ident] = made
            self._limits.setdefault((url, loop), asyncio.Semaphore(role.concurrency))
        return self._transports[ident]

    async def aclose(self) -> None:
        """Close the transports of the running loop (others' pools die with their loops)."""
        loop = id(asyncio.get_running_loop())
        for ident in [k for k in self._transports if k[3] == loop]:
            await self._transports.pop(ident).aclose()

    # -- calls --------------------------------------------------------------------------------

    def _params(self, role: RoleConfig) -> dict[str, Any]:
        params: dict[str, Any] = {}
        for name in ("temperature", "top_p", "max_tokens", "seed"):
            value = getattr(role, name)
            if value is not None:
                params[name] = value
        return params

    def _emit(self, role: RoleConfig, call_id: str, digest: str, started_at: str, **fields: Any) -> None:
        if self.call_sink is None:
            return
        ctx = current_context()
        reask, reason = _REASK.get() or (0, None)
        response = fields.pop("response", None)
        if response is not None:
            fields["response_chars"] = len(response)
            response = redact(response)[:RESPONSE_CAP]  # redact first: a cut must not keep half a key
        self.call_sink(CallEntry(at=started_at, call_id=call_id, episode=ctx.episode, turn=ctx.turn, role=ctx.role,
                                 stage=ctx.stage, model=role.model, reask=reask,
                                 reask_reason=redact(reason) if reason else None, messages_sha256=digest,
                                 response=response, **fields))

    async def chat(self, role: RoleConfig, messages: Sequence[Message], *, response_format: dict[str, Any] | None = None,
                   salt: str = "") -> Completion:
        params = self._params(role)
        structured = response_format is not None or _REASK.get() is not None
        digest = messages_sha256(messages)
        call_id = uuid.uuid4().hex[:16]
        key = None
        if self.cache is not None:
            key = self.cache.key({"model": role.model, "endpoint": role.base_url or role.provider,
                                  "messages": list(messages), "params": params, "format": response_format,
                                  "salt": salt})
            hit = self.cache.get(key)
            if hit is not None:
                self.stats.calls += 1
                self.stats.cache_hits += 1
                usage = Usage(**hit["usage"])
                self._emit(role, call_id, digest, _now(), attempt=0, outcome="cache_hit", latency_s=0.0,
                           usage=usage, response=hit["text"])
                return Completion(redact(hit["text"]), usage, cached=True)
        transport = self._transport(role)
        # One serialisation per call, reused by every attempt; response_format goes in as is.
        # pydantic_core's encoder: UTF-8 JSON like json.dumps(ensure_ascii=False), ~7x faster on
        # these 50-100 kB bodies (the largest single CPU cost of a call before it).
        body = pydantic_core.to_json({"model": role.model_name, "messages": list(messages), **params,
                                      **({"response_format": response_format} if response_format else {})})
        headers = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": USER_AGENT}
        if role.provider == "mock":
            ctx = current_context()
            headers[MOCK_CONTEXT_HEADER] = f"{ctx.episode or ''}|{ctx.role or ''}|{ctx.stage or ''}"
        self.stats.calls += 1
        attempts = [0]  # this call's own transport attempts (other calls run concurrently)
        cpu_started = time.process_time()
        async with self._limits[(self.endpoint(role), id(asyncio.get_running_loop()))]:
            self.stats.in_flight += 1
            try:
                # The deadline starts once a slot is free: waiting behind our own concurrency
                # limit is not the endpoint's time.
                content, finish, usage = await self._attempts(role, transport, body, headers, structured,
                                                              call_id, digest, attempts)
            finally:
                self.stats.in_flight -= 1
                self.stats.client_cpu_s += time.process_time() - cpu_started
        if attempts[0] > 1:
            self.stats.recovered += 1
        total = self.stats.usage_by_model.get(role.model, Usage())
        self.stats.usage_by_model[role.model] = total.add(usage)
        text = redact(content)  # a key echoed back by the endpoint never reaches a record or the cache
        if self.cache is not None and key is not None:
            self.cache.put(key, {"text": text, "usage": usage.model_dump()})
        return Completion(text, usage, finish_reason=finish)

    async def _attempts(self, role: RoleConfig, transport: Transport, body: bytes, headers: dict[str, str],
                        structured: bool, call_id: str, digest: str,
                        attempts: list[int]) -> tuple[str, str | None, Usage]:
        """Send until a usable answer, a final error, or the whole-call deadline."""
        deadline = time.monotonic() + role.timeout_s
        tries = role.max_retries + 1
        for attempt in range(1, tries + 1):
            started_at, started = _now(), time.perf_counter()
            status: int | None = None
            text: str | None = None
            retry_after: float | None = None
            try:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                self.stats.attempts += 1
                attempts[0] += 1
                async with asyncio.timeout(remaining):
                    reply = await transport.post("/chat/completions", body, headers)
                status, text = reply.status, reply.text()
                if not 200 <= status < 300:
                    raise _StatusFault(status)
                content, finish, usage = read_completion(reply.headers.get("content-type", ""), text, structured)
            except asyncio.CancelledError:
                # Cut from outside (a sibling audit stage failed, the turn timed out): still a
                # request that was sent, so it gets its line.
                self.stats.cancelled += 1
                self._emit(role, call_id, digest, started_at, attempt=attempt, outcome="cancelled",
                           latency_s=round(time.perf_counter() - started, 3))
                raise
            except TimeoutError:
                self.stats.failed += 1
                self.stats.deadline_exceeded += 1
                self._emit(role, call_id, digest, started_at, attempt=attempt, outcome="deadline",
                           latency_s=round(time.perf_counter() - started, 3))
                log.warning("model_call_deadline", **context_fields(), model=role.model, attempt=attempt, deadline_s=role.timeout_s)
                raise ModelCallError(f"{role.model}: timed out: no complete answer within the {role.timeout_s:g} s "
                                     f"call deadline (attempt {attempt})") from None
            except _StatusFault:
                assert status is not None
                outcome = f"http {status}"
                retryable = status in RETRY_STATUS or status >= 500
                retry_after = _retry_after(reply.headers.get("retry-after"))
                final: ModelCallError = ModelCallError(f"{role.model}: HTTP {status} after {attempt} attempt(s)")
            except TransportTimeout:
                outcome, retryable = "timeout", True
                final = ModelCallError(f"{role.model}: timed out after {attempt} attempt(s)")
            except TransportError as e:
                outcome, retryable = "connection failed", True
                final = ModelCallError(redact(f"{role.model}: connection failed after {attempt} attempt(s) ({e})"))
            except _BodyFault as e:
                self.stats.malformed += 1
                outcome, retryable = str(e), True
                final = MalformedResponse(f"{role.model}: unusable response ({e}) after {attempt} attempt(s)")
            else:
                self._emit(role, call_id, digest, started_at, attempt=attempt, outcome="ok", status=status,
                           latency_s=round(time.perf_counter() - started, 3), finish_reason=finish, usage=usage,
                           response=text)
                log.debug("model_call", **context_fields(), model=role.model, attempt=attempt, prompt_tokens=usage.prompt_tokens,
                          completion_tokens=usage.completion_tokens, cached_tokens=usage.cached_tokens,
                          finish_reason=finish, seconds=round(time.perf_counter() - started, 3))
                return content, finish, usage
            delay = _backoff(attempt, retry_after)
            again = retryable and attempt < tries and time.monotonic() + delay < deadline
            self._emit(role, call_id, digest, started_at, attempt=attempt, outcome=outcome, status=status,
                       retry=again, latency_s=round(time.perf_counter() - started, 3), response=text)
            log.info("model_call_failed", **context_fields(), model=role.model, attempt=attempt, outcome=redact(outcome), retry=again)
            if not again:
                self.stats.failed += 1
                raise final from None
            await asyncio.sleep(delay)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def response_format(self, role: RoleConfig, schema: type[BaseModel], name: str,
                        json_schema: dict[str, Any] | None = None) -> dict[str, Any] | None:
        body = json_schema or schema_of(schema)
        mode = role.structured_mode()
        if mode == "json_schema":
            return {"type": "json_schema", "json_schema": {"name": name, "schema": body}}
        if mode == "json_object":
            return {"type": "json_object", "schema": body}
        return None

    async def structured(self, role: RoleConfig, messages: Sequence[Message], schema: type[M], *, name: str,
                         check: Callable[[M], list[str]] | None = None, salt: str = "",
                         json_schema: dict[str, Any] | None = None) -> tuple[M, Usage]:
        """Ask for JSON matching `schema`; validate; re-ask with the problems at most `reasks` times.

        `json_schema` narrows what is sent to the model (e.g. ids as enums of the ids that exist, so a
        grammar-constrained backend can only name real ones); validation still uses `schema` + `check`.
        An endpoint fault (MalformedResponse, ModelCallError) is not an answer and is not re-asked:
        the transport retries already happened, so it propagates.
        """
        from ncpbench.models.calllog import call_context

        fmt = self.response_format(role, schema, name, json_schema)
        convo = list(messages)
        usage = Usage()
        problems: list[str] = []
        with call_context(stage=name):
            for attempt in range(self.reasks + 1):
                token = _REASK.set((attempt, "; ".join(problems)[:500] if attempt else None))
                try:
                    completion = await self.chat(role, convo, response_format=fmt, salt=f"{salt}#{attempt}")
                finally:
                    _REASK.reset(token)
                usage = usage.add(completion.usage)
                problems = []
                try:
                    # strict=False: raw newlines inside strings are harmless, and small models emit them.
                    obj = schema.model_validate(json.loads(extract_json(completion.text), strict=False))
                except json.JSONDecodeError as e:
                    problems = [f"answer is not valid JSON: {e.msg} at character {e.pos}"]
                except (ValidationError, RecursionError) as e:
                    errs = e.errors()[:6] if isinstance(e, ValidationError) else [{"loc": (), "msg": "nested too deeply"}]
                    problems = [f"{'.'.join(str(x) for x in err['loc']) or 'answer'}: {err['msg']}" for err in errs]
                else:
                    problems = check(obj) if check else []
                    if not problems:
                        return obj, usage
                self.stats.invalid += 1
                if attempt < self.reasks:
                    self.stats.reasks += 1
                    log.info("reask", **context_fields(), model=role.model, attempt=attempt + 1, problems=problems[:3])
                    convo = [*convo, {"role": "assistant", "content": completion.text[:4000]},
                             {"role": "user", "content": "That answer cannot be used: " + "; ".join(problems)
                              + ". Answer again with one JSON object that follows the schema exactly, and nothing else.\n"
                              + json.dumps(json_schema or schema_of(schema))}]
        raise InvalidOutputError(f"{role.model}: invalid {name} output after {self.reasks} re-asks: "
                                 + "; ".join(problems)[:300])


def _retry_after(value: str | None) -> float | None:
    try:
        seconds = float(value) if value else None
    except ValueError:
        return None
    return None if seconds is None or seconds < 0 else min(seconds, MAX_RETRY_AFTER_S)


def _backoff(attempt: int, retry_after: float | None) -> float:
    """Retry-After when the endpoint gives one, else exponential with jitter (0.5 s, 1 s, 2 s, ... 8 s)."""
    if retry_after is not None:
        return retry_after
    return min(0.5 * 2.0 ** (attempt - 1), 8.0) * (1 - 0.25 * random.random())



