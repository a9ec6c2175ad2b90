"""The failures a run can meet, and which of them are infrastructure rather than verdicts.

Pure: no imports beyond the standard library, so the core, the episode driver and the model layer
can all name these without depending on each other. An infrastructure failure ends an episode as
ERROR (censored, excluded from scores); it is never scored against the narrator.
"""

from __future__ import annotations


class ModelCallError(RuntimeError):
    """The endpoint failed after the client's retries (HTTP error, timeout, connection)."""


class MalformedResponse(ModelCallError):
    """HTTP 200 with a body that is not a usable chat completion (no choices, no content, not JSON)."""


class InvalidOutputError(RuntimeError):
    """The model kept answering with output that does not validate (after the allowed re-asks)."""


class AuditError(RuntimeError):
    """The auditor returned a verdict that cannot apply to this state (e.g. an unknown fact id)."""


INFRASTRUCTURE_ERRORS: tuple[type[BaseException], ...] = (ModelCallError, InvalidOutputError, AuditError)
"""What the episode driver turns into an ERROR outcome rather than letting it escape."""
