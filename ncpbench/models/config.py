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

import difflib
import json
import os
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ncpbench.models.redaction import redact_url, remember_url_credentials
from ncpbench.models.transport import TransportName
from ncpbench.plugins import is_plugin_ref
from ncpbench.protocol import PROTOCOLS as PROTOCOL_PRESETS
from ncpbench.protocol import AuditProtocol, get_protocol

ROLES = ("narrator", "player", "auditor")
StructuredMode = Literal["auto", "json_schema", "json_object", "prompt"]
PROVIDERS = ("openai", "mock", "local")
PROTOCOLS = tuple(PROTOCOL_PRESETS)
MOCK_DEFAULT = "mock/default"


class ConfigError(ValueError):
    """A configuration that cannot be used: `what` is wrong, `fix` says how to put it right.

    The CLI prints it as one line, `ncpbench: what: fix`; the Python API raises it as is.
    """

    def __init__(self, what: str, fix: str) -> None:
        super().__init__(f"{what}: {fix}")
        self.what = what
        self.fix = fix


def did_you_mean(word: str, choices: list[str] | tuple[str, ...]) -> str:
    """` (did you mean X?)` when a choice is close to `word`, else an empty string."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


class RoleConfig(BaseModel):
    """How one role (narrator, player or auditor) reaches its model."""

    model_config = ConfigDict(extra="forbid")

    model: str = MOCK_DEFAULT
    """`provider/model`, e.g. `openai/gpt-4o-mini`, `mock/default`, `local/smollm2-135m`."""
    base_url: str | None = None
    """OpenAI-compatible endpoint, e.g. http://localhost:8000/v1 (vLLM) or http://localhost:11434/v1 (Ollama)."""
    api_key_env: str | None = None
    """Name of the environment variable holding the API key (default OPENAI_API_KEY for openai/)."""
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    """Sampling temperature, 0 to 2 (None = the endpoint's default)."""
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    """Nucleus sampling mass, above 0 up to 1 (None = the endpoint's default)."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Cap on completion tokens per call (at least 1)."""
    seed: int | None = None
    """Sampling seed where the backend honours one."""
    structured: StructuredMode = "auto"
    """How JSON is requested: json_schema (OpenAI style), json_object with the schema (llama.cpp), prompt only."""
    timeout_s: float = Field(default=120.0, gt=0.0)
    """Deadline of one whole model call in seconds (above 0): every attempt, retry, backoff and body
    byte (not per read)."""
    max_retries: int = Field(default=4, ge=0)
    """Client retries (with backoff, honouring Retry-After) for 429 / 5xx / timeouts / resets / unusable 200 bodies."""
    concurrency: int = Field(default=64, ge=1)
    """Most requests in flight to this endpoint at once (at least 1: 0 would wait forever)."""
    transport: TransportName = "auto"
    """How requests travel: `sdk` (the openai SDK's HTTP stack), `direct` (our lean HTTP/1.1 client),
    `auto` (direct for plain-http endpoints without a proxy, sdk otherwise). It never changes a result."""

    @property
    def provider(self) -> str:
        if is_plugin_ref(self.model):
            return "python"  # your own role: `module:attr` or `path/file.py:attr` (ncpbench.plugins)
        return self.model.split("/", 1)[0] if "/" in self.model else "openai"

    @property
    def model_name(self) -> str:
        return self.model.split("/", 1)[1] if "/" in self.model else self.model

    def structured_mode(self) -> Literal["json_schema", "json_object", "prompt"]:
        if self.structured != "auto":
            return self.structured
        # llama.cpp's server answers json_schema with HTTP 500 but constrains json_object + schema.
        return "json_object" if self.provider == "local" else "json_schema"

    @property
    def is_mock(self) -> bool:
        """The loopback mock answers: a dry run, never a benchmark result."""
        return self.provider == "mock"

    def public(self) -> dict[str, Any]:
        """For records: everything but secrets (the key's variable name is fine, its value never)."""
        data = self.model_dump(mode="json")
        data["base_url"] = redact_url(self.base_url)  # user:PASS@ and ?api-key=K -> [redacted]
        remember_url_credentials(self.base_url)  # and redact() strips them from any other text too
        return data


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    narrator: RoleConfig = Field(default_factory=RoleConfig)
    player: RoleConfig = Field(default_factory=RoleConfig)
    auditor: RoleConfig = Field(default_factory=RoleConfig)
    player_mode: Literal["adversarial", "cooperative", "scripted"] = "adversarial"
    """LLM player condition, or the model-free scripted adversary."""
    profile: str = "paper"
    """The sampling defaults used (`paper`: the published setup, the default under the published
    protocol; `default`: our sampling, the default under other protocols)."""
    cache_path: str | None = None
    """SQLite response cache (opt-in): a cached run replays exactly."""
    protocol: str = "published"
    """The audit protocol: `published` (the paper's stages) or `grounded`; part of a run's identity."""
    audit_context: Literal["full", "compact"] = "full"
    """What each auditor stage sees of the story: every exchange (`full`, the published setup) or the
    committed ledger plus the last `recent_turns` exchanges (`compact`, linear cost; its own label)."""
    recent_turns: int = Field(default=6, ge=1)
    """Exchanges kept verbatim in compact audit context."""

    def audit_protocol(self) -> AuditProtocol:
        """The protocol preset with this run's audit context (`published/1`, `published/1+compact6`)."""
        preset = get_protocol(self.protocol)
        return preset if self.audit_context == "full" else preset.with_context("compact", self.recent_turns)

    def role(self, name: str) -> RoleConfig:
        return getattr(self, name)  # type: ignore[no-any-return]

    def active_roles(self) -> tuple[str, ...]:
        """The roles that call a model (the scripted player calls none)."""
        return tuple(r for r in ROLES if not (r == "player" and self.player_mode == "scripted"))

    def mock_roles(self) -> list[str]:
        """Roles answered by the mock server: a run with any of them is not a benchmark result."""
        return [r for r in self.active_roles() if self.role(r).is_mock]

    def public(self) -> dict[str, Any]:
        """For records and run.json: the config plus the mock tag (`mock_roles`), no secrets."""
        data = self.model_dump(mode="json")
        data.update({r: self.role(r).public() for r in ROLES})  # each role's URL without credentials
        data["mock_roles"] = self.mock_roles()
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

