"""Checks that run before any run folder or record exists, so a misconfiguration costs seconds.

Three layers, each raising `PreflightError` (a `ConfigError`: `what` is wrong, `fix` says how):

1. numbers and paths: `check_number` / `check_out` range-check every numeric option and the output
   path before any work (a turn limit of 0 must not quietly become 100);
2. roles: `check_roles` resolves each active role's provider, model name and API-key variable
   (an unknown provider gets a did-you-mean, a missing key names the variable and the flag);
3. endpoints: `probe_endpoints` sends one cheap request per distinct endpoint (GET /models, and a
   one-token completion when the model is not listed or /models is missing), so a 401, an unknown
   model, a refused connection or a wrong URL fails at once with the URL (credentials redacted),
   the status and the flag that fixes it. Transient trouble (429, 5xx, a timeout) is only a warning:
   the run's own retries deal with it.

`preflight(config)` runs layers 2 and 3; the CLI runs all three. The exit codes of the command line
live here too, so the Python API and the CLI agree on what each failure is.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ncpbench.models.config import ConfigError, RoleConfig, RunConfig, check_model_string
from ncpbench.models.redaction import redact_url, remember_url_credentials
from ncpbench.models.transport import sdk_client

# -- exit codes (README "Exit codes", docs/RUN_FORMAT.md) --------------------------------------------

EXIT_OK = 0
"""Every planned episode finished with a verdict (CONFLICT, SUCCESS or SURVIVAL)."""
EXIT_FINDINGS = 1
"""`validate` / `build`: the spec has errors (findings printed); also an unexpected internal error."""
EXIT_USAGE = 2
"""Bad usage: an option, the config file, a variable, a role or an endpoint is wrong. Nothing was run."""
EXIT_REFUSED = 3
"""The run folder was refused: in use by another runner, or it holds a different run."""
EXIT_ERRORS = 4
"""The run finished, but some episodes are ERROR records (infrastructure failures; not scored)."""
EXIT_BUDGET = 5
"""Stopped by --max-total-tokens / --max-cost; rerun without the budget to finish."""
EXIT_BREAKER = 6
"""Stopped by the circuit breaker: the same infrastructure error kept repeating."""
EXIT_IO = 7
"""The disk is full or a file cannot be written; the folder is left resumable."""
EXIT_SIGINT = 130
"""Stopped by Ctrl-C (SIGINT); rerun the same command to resume."""
EXIT_SIGTERM = 143
"""Stopped by SIGTERM; rerun the same command to resume."""


class PreflightError(ConfigError):
    """A check before the run failed; `code` is the exit code the CLI uses."""

    def __init__(self, what: str, fix: str, code: int = EXIT_USAGE) -> None:
        super().__init__(what, fix)
        self.code = code


# -- layer 1: numbers and paths ----------------------------------------------------------------------


def check_number(flag: str, value: float | int | None, *, ge: float | None = None, gt: float | None = None,
                 le: float | None = None, fix: str | None = None) -> None:
    """Refuse a value outside its range (None means "not given" and passes)."""
    if value is None:
        return
    bad = isinstance(value, float) and not math.isfinite(value)
    bad = bad or (ge is not None and value < ge) or (gt is not None and value <= gt) or (le is not None and value > le)
    if not bad:
        return
    if gt is not None and le is not None:
        want = f"above {gt:g} and at most {le:g}"
    elif ge is not None and le is not None:
        want = f"from {ge:g} to {le:g}"
    elif gt is not None:
        want = f"above {gt:g}"
    elif ge is not None:
        want = f"at least {ge:g}"
    else:
        want = f"at most {le:g}"
    raise PreflightError(f"{flag} {value:g} is out of range", fix or f"give {flag} a value {want}")


ROLE_RANGES: dict[str, dict[str, float]] = {
    "temperature": {"ge": 0.0, "le": 2.0},
    "top-p": {"gt": 0.0, "le": 1.0},
    "max-tokens": {"ge": 1},
    "timeout": {"gt": 0.0},
    "concurrency": {"ge": 1},
}
"""Per-role flags and their ranges (the same bounds RoleConfig enforces for files and variables)."""


def check_out(path: str | Path, kind: Literal["file", "folder"], flag: str = "--out") -> Path:
    """The output path can be written: nothing on the way is a file; a record file is not a folder."""
    p = Path(path)
    for parent in p.parents:
        if parent.exists() and not parent.is_dir():
            raise PreflightError(f"{flag} {p}: {parent} is a file, not a folder", f"choose a {flag} outside {parent}")
        if parent.is_dir():
            if not os.access(parent, os.W_OK | os.X_OK):
                raise PreflightError(f"{flag} {p}: {parent} is not writable", f"choose a {flag} you can write to")
            break
    if kind == "file" and p.is_dir():
        raise PreflightError(f"{flag} {p} is a folder", f"for one episode {flag} names the record file, e.g. {p}/record.json")
    if kind == "folder" and p.exists() and not p.is_dir():
        raise PreflightError(f"{flag} {p} is a file", "a batch writes a run folder: choose a folder path, e.g. runs/NAME")
    return p


# -- layer 2: roles ----------------------------------------------------------------------------------

FlagName = Callable[[str, str], str]
"""(role, option) -> the CLI flag that sets it, so messages name the real flag."""


def role_flag(role: str, option: str = "") -> str:
    """`ncpbench run`'s flags: --narrator, --narrator-base-url, ..."""
    return f"--{role}-{option}" if option else f"--{role}"


