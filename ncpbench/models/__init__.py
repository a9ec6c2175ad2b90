"""The model layer: role configuration, the OpenAI-compatible client, the response cache, the
call log, the loopback mock server and the embedded local model. Everything that talks to a
model endpoint.

`call_context(episode=..., turn=..., role=..., stage=...)` labels the model calls made inside it
(calls.jsonl and the structlog events of those calls carry the labels).
"""

from typing import TYPE_CHECKING, Any

from ncpbench.errors import InvalidOutputError, MalformedResponse, ModelCallError
from ncpbench.models.calllog import CallEntry, CallLog, call_context, current_context, read_calls
from ncpbench.models.config import PROFILES, RoleConfig, RunConfig, resolve_run_config
from ncpbench.models.redaction import redact, redact_url

if TYPE_CHECKING:
    from ncpbench.models.client import ModelClient


def __getattr__(name: str) -> Any:
    # The client pulls in the openai SDK (~2 s to import): configuration and scripted runs must not pay for it.
    if name == "ModelClient":
        from ncpbench.models.client import ModelClient

        return ModelClient
    raise AttributeError(f"module 'ncpbench.models' has no attribute {name!r}")

__all__ = ["PROFILES", "CallEntry", "CallLog", "InvalidOutputError", "MalformedResponse", "ModelCallError",
           "ModelClient", "RoleConfig", "RunConfig", "call_context", "current_context", "read_calls", "redact",
           "redact_url", "resolve_run_config"]
