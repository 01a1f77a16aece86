"""What the per-path IMDS parsers share: the reading they are handed and JSON loading.

An IMDS body names no instance and no node (the handler reading it runs on the instance),
so the caller supplies both, with the time of the read; each parser then only has to turn
its path's body into events and say precisely which path and field is wrong when it cannot.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from spotwright.events.model import MalformedEvent

__all__ = ["Reading", "iso", "load_json", "shorten"]


@dataclass(frozen=True, slots=True)
class Reading:
    """One body read from one metadata path, with what the reader knows about itself."""

    path: str  # relative to /latest/meta-data/, e.g. "spot/instance-action"
    text: str
    instance_id: str
    node: str | None
    now: float

    @property
    def where(self) -> str:
        return f"IMDS {self.path}"


def load_json(reading: Reading) -> Any:
    """The body as JSON; an empty or non-JSON body is malformed."""
    if not reading.text.strip():
        raise MalformedEvent(f"{reading.where}: empty body")
    try:
        return json.loads(reading.text)
    except json.JSONDecodeError as exc:
        raise MalformedEvent(
            f"{reading.where}: body is not JSON ({exc.msg} at line {exc.lineno} "
            f"column {exc.colno}): {shorten(reading.text)}"
        ) from None


def shorten(text: str, limit: int = 60) -> str:
    """A body or value quoted for an error message, cut to a readable length."""
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= limit else flat[: limit - 1] + "…")


def iso(epoch: float) -> str:
    """Epoch seconds as the ISO-8601 UTC form AWS writes (whole seconds)."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
