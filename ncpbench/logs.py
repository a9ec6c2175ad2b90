"""structlog configuration, done once at the entry points (the CLI). Library code only logs."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

import structlog


def configure(level: str = "WARNING", json: bool = False) -> None:
    lvl = getattr(logging, level.upper(), logging.WARNING)
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        # One printer for every logger: PrintLoggerFactory builds a new one (and looks up its file
        # lock) on every log call, which the model client's per-call debug event paid 6,000x a batch.
        logger_factory=_shared(structlog.PrintLogger(file=sys.stderr)),
        cache_logger_on_first_use=False,
    )


def _shared(printer: structlog.PrintLogger) -> Callable[..., structlog.PrintLogger]:
    def factory(*_: object) -> structlog.PrintLogger:
        return printer

    return factory


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(name)  # type: ignore[no-any-return]


if not structlog.is_configured():
    # Used as a library, ncpbench is quiet (warnings and up, on stderr) until an entry point or
    # the host application configures structlog itself; structlog's own default prints debug.
    configure("WARNING")