def key_variable(role: RoleConfig) -> str:
    return role.api_key_env or "OPENAI_API_KEY"


def check_roles(config: RunConfig, environ: dict[str, str] | None = None, flags: FlagName = role_flag) -> None:
    """Each active role: a known provider, a model name, and a key where the endpoint needs one."""
    env = os.environ if environ is None else environ
    for name in config.active_roles():
        role = config.role(name)
        check_model_string(role.model, flags(name, ""))
        if role.provider == "local":
            _check_local(role, flags(name, ""))
        if role.provider != "openai":
            continue
        var = key_variable(role)
        if env.get(var):
            continue
        # A self-hosted endpoint (vLLM, Ollama, llama.cpp) rarely checks keys, so an unset default
        # variable is fine there; a variable the user named, or the hosted API, needs the key.
        if role.api_key_env or not role.base_url:
            raise PreflightError(f"{flags(name, '')} {role.model}: the API key variable {var} is not set",
                                 f"export {var}=..., or name the variable that holds the key with "
                                 f"{flags(name, 'api-key-env')} VAR")


def _check_local(role: RoleConfig, flag: str) -> None:
    from ncpbench.models import local

    known = getattr(local, "MODELS", None)
    if isinstance(known, dict) and role.model_name not in known:
        from ncpbench.models.config import did_you_mean

        raise PreflightError(f"{flag} {role.model}: unknown local model"
                             f"{did_you_mean(role.model_name, tuple(known))}",
                             f"use one of {', '.join('local/' + k for k in known)}")
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        raise PreflightError(f"{flag} {role.model} needs the local extra",
                             "pip install 'ncpbench[local]' (or `make demo`, which installs it)") from None


# -- layer 3: endpoints ------------------------------------------------------------------------------

@dataclass
class Endpoint:
    """One distinct endpoint (URL and key variable) and the roles that use it."""

    url: str
    key_var: str | None
    roles: list[tuple[str, RoleConfig]]


