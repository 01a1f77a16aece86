"""Field access and time parsing shared by the per-type EventBridge parsers.

Every parser reads untrusted JSON; these helpers turn a missing or mistyped field into a
``MalformedEvent`` that names the event type and the field path, which is what an operator
needs to see in a log line when a queue starts carrying something unexpected.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

from spotwright.events.model import EventKind, InterruptionEvent, MalformedEvent, event_id

__all__ = [
    "Envelope",
    "detail_where",
    "field_str",
    "instance_id_field",
    "is_instance_id",
    "optional_str",
    "parse_time",
]


@dataclass(frozen=True, slots=True)
class Envelope:
    """The common EventBridge fields, already checked; ``detail`` is still raw."""

    id: str
    detail_type: str
    source: str
    time: float
    region: str
    resources: tuple[str, ...]
    detail: Mapping[str, Any]
    origin: str  # 'sqs', 'imds' or 'lambda': how the message reached us

    def event(
        self,
        kind: EventKind,
        instance_id: str,
        *,
        deadline: float | None,
        detail: str,
        id: str | None = None,
        action: str | None = None,
        state: str | None = None,
    ) -> InterruptionEvent:
        """A normalized event stamped with this envelope's time, origin, id and region."""
        return InterruptionEvent(
            id=id or event_id(kind, self.id, instance_id),
            kind=kind,
            instance_id=instance_id,
            start=self.time,
            deadline=deadline,
            source=self.origin,
            detail=detail,
            raw_id=self.id,
            action=action,
            state=state,
            region=self.region or None,
        )


def field_str(obj: Mapping[str, Any], key: str, *, where: str) -> str:
    """A required non-empty string field."""
    value = obj.get(key)
    if not isinstance(value, str) or not value.strip():
        got = "missing" if value is None else f"{type(value).__name__} {value!r}"
        raise MalformedEvent(f"{where}: field {key!r} must be a non-empty string ({got})")
    return value.strip()


def optional_str(obj: Mapping[str, Any], key: str, *, where: str) -> str | None:
    value = obj.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise MalformedEvent(
            f"{where}: field {key!r} must be a string, got {type(value).__name__} {value!r}"
        )
    return value.strip()


def parse_time(text: str, *, where: str) -> float:
    """Epoch seconds from ISO-8601 (EventBridge) or RFC 1123 (AWS Health ``startTime``).

    A time without a zone is taken as UTC, which is what AWS always means.
    """
    value = text.strip()
    parsed: datetime | None = None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        try:
            parsed = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            parsed = None
    if parsed is None:
        raise MalformedEvent(f"{where}: {text!r} is not an ISO-8601 or RFC 1123 time")
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


_HEX = frozenset("0123456789abcdef")


def is_instance_id(value: str) -> bool:
    """EC2 instance ids: ``i-`` and 8 (old style) to 17 lowercase hex digits."""
    digits = value[2:]
    return value.startswith("i-") and 8 <= len(digits) <= 17 and set(digits) <= _HEX


def instance_id_field(obj: Mapping[str, Any], key: str, *, where: str) -> str:
    value = field_str(obj, key, where=where)
    if not is_instance_id(value):
        raise MalformedEvent(f"{where}: field {key!r} is not an EC2 instance id ({value!r})")
    return value


def detail_where(env: Envelope) -> str:
    """How messages name an event's detail: its type and id."""
    return f"{env.detail_type} {env.id} detail"
