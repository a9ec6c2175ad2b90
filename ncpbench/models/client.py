"""One async client for every OpenAI-compatible endpoint, with structured output and usage.

Transport retries (429 with Retry-After, 5xx, timeouts, connection resets) are the openai
client's own, with backoff. On top of that, `structured` validates every answer against a
pydantic model (and an optional semantic check) and re-asks at most `reasks` times, telling the
model what was wrong, before giving up with InvalidOutputError. Secrets never reach messages.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

import openai
from pydantic import BaseModel, ValidationError

from ncpbench.errors import InvalidOutputError, MalformedResponse, ModelCallError
from ncpbench.logs import get_logger
from ncpbench.models.cache import ResponseCache
from ncpbench.models.config import RoleConfig
from ncpbench.verdict import Usage

log = get_logger("ncpbench.models")
M = TypeVar("M", bound=BaseModel)
Message = dict[str, str]
REASKS = 2
"""An invalid output is re-asked at most twice (the published setup), then it is an error."""
_CALL_ATTEMPTS: ContextVar[list[int] | None] = ContextVar("ncpbench_call_attempts", default=None)
"""Transport attempts of the call running in this task (the global counter is shared by every call)."""


@dataclass
class Completion:
    text: str
    usage: Usage
    cached: bool = False


@dataclass
class CallStats:
    """Counts for the run record: calls, transport attempts, re-asks, failures."""

    calls: int = 0
    attempts: int = 0
    reasks: int = 0
    recovered: int = 0
    failed: int = 0
    invalid: int = 0
    cache_hits: int = 0
    in_flight: int = 0
    """Calls sent and not yet answered or failed (0 once every caller has finished)."""
    client_cpu_s: float = 0.0
    """Process CPU time spent while model calls were in flight (exact at concurrency 1; benchmarks)."""
    by_status: dict[str, int] = field(default_factory=dict)

    @property
    def retried(self) -> int:
        return max(0, self.attempts - self.calls + self.cache_hits)

    def as_dict(self) -> dict[str, int]:
        return {"calls": self.calls, "attempts": self.attempts, "retried": self.retried, "reasks": self.reasks,
                "recovered": self.recovered, "failed": self.failed, "invalid_outputs": self.invalid,
                "cache_hits": self.cache_hits, "in_flight": self.in_flight}


_KNOWN_KEYS: set[str] = set()
"""Every API key a client has read: redacted wherever it turns up, whatever its variable is named."""


def remember_key(value: str) -> None:
    if len(value) >= 8:
        _KNOWN_KEYS.add(value)


def redact(text: str) -> str:
    """Strip anything that looks like a bearer token or API key from an error message."""
    for value in _KNOWN_KEYS:
        if value in text:
            text = text.replace(value, "[redacted]")
    text = re.sub(r"(?i)(bearer\s+)[A-Za-z0-9._\-]+", r"\1[redacted]", text)
    text = re.sub(r"\bsk-[A-Za-z0-9_\-]{6,}", "[redacted]", text)
    for name, value in os.environ.items():
        if value and len(value) >= 8 and ("KEY" in name or "TOKEN" in name or "SECRET" in name) and value in text:
            text = text.replace(value, "[redacted]")
    return text


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
    """Shared by all roles of a run: one openai.AsyncOpenAI per endpoint, one semaphore per endpoint."""

    def __init__(self, cache: ResponseCache | None = None, reasks: int = REASKS) -> None:
        self.cache = cache
        self.reasks = reasks
        self.stats = CallStats()
        self._clients: dict[tuple[str, str, int], openai.AsyncOpenAI] = {}
        self._limits: dict[tuple[str, int], asyncio.Semaphore] = {}
        self._endpoints: dict[str, str] = {}
        self._closers: list[Callable[[], None]] = []

    # -- endpoints ----------------------------------------------------------------------------

    def endpoint(self, role: RoleConfig) -> str:
        if role.base_url:
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

    def _client(self, role: RoleConfig) -> openai.AsyncOpenAI:
        url = self.endpoint(role)
        # Connection pools belong to an event loop: one client per loop, so a ModelClient can be
        # shared by envs stepped from different loops (vector envs, threads, forked workers).
        loop = id(asyncio.get_running_loop())
        ident = (url, role.api_key_env or "", loop)
        if ident not in self._clients:
            stats = self.stats

            async def count_attempt(request: Any) -> None:
                stats.attempts += 1
                mine = _CALL_ATTEMPTS.get()
                if mine is not None:
                    mine[0] += 1

            import httpx2

            http = httpx2.AsyncClient(event_hooks={"request": [count_attempt]},
                                      limits=httpx2.Limits(max_connections=role.concurrency + 8))
            self._clients[ident] = openai.AsyncOpenAI(base_url=url, api_key=self._api_key(role),
                                                      max_retries=role.max_retries, timeout=role.timeout_s,
                                                      http_client=http)
            self._limits.setdefault((url, loop), asyncio.Semaphore(role.concurrency))
        return self._clients[ident]

    async def aclose(self) -> None:
        """Close the clients of the running loop (others' pools die with their loops)."""
        loop = id(asyncio.get_running_loop())
        for ident in [k for k in self._clients if k[2] == loop]:
            await self._clients.pop(ident).close()

    # -- calls --------------------------------------------------------------------------------

    def _params(self, role: RoleConfig) -> dict[str, Any]:
        params: dict[str, Any] = {}
        for name in ("temperature", "top_p", "max_tokens", "seed"):
            value = getattr(role, name)
            if value is not None:
                params[name] = value
        return params

    async def chat(self, role: RoleConfig, messages: Sequence[Message], *, response_format: dict[str, Any] | None = None,
                   salt: str = "") -> Completion:
        params = self._params(role)
        key = None
        if self.cache is not None:
            key = self.cache.key({"model": role.model, "endpoint": role.base_url or role.provider,
                                  "messages": list(messages), "params": params, "format": response_format,
                                  "salt": salt})
            hit = self.cache.get(key)
            if hit is not None:
                self.stats.calls += 1
                self.stats.cache_hits += 1
                return Completion(hit["text"], Usage(**hit["usage"]), cached=True)
        client = self._client(role)
        # response_format goes in the body as is: the SDK would otherwise walk the whole JSON schema
        # through its type transforms on every call (a measurable share of a turn's CPU).
        extra: dict[str, Any] = {"extra_body": {"response_format": response_format}} if response_format else {}
        self.stats.calls += 1
        attempts = [0]  # this call's own transport attempts (other calls run concurrently)
        started = time.perf_counter()
        cpu_started = time.process_time()
        async with self._limits[(self.endpoint(role), id(asyncio.get_running_loop()))]:
            token = _CALL_ATTEMPTS.set(attempts)
            self.stats.in_flight += 1
            try:
                resp = await client.chat.completions.create(model=role.model_name, messages=list(messages),  # type: ignore[arg-type]
                                                            **params, **extra)
            except openai.APIStatusError as e:
                self.stats.failed += 1
                raise ModelCallError(redact(f"{role.model}: HTTP {e.status_code} after retries")) from None
            except openai.APITimeoutError:
                self.stats.failed += 1
                raise ModelCallError(f"{role.model}: timed out after retries") from None
            except openai.APIConnectionError as e:
                self.stats.failed += 1
                raise ModelCallError(redact(f"{role.model}: connection failed after retries ({type(e).__name__})")) from None
            except openai.APIError as e:
                self.stats.failed += 1
                raise ModelCallError(redact(f"{role.model}: {type(e).__name__}: {e}")) from None
            except ValueError:  # the endpoint answered 200 with a body that is not JSON
                self.stats.failed += 1
                raise MalformedResponse(f"{role.model}: malformed response body") from None
            finally:
                _CALL_ATTEMPTS.reset(token)
                self.stats.in_flight -= 1
        self.stats.client_cpu_s += time.process_time() - cpu_started
        if attempts[0] > 1:
            self.stats.recovered += 1
        choice = resp.choices[0] if resp.choices else None
        text = (choice.message.content if choice and choice.message else None) or ""
        usage = Usage(prompt_tokens=getattr(resp.usage, "prompt_tokens", 0) or 0,
                      completion_tokens=getattr(resp.usage, "completion_tokens", 0) or 0, calls=1)
        if self.cache is not None and key is not None and text.strip():
            self.cache.put(key, {"text": text, "usage": usage.model_dump()})
        log.debug("model_call", model=role.model, prompt_tokens=usage.prompt_tokens,
                  completion_tokens=usage.completion_tokens, seconds=round(time.perf_counter() - started, 3))
        return Completion(text, usage)

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
        """
        fmt = self.response_format(role, schema, name, json_schema)
        convo = list(messages)
        usage = Usage()
        problems: list[str] = []
        for attempt in range(self.reasks + 1):
            try:
                completion = await self.chat(role, convo, response_format=fmt, salt=f"{salt}#{attempt}")
            except MalformedResponse:
                completion = Completion("", Usage(calls=1))
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
                log.info("reask", model=role.model, stage=name, attempt=attempt + 1, problems=problems[:3])
                convo = [*convo, {"role": "assistant", "content": completion.text[:4000]},
                         {"role": "user", "content": "That answer cannot be used: " + "; ".join(problems)
                          + ". Answer again with one JSON object that follows the schema exactly, and nothing else.\n"
                          + json.dumps(json_schema or schema_of(schema))}]
        raise InvalidOutputError(f"{role.model}: invalid {name} output after {self.reasks} re-asks: "
                                 + "; ".join(problems)[:300])