def endpoints(config: RunConfig) -> list[Endpoint]:
    """Distinct remote endpoints of the active roles; the in-process mock and local model are skipped."""
    found: dict[tuple[str, str | None], Endpoint] = {}
    for name in config.active_roles():
        role = config.role(name)
        if role.provider in ("local", "python") or (role.provider == "mock" and not role.base_url):
            continue
        url = (role.base_url or os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1")).rstrip("/")
        remember_url_credentials(url)  # known to redact() before the first probe can echo them
        key_var = key_variable(role) if role.provider == "openai" else None
        ident = (url, key_var)
        found.setdefault(ident, Endpoint(url, key_var, [])).roles.append((name, role))
    return list(found.values())


Warn = Callable[[str], None]


def _stderr(message: str) -> None:
    print(f"ncpbench: warning: {message}", file=sys.stderr)


def probe_endpoints(config: RunConfig, *, timeout_s: float = 10.0, warn: Warn = _stderr,
                    flags: FlagName = role_flag) -> None:
    """One cheap request per endpoint (and per model it must serve); PreflightError on a sure misconfiguration."""

    for ep in endpoints(config):
        key = os.environ.get(ep.key_var or "", "") or "not-needed"
        first_role = ep.roles[0][0]
        shown = redact_url(ep.url)
        client = sdk_client(ep.url, sync=True, api_key=key, max_retries=0, timeout=timeout_s)
        try:
            listed = _list_models(client, ep, shown, first_role, flags, warn)
            checked: set[str] = set()
            for name, role in ep.roles:
                if (listed is not None and role.model_name in listed) or role.model_name in checked:
                    continue
                checked.add(role.model_name)
                _complete_one_token(client, role, name, shown, listed, flags, warn)
        finally:
            client.close()


def _fix_for(status: int | None, role: str, flags: FlagName, key_var: str | None) -> str:
    base = flags(role, "base-url")
    if status in (401, 403):
        var = key_var or "OPENAI_API_KEY"
        return (f"the key was refused: check the value of {var}, or name the right variable with "
                f"{flags(role, 'api-key-env')} VAR")
    if status == 404:
        return f"check {base} (OpenAI-compatible servers usually end in /v1) and the model name in {flags(role, '')}"
    return f"check that the server is running and that {base} points at it (or pass --skip-preflight)"


def _list_models(client: object, ep: Endpoint, shown: str, role: str, flags: FlagName,
                 warn: Warn) -> set[str] | None:
    """The model ids the endpoint lists, or None when it has no usable /models."""
    import openai

    assert isinstance(client, openai.OpenAI)
    try:
        page = client.models.list()
        return {m.id for m in page.data}
    except openai.AuthenticationError as e:
        raise PreflightError(f"{shown}/models answered HTTP {e.status_code} (not authorised)",
                             _fix_for(e.status_code, role, flags, ep.key_var)) from None
    except openai.PermissionDeniedError as e:
        raise PreflightError(f"{shown}/models answered HTTP {e.status_code} (forbidden)",
                             _fix_for(e.status_code, role, flags, ep.key_var)) from None
    except openai.APIConnectionError as e:
        if isinstance(e, openai.APITimeoutError):
            warn(f"{shown}/models did not answer in time; the run will retry")
            return None
        if _dropped(e):
            warn(f"{shown}/models dropped the connection ({_cause(e)}); the run will retry")
            return None
        raise PreflightError(f"cannot connect to {shown} ({_cause(e)})",
                             _fix_for(None, role, flags, ep.key_var)) from None
    except openai.APIStatusError:
        return None  # no /models route (or a transient fault): the one-token completion decides
    except (ValueError, AttributeError, TypeError):
        return None  # an answer that is not a model list: some servers have none


def _dropped(e: BaseException) -> bool:
    """A connection that was made and then dropped mid-answer (a reset, a torn response): the server is
    there and the run's retries handle it. Only a connection that could not be made is fatal."""
    inner = e.__cause__ or e.__context__
    return inner is not None and type(inner).__name__ in ("ReadError", "RemoteProtocolError", "WriteError")


def _cause(e: BaseException) -> str:
    inner = e.__cause__ or e.__context__
    text = type(inner).__name__ if inner is not None else type(e).__name__
    if inner is not None and "refused" in str(inner).lower():
        text = "connection refused"
    return text


def _complete_one_token(client: object, role: RoleConfig, name: str, shown: str, listed: set[str] | None,
                        flags: FlagName, warn: Warn) -> None:
    import openai

    assert isinstance(client, openai.OpenAI)
    key_var = key_variable(role) if role.provider == "openai" else None
    try:
        client.chat.completions.create(model=role.model_name, max_tokens=1,
                                       messages=[{"role": "user", "content": "Say OK."}])
    except openai.NotFoundError as e:
        served = f"; it lists {', '.join(sorted(listed)[:8])}" if listed else ""
        raise PreflightError(f"{shown}/chat/completions answered HTTP {e.status_code} for model "
                             f"{role.model_name!r}{served}", _fix_for(404, name, flags, key_var)) from None
    except (openai.AuthenticationError, openai.PermissionDeniedError) as e:
        raise PreflightError(f"{shown}/chat/completions answered HTTP {e.status_code} (not authorised)",
                             _fix_for(e.status_code, name, flags, key_var)) from None
    except openai.BadRequestError as e:
        # Some servers refuse max_tokens=1 or the model's name in a 400; the name is the usual cause.
        warn(f"{shown} answered HTTP {e.status_code} to a one-token probe of {role.model_name!r}; "
             "continuing (the run will show whether the model works)")
    except openai.APITimeoutError:
        warn(f"{shown} did not answer a one-token probe in time; the run will retry")
    except openai.APIConnectionError as e:
        if _dropped(e):
            warn(f"{shown} dropped the connection during a one-token probe ({_cause(e)}); the run will retry")
            return
        raise PreflightError(f"cannot connect to {shown} ({_cause(e)})", _fix_for(None, name, flags, key_var)) from None
    except openai.APIStatusError as e:
        warn(f"{shown} answered HTTP {e.status_code} to a probe; continuing (the run retries transient errors)")
    except (ValueError, AttributeError, TypeError):
        warn(f"{shown} answered a probe with something that is not a chat completion; continuing")


def preflight(config: RunConfig, *, probe: bool = True, timeout_s: float = 10.0, warn: Warn = _stderr) -> None:
    """Check the roles (and probe their endpoints); raise PreflightError on the first problem."""
    check_roles(config)
    if probe:
        probe_endpoints(config, timeout_s=timeout_s, warn=warn)


def single_role_flag(role: str, option: str = "") -> str:
    """Commands with one model (`ncpbench build`): --model, --base-url, --api-key-env."""
    return f"--{option}" if option else "--model"