def _option_name(field: str) -> str:
    return field.removesuffix("_s")  # timeout_s -> timeout: the unit is in the help, not the flag


def role_options() -> dict[str, tuple[str, type]]:
    """Every per-role option, generated from RoleConfig's fields: `{"max-tokens": ("max_tokens", int), ...}`.
    The CLI flags (`--ROLE-OPTION`) and the variables (`NCPBENCH_ROLE_OPTION`) both come from here, so a
    new RoleConfig field is reachable everywhere with one edit."""
    out: dict[str, tuple[str, type]] = {}
    for field, info in RoleConfig.model_fields.items():
        if field == "model":
            continue
        kinds = [a for a in (typing.get_args(info.annotation) or (info.annotation,)) if a is not type(None)]
        kind = kinds[0] if kinds and kinds[0] in (int, float, str) else str
        out[_option_name(field).replace("_", "-")] = (field, kind)
    return out


_ENV_FIELDS = {"MODEL": "model", **{flag.replace("-", "_").upper(): field for flag, (field, _) in role_options().items()}}
_ROLE_KEYS = tuple(RoleConfig.model_fields)
_TOP_KEYS = tuple(k for k in RunConfig.model_fields if k not in ROLES)
MAX_CONFIG_BYTES = 1_000_000
"""A run config is a few lines; anything this big is the wrong file."""


