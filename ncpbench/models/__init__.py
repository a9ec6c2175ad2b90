"""The model layer: role configuration, the OpenAI-compatible client, the response cache, the
loopback mock server and the embedded local model. Everything that talks to a model endpoint."""

from ncpbench.errors import InvalidOutputError, ModelCallError
from ncpbench.models.client import ModelClient
from ncpbench.models.config import PROFILES, RoleConfig, RunConfig, resolve_run_config

__all__ = ["PROFILES", "InvalidOutputError", "ModelCallError", "ModelClient", "RoleConfig", "RunConfig",
           "resolve_run_config"]
