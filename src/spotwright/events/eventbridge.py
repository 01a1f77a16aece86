"""Queue mode: turn one SQS (or Lambda) message body into interruption events.

Dispatch is on the envelope's (source, detail-type), as Karpenter does, with one small
module per event type. Messages an Auto Scaling group sends straight to the queue (no
``detail-type``) and SNS-wrapped bodies are recognised too. A body that parses to an empty
list is understood and needs no action; ``UnknownEvent`` means it is not ours to
understand; ``MalformedEvent`` means a known type is broken. The caller decides what to do
with the message in each case (typically: delete, delete and count, keep for inspection).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from spotwright.events import (
    _capacity_reservation,
    _health,
    _lifecycle,
    _rebalance,
    _spot,
    _statechange,
)
from spotwright.events._common import Envelope, field_str, parse_time
from spotwright.events.model import InterruptionEvent, MalformedEvent, UnknownEvent

__all__ = ["SUPPORTED", "parse_eventbridge"]

_Parser = Callable[[Envelope], list[InterruptionEvent]]
_PARSERS: dict[tuple[str, str], _Parser] = {
    (_spot.SOURCE, _spot.DETAIL_TYPE): _spot.parse,
    (_rebalance.SOURCE, _rebalance.DETAIL_TYPE): _rebalance.parse,
    (_health.SOURCE, _health.DETAIL_TYPE): _health.parse,
    (_statechange.SOURCE, _statechange.DETAIL_TYPE): _statechange.parse,
    (_capacity_reservation.SOURCE, _capacity_reservation.DETAIL_TYPE): _capacity_reservation.parse,
    (_lifecycle.SOURCE, _lifecycle.TERMINATE_DETAIL_TYPE): _lifecycle.parse,
    (_lifecycle.SOURCE, _lifecycle.LAUNCH_DETAIL_TYPE): _lifecycle.parse,
}
#: The (source, detail-type) pairs understood; EventBridge rules should match exactly these.
SUPPORTED: tuple[tuple[str, str], ...] = tuple(sorted(_PARSERS))
_ORIGINS = ("sqs", "imds", "lambda")


def parse_eventbridge(
    body: str | bytes | Mapping[str, Any], *, source: str = "sqs"
) -> list[InterruptionEvent]:
    """Parse one message body; ``source`` records how it arrived (``sqs`` or ``lambda``).

    Raises ``UnknownEvent`` for a well-formed message of a type not handled, and
    ``MalformedEvent`` for bad JSON or a known type with missing or mistyped fields.
    """
    if source not in _ORIGINS:
        raise ValueError(f"source must be one of {', '.join(_ORIGINS)}, not {source!r}")
    message = _unwrap_sns(_load(body))
    if "detail-type" not in message:
        if _lifecycle.is_direct_message(message):
            return _lifecycle.parse_direct(message, source)
        keys = ", ".join(sorted(message)[:6]) or "none"
        raise UnknownEvent(
            f"message has no detail-type and is not an ASG notification (keys: {keys})"
        )
    envelope = _envelope(message, source)
    parser = _PARSERS.get((envelope.source, envelope.detail_type))
    if parser is None:
        raise UnknownEvent(
            f"unsupported event: source {envelope.source!r}, "
            f"detail-type {envelope.detail_type!r} (id {envelope.id})"
        )
    return parser(envelope)


def _load(body: str | bytes | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(body, Mapping):
        return body
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    if not text.strip():
        raise MalformedEvent("empty message body")
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MalformedEvent(f"message body is not JSON: {exc}") from None
    if not isinstance(loaded, dict):
        raise MalformedEvent(f"message body must be a JSON object, not {type(loaded).__name__}")
    return loaded


def _unwrap_sns(message: Mapping[str, Any]) -> Mapping[str, Any]:
    """SNS delivers ``{"Type": "Notification", "Message": "<the real body>"}``."""
    if message.get("Type") == "Notification" and isinstance(message.get("Message"), str):
        return _load(message["Message"])
    return message


def _envelope(message: Mapping[str, Any], origin: str) -> Envelope:
    detail_type = field_str(message, "detail-type", where="EventBridge event")
    where = f"{detail_type} event"
    event_id = field_str(message, "id", where=where)
    where = f"{detail_type} {event_id}"
    event_source = field_str(message, "source", where=where)
    version = message.get("version", "0")
    if version != "0":
        raise UnknownEvent(f"{where}: unsupported EventBridge envelope version {version!r}")
    time = parse_time(field_str(message, "time", where=where), where=f"{where} time")
    region = message.get("region")
    if region is not None and not isinstance(region, str):
        raise MalformedEvent(f"{where}: field 'region' must be a string")
    resources = message.get("resources", [])
    if isinstance(resources, str):
        resources = [resources]
    if not isinstance(resources, list) or not all(isinstance(r, str) for r in resources):
        raise MalformedEvent(f"{where}: field 'resources' must be a list of strings")
    detail = message.get("detail")
    if not isinstance(detail, Mapping):
        got = "missing" if detail is None else type(detail).__name__
        raise MalformedEvent(f"{where}: field 'detail' must be an object ({got})")
    return Envelope(
        id=event_id,
        detail_type=detail_type,
        source=event_source,
        time=time,
        region=region or "",
        resources=tuple(resources),
        detail=detail,
        origin=origin,
    )
