"""Per-role model configuration: which model, where, and how it is sampled.

A model string is `provider/model`:
- `openai/MODEL`  OpenAI or any OpenAI-compatible endpoint (vLLM, Ollama, llama.cpp server,
                  OpenRouter, ...), chosen by `base_url`;
- `mock/NAME`     the loopback mock server (`ncpbench mock-server`); started in-process when no
                  base URL is given;
- `local/smollm2-135m`  the embedded local model (llama-cpp-python, optional extra `local`).

Precedence, highest first: CLI flags, environment variables (NCPBENCH_<ROLE>_MODEL,
NCPBENCH_<ROLE>_BASE_URL, ...), a run config file (YAML or JSON), the profile's defaults.
API keys are never stored here: only the *name* of the variable that holds one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from ncpbench.models.redaction import redact_url

ROLES = ("narrator", "player", "auditor")
StructuredMode = Literal["auto", "json_schema", "json_object", "prompt"]


class RoleConfig(BaseModel):
    """How one role (narrator, player or auditor) reaches its model."""

    model_config = ConfigDict(extra="forbid")

    model: str = "mock/default"
    """`provider/model`, e.g. `openai/gpt-4o-mini`, `mock/default`, `local/smollm2-135m`."""
    base_url: str | None = None
    """OpenAI-compatible endpoint, e.g. http://localhost:8000/v1 (vLLM) or http://localhost:11434/v1 (Ollama)."""
    api_key_env: str | None = None
    """Name of the environment variable holding the API key (default OPENAI_API_KEY for openai/)."""
    temperature: float | None = None
    """Sampling temperature (None = the endpoint's default)."""
    top_p: float | None = None
    """Nucleus sampling mass (None = the endpoint's default)."""
    max_tokens: int | None = None
    """Cap on completion tokens per call."""
    seed: int | None = None
    """Sampling seed where the backend honours one."""
    structured: StructuredMode = "auto"
    """How JSON is requested: json_schema (OpenAI style), json_object with the schema (llama.cpp), prompt only."""
    timeout_s: float = 120.0
    """Deadline of one whole model call: every attempt, retry, backoff and body byte (not per read)."""
    max_retries: int = 4
    """Client retries (with backoff, honouring Retry-After) for 429 / 5xx / timeouts / resets / unusable 200 bodies."""
    concurrency: int = 64
    """Most requests in flight to this endpoint at once."""

    @property
    def provider(self) -> str:
        return self.model.split("/", 1)[0] if "/" in self.model else "openai"

    @property
    def model_name(self) -> str:
        return self.model.split("/", 1)[1] if "/" in self.model else self.model

    def structured_mode(self) -> Literal["json_schema", "json_object", "prompt"]:
        if self.structured != "auto":
            return self.structured
        # llama.cpp's server answers json_schema with HTTP 500 but constrains json_object + schema.
        return "json_object" if self.provider == "local" else "json_schema"

    def public(self) -> dict[str, Any]:
        """For records: everything but secrets (the key's variable name is fine, its value never)."""
        data = self.model_dump(mode="json")
        data["base_url"] = redact_url(self.base_url)  # http://user:PASS@host -> http://[redacted]@host
        return data


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    narrator: RoleConfig = Field(default_factory=RoleConfig)
    player: RoleConfig = Field(default_factory=RoleConfig)
    auditor: RoleConfig = Field(default_factory=RoleConfig)
    player_mode: Literal["adversarial", "cooperative", "scripted"] = "adversarial"
    """LLM player condition, or the model-free scripted adversary."""
    profile: str = "default"
    cache_path: str | None = None
    """SQLite response cache (opt-in): a cached run replays exactly."""

    def role(self, name: str) -> RoleConfig:
        return getattr(self, name)  # type: ignore[no-any-return]

    def public(self) -> dict[str, Any]:
        data = self.model_dump(mode="json")
        data.update({r: self.role(r).public() for r in ROLES})  # each role's URL without credentials
        return data


PROFILES: dict[str, dict[str, dict[str, Any]]] = {
    # Narrator and player sample; the auditor is deterministic where the backend allows.
    "default": {
        "narrator": {"temperature": 0.7, "max_tokens": 400},
        "player": {"temperature": 0.9, "max_tokens": 120},
        "auditor": {"temperature": 0.0, "seed": 0, "max_tokens": 800},
    },
    # The published setup: every role at temperature 0.6, top-p 0.95, up to 8092 output tokens.
    "paper": {role: {"temperature": 0.6, "top_p": 0.95, "max_tokens": 8092} for role in ROLES},
}

_ENV_FIELDS = {"MODEL": "model", "BASE_URL": "base_url", "API_KEY_ENV": "api_key_env", "TEMPERATURE": "temperature",
               "TOP_P": "top_p", "MAX_TOKENS": "max_tokens", "SEED": "seed", "STRUCTURED": "structured",
               "TIMEOUT": "timeout_s", "CONCURRENCY": "concurrency"}


def load_config_file(path: str | Path) -> dict[str, Any]:
    text = Path(path).read_text(encoding="utf-8")
    data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a run config must be a mapping of roles to settings")
    return data


def resolve_run_config(
    flags: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    config_file: str | Path | None = None,
    profile: str = "default",
    extra: Mapping[str, Any] | None = None,
) -> RunConfig:
    """Merge profile < config file < environment < flags into one RunConfig."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; known: {sorted(PROFILES)}")
    env = os.environ if environ is None else environ
    file_data = load_config_file(config_file) if config_file else {}
    roles: dict[str, dict[str, Any]] = {}
    for role in ROLES:
        merged: dict[str, Any] = dict(PROFILES[profile].get(role, {}))
        merged.update(file_data.get(role) or {})
        for suffix, field in _ENV_FIELDS.items():
            value = env.get(f"NCPBENCH_{role.upper()}_{suffix}")
            if value not in (None, ""):
                merged[field] = value
        merged.update({k: v for k, v in (flags or {}).get(role, {}).items() if v is not None})
        roles[role] = merged
    top = {k: v for k, v in file_data.items() if k not in ROLES}
    top.update({k: v for k, v in (extra or {}).items() if v is not None})
    return RunConfig(**{r: RoleConfig(**roles[r]) for r in ROLES}, profile=profile, **top)
