"""Secrets out of every stored text: API keys, bearer tokens and credentials inside URLs.

Pure (standard library only), so the config (run.json, records) and the client share it.
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

_KNOWN_KEYS: set[str] = set()
"""Every API key a client has read: redacted wherever it turns up, whatever its variable is named."""


def remember_key(value: str) -> None:
    if len(value) >= 8:
        _KNOWN_KEYS.add(value)


_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s@:]*(?::[^/\s@]*)?@")


def redact_url(url: str | None) -> str | None:
    """The URL without its credentials (`http://user:PASS@host/v1` -> `http://[redacted]@host/v1`)."""
    if url is None:
        return None
    return _URL_CREDENTIALS.sub(r"\1[redacted]@", url)


def remember_url_credentials(url: str | None) -> None:
    """A password (or token-as-user) inside a base URL is a secret like a key: redact it everywhere."""
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


def redact(text: str) -> str:
    """Strip anything that looks like a bearer token, an API key or URL credentials from a text."""
    for value in _KNOWN_KEYS:
        if value in text:
            text = text.replace(value, "[redacted]")
    text = _URL_CREDENTIALS.sub(r"\1[redacted]@", text)
    text = re.sub(r"(?i)(bearer\s+)[A-Za-z0-9._\-]+", r"\1[redacted]", text)
    text = re.sub(r"\bsk-[A-Za-z0-9_\-]{6,}", "[redacted]", text)
    for name, value in os.environ.items():
        if value and len(value) >= 8 and ("KEY" in name or "TOKEN" in name or "SECRET" in name) and value in text:
            text = text.replace(value, "[redacted]")
    return text
