"""Structured logs in the style of Karpenter and the Node Termination Handler.

Every controller action is one structlog event with key/value fields. The timestamp comes
from the controllers' Clock, so a simulation's log reads in simulated time. Output is either
text (``2026-01-01T00:03:12.000Z INFO provisioner launched nodeclaim {"type": ...}``) or JSON
lines, on a stream or through a callback (the CLI routes it around its progress bar).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, MutableMapping
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

import structlog

__all__ = ["LogFormat", "configure_logging", "get_logger"]

LogFormat = Literal["text", "json"]

_LEVEL_NAMES = {"debug": "DEBUG", "info": "INFO", "warning": "WARN", "error": "ERROR"}
_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


def get_logger(name: str) -> Any:
    """A logger bound to a component name (``provisioner``, ``interruption``...)."""
    return structlog.get_logger(component=name)


def _timestamp(seconds: float) -> str:
    moment = datetime.fromtimestamp(seconds, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _text(event: MutableMapping[str, Any]) -> str:
    ts = event.pop("timestamp")
    level = _LEVEL_NAMES.get(event.pop("level"), "INFO")
    logger = event.pop("component", "spotwright")
    message = event.pop("event")
    fields = f" {json.dumps(event, default=str, separators=(', ', ': '))}" if event else ""
    return f"{ts} {level:<5} {logger} {message}{fields}"


def _json(event: MutableMapping[str, Any]) -> str:
    event["message"] = event.pop("event")
    event["level"] = _LEVEL_NAMES.get(event["level"], "INFO").lower()
    return json.dumps(event, default=str)


def configure_logging(
    *,
    fmt: LogFormat = "text",
    clock: Callable[[], float] | None = None,
    sink: Callable[[str], None] | None = None,
    stream: TextIO | None = None,
    level: str = "info",
) -> None:
    """Route structlog output; call once per process (or per simulation run).

    ``clock`` supplies the timestamp (seconds since the epoch): the simulation passes its
    virtual clock. ``sink`` receives each rendered line; without one, lines go to ``stream``
    (stderr by default).
    """
    now = clock or (lambda: datetime.now(tz=UTC).timestamp())
    out = stream or sys.stderr
    write: Callable[[str], None] = sink or (lambda line: print(line, file=out))
    render = _json if fmt == "json" else _text
    threshold = _LEVELS.get(level, 20)

    def stamp(_: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        event["timestamp"] = _timestamp(now())
        event["level"] = method if method in _LEVELS else "info"
        return event

    def emit(_: Any, __: str, event: MutableMapping[str, Any]) -> str:
        line = render(event)
        write(line)
        return line

    structlog.configure(
        processors=[stamp, emit],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=structlog.ReturnLoggerFactory(),
        cache_logger_on_first_use=False,
    )
    logging.getLogger("botocore").setLevel(logging.WARNING)