def load_config_file(path: str | Path) -> dict[str, Any]:
    """A YAML or JSON mapping; every problem is a ConfigError naming the file."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist", "check the path given to --config")
    if p.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {p} is over {MAX_CONFIG_BYTES} bytes", "a run config is a few lines of YAML")
    try:
        text = p.read_text(encoding="utf-8")
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except UnicodeDecodeError:
        raise ConfigError(f"config file {p} is not UTF-8 text", "save it as UTF-8") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"config file {p} is not valid JSON (line {e.lineno}: {e.msg})", "fix the JSON") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(e, "problem", None) or type(e).__name__
        raise ConfigError(f"config file {p} is not valid YAML{where}: {problem}", "fix the YAML syntax") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} is a {type(data).__name__}, not a mapping",
                          "write `narrator: {model: ...}`, `auditor: ...`, `player_mode: ...`")
    return data


def _check_keys(data: Mapping[str, Any], source: str) -> None:
    for key, value in data.items():
        if key in ROLES:
            if value is None:
                continue
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: {key} is not a mapping", f"write `{key}: {{model: provider/model}}`")
            for sub in value:
                if sub not in _ROLE_KEYS:
                    raise ConfigError(f"{source}: unknown key {key}.{sub}{did_you_mean(str(sub), _ROLE_KEYS)}",
                                      f"known keys: {', '.join(_ROLE_KEYS)}")
        elif key not in _TOP_KEYS:
            raise ConfigError(f"{source}: unknown key {key}{did_you_mean(str(key), ROLES + _TOP_KEYS)}",
                              f"known keys: {', '.join(ROLES + _TOP_KEYS)}")


def _field_error(e: ValidationError, where: str) -> ConfigError:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"])
    return ConfigError(f"{where}{loc}: {err['msg']} (got {err.get('input')!r})",
                       "fix the value (flags beat NCPBENCH_* variables, which beat --config)")


def check_model_string(model: str, what: str) -> None:
    """`provider/model` with a known provider, or a role of your own (`module:attr`, `file.py:attr`)
    that imports; raises ConfigError with a did-you-mean otherwise."""
    if is_plugin_ref(model):
        from ncpbench.plugins import PluginError, load_object

        try:
            load_object(model)
        except PluginError as e:
            raise ConfigError(f"{what} {e}", "give module:attr or path/to/file.py:attr of an importable object") from None
        except Exception as e:  # the user's module raised while importing
            raise ConfigError(f"{what} {model}: importing it raised {type(e).__name__}: {e}",
                              "fix the module so it imports") from None
        return
    if "/" not in model:
        raise ConfigError(f"{what} {model!r} has no provider", f"write provider/model, e.g. openai/{model}")
    provider, name = model.split("/", 1)
    if provider not in PROVIDERS:
        raise ConfigError(f"{what} {model!r}: unknown provider {provider!r}{did_you_mean(provider, PROVIDERS)}",
                          f"use one of {', '.join(p + '/' for p in PROVIDERS)}")
    if not name.strip():
        raise ConfigError(f"{what} {model!r} has no model name", f"write {provider}/MODEL")


def resolve_run_config(
    flags: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    config_file: str | Path | None = None,
    profile: str | None = None,
    extra: Mapping[str, Any] | None = None,
    require: tuple[str, ...] | None = None,
    mock_default: bool = True,
) -> RunConfig:
    """Merge profile < config file < environment < flags into one RunConfig.

    With no profile, the protocol picks it: the published protocol samples every role as published
    (`paper`: 0.6 / top-p 0.95 / 8092 tokens), other protocols use `default`.

    Every problem is a ConfigError naming where the bad value came from. `require` lists roles that
    must be given a model by a flag, a variable or the file; with `mock_default=False` a required
    role nobody named is an error instead of silently becoming mock/default.
    """
    env = os.environ if environ is None else environ
    file_data = load_config_file(config_file) if config_file else {}
    if profile is None:
        protocol = (extra or {}).get("protocol") or file_data.get("protocol") or "published"
        profile = file_data.get("profile") or ("paper" if protocol == "published" else "default")
    if profile not in PROFILES:
        raise ConfigError(f"unknown profile {profile!r}{did_you_mean(str(profile), tuple(PROFILES))}",
                          f"use one of {', '.join(sorted(PROFILES))}")
    if config_file:
        _check_keys(file_data, str(config_file))
    roles: dict[str, dict[str, Any]] = {}
    named: set[str] = set()
    for role in ROLES:
        merged: dict[str, Any] = dict(PROFILES[profile].get(role, {}))
        merged.update(file_data.get(role) or {})
        if (file_data.get(role) or {}).get("model"):
            named.add(role)
        for suffix, field in _ENV_FIELDS.items():
            var = f"NCPBENCH_{role.upper()}_{suffix}"
            value = env.get(var)
            if value in (None, ""):
                continue
            try:  # each variable is checked alone, so the message names it
                RoleConfig.model_validate({field: value})
            except ValidationError as e:
                err = e.errors()[0]
                raise ConfigError(f"{var}={value!r}: {err['msg']}",
                                  f"fix or unset {var}") from None
            merged[field] = value
            if field == "model":
                named.add(role)
        given = {k: v for k, v in (flags or {}).get(role, {}).items() if v is not None}
        if given.get("model"):
            named.add(role)
        merged.update(given)
        roles[role] = merged
    top = {k: v for k, v in file_data.items() if k not in ROLES and k != "profile"}
    top.update({k: v for k, v in (extra or {}).items() if v is not None})
    built: dict[str, RoleConfig] = {}
    for r in ROLES:
        try:
            built[r] = RoleConfig(**roles[r])
        except ValidationError as e:
            raise _field_error(e, f"{r}.") from None
    try:
        config = RunConfig(**built, profile=profile, **top)
    except ValidationError as e:
        raise _field_error(e, "") from None
    for r in config.active_roles():
        check_model_string(config.role(r).model, f"--{r}")
    if config.protocol not in PROTOCOLS:
        raise ConfigError(f"unknown protocol {config.protocol!r}{did_you_mean(config.protocol, PROTOCOLS)}",
                          f"use one of {', '.join(PROTOCOLS)}")
    missing = [r for r in (require or ()) if r in config.active_roles() and r not in named]
    if missing and not mock_default:
        flags_hint = " ".join(f"--{r} provider/model" for r in missing)
        extra_hint = " (or --player-mode scripted)" if "player" in missing else ""
        raise ConfigError(f"no model given for the {', '.join(missing)}",
                          f"pass {flags_hint}{extra_hint}, or --mock for a dry run against the mock server")
    return config
