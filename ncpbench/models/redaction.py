"""Secrets out of every stored text: API keys, bearer tokens, credentials and secret query values in URLs.

Pure (standard library only), so the config (run.json, records) and the client share it.
"""

from __future__ import annotations

import os
import re
from typing import overload
from urllib.parse import unquote_plus, urlsplit

_KNOWN_KEYS: set[str] = set()
"""Every API key a client has read: redacted wherever it turns up, whatever its variable is named."""


def remember_key(value: str) -> None:
    if len(value) >= 8:
        _KNOWN_KEYS.add(value)


_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s@:]*(?::[^/\s@]*)?@")
_SECRET_PARAM = re.compile(r"(?i)key|token|secret|passw|pwd|auth|sig|credential|session")
"""A query parameter whose name says it carries a secret: `api-key`, `access_token`, `sig`, `X-Amz-Signature`, ..."""
_QUERY_PAIR = re.compile(r"([?&;#])([^=&;#?\s\"'<>]+)=([^&;#\s\"'<>]*)")
_URL_IN_TEXT = re.compile(r"(?i)\b[a-z][a-z0-9+.\-]*://[^\s\"'<>]+")


def _secret_param(name: str) -> bool:
    return bool(_SECRET_PARAM.search(unquote_plus(name)))


def _mask_pair(m: re.Match[str]) -> str:
    sep, name, value = m.groups()
    return f"{sep}{name}=[redacted]" if value and _secret_param(name) else m.group(0)


def _mask_query(url: str) -> str:
    """The values of secret-looking parameters of the query (and a query-shaped fragment) masked."""
    cut = min((i for i in (url.find("?"), url.find("#")) if i >= 0), default=-1)
    if cut < 0:
        return url
    return url[:cut] + _QUERY_PAIR.sub(_mask_pair, url[cut:])


@overload
def redact_url(url: str) -> str: ...
@overload
def redact_url(url: None) -> None: ...
def redact_url(url: str | None) -> str | None:
    """The URL without its secrets: credentials (`http://user:PASS@host/v1` -> `http://[redacted]@host/v1`)
    and the values of secret-looking query parameters (`?api-key=K&api-version=1` ->
    `?api-key=[redacted]&api-version=1`). Anything else is kept as written, so the URL stays readable."""
    if url is None:
        return None
    return _mask_query(_URL_CREDENTIALS.sub(r"\1[redacted]@", url))


def remember_url_credentials(url: str | None) -> None:
    """A password (or token-as-user) inside a base URL, and the value of every secret-looking query
    parameter, are secrets like a key: remembered, so `redact` strips them from any text."""
    if not url:
        return
    try:
        parts = urlsplit(url)
    except ValueError:
        return
    # A user name beside a password is not secret (and may be a common word); alone it is a token.
    secret = parts.password if parts.password else parts.username
    if secret:
        remember_key(secret)
    for pair in re.split(r"[&;]", f"{parts.query}&{parts.fragment}"):
        name, _, value = pair.partition("=")
        if value and _secret_param(name):
            remember_key(value)  # as written, and decoded (an SDK or a server may quote it either way)
            remember_key(unquote_plus(value))


_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._\-]+")
_SK_KEY = re.compile(r"\bsk-[A-Za-z0-9_\-]{6,}")
_ENV_SECRETS: tuple[object, tuple[str, ...]] = (None, ())


def _environment_secrets() -> tuple[str, ...]:
    """Values of KEY / TOKEN / SECRET variables. Decoding all of os.environ on every call cost about
    5% of a batch's CPU, so the list is rebuilt only when the environment changed: the raw (bytes)
    items are compared first, which is cheap because unchanged entries are the same objects."""
    global _ENV_SECRETS
    raw = getattr(os.environ, "_data", None)
    snapshot: object = tuple(raw.items()) if isinstance(raw, dict) else None
    if snapshot is None or snapshot != _ENV_SECRETS[0]:
        found = tuple(v for n, v in os.environ.items()
                      if v and len(v) >= 8 and ("KEY" in n or "TOKEN" in n or "SECRET" in n))
        _ENV_SECRETS = (snapshot, found)
    return _ENV_SECRETS[1]


def redact(text: str) -> str:
    """Strip anything that looks like a bearer token, an API key, URL credentials or a secret query value."""
    for value in _KNOWN_KEYS:
        if value in text:
            text = text.replace(value, "[redacted]")
    # Substring checks first: the regexes are case-insensitive scans, and most texts hold none of it.
    if "@" in text:
        text = _URL_CREDENTIALS.sub(r"\1[redacted]@", text)
    if "://" in text and "=" in text:  # a URL someone else built (an echoed request, a signed link)
        text = _URL_IN_TEXT.sub(lambda m: _mask_query(m.group(0)), text)
    if "bearer" in text.lower():
        text = _BEARER.sub(r"\1[redacted]", text)
    if "sk-" in text:
        text = _SK_KEY.sub("[redacted]", text)
    for value in _environment_secrets():
        if value in text:
            text = text.replace(value, "[redacted]")
    return text
