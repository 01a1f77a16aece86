"""``spot/instance-action`` (and the legacy ``spot/termination-time``): the spot notice.

``instance-action`` holds ``{"action": "terminate|stop|hibernate", "time": "<ISO>"}``, where
``time`` is when EC2 will act, two minutes after it issued the notice; that time is the
drain deadline. The notice time (``time`` minus the two minutes) is what the EventBridge
warning carries as its ``time``, so the event id is derived from it: the same notice read
here and received through the queue is one event. ``termination-time`` is the older path
with the bare timestamp as plain text; it only ever means terminate.
"""

from __future__ import annotations

from collections.abc import Mapping

from spotwright.events._common import field_str, parse_time
from spotwright.events._imds_common import Reading, iso, load_json, shorten
from spotwright.events.model import (
    EventKind,
    InterruptionEvent,
    MalformedEvent,
    notice_event_id,
)

__all__ = ["INSTANCE_ACTION", "NOTICE_SECONDS", "TERMINATION_TIME", "parse", "parse_legacy"]

INSTANCE_ACTION = "spot/instance-action"
TERMINATION_TIME = "spot/termination-time"
#: EC2 acts this long after it issues the notice.
NOTICE_SECONDS = 120.0
_ACTIONS = ("terminate", "stop", "hibernate")


def parse(reading: Reading) -> list[InterruptionEvent]:
    body = load_json(reading)
    if not isinstance(body, Mapping):
        raise MalformedEvent(
            f"{reading.where}: body must be a JSON object, not {type(body).__name__}"
        )
    action = field_str(body, "action", where=reading.where)
    if action not in _ACTIONS:
        raise MalformedEvent(
            f"{reading.where}: field 'action' is {shorten(action)}, "
            f"not one of {', '.join(_ACTIONS)}"
        )
    when = parse_time(
        field_str(body, "time", where=reading.where), where=f"{reading.where}: field 'time'"
    )
    return [_event(reading, action, when)]


def parse_legacy(reading: Reading) -> list[InterruptionEvent]:
    text = reading.text.strip()
    if not text:
        raise MalformedEvent(f"{reading.where}: empty body")
    when = parse_time(text, where=f"{reading.where}: body")
    return [_event(reading, "terminate", when)]


def _event(reading: Reading, action: str, when: float) -> InterruptionEvent:
    notice = when - NOTICE_SECONDS
    kind = EventKind.SPOT_INTERRUPTION
    stamp = iso(when)
    return InterruptionEvent(
        id=notice_event_id(kind, reading.instance_id, notice),
        kind=kind,
        instance_id=reading.instance_id,
        start=notice,
        deadline=when,
        source="imds",
        detail=f"spot interruption notice: EC2 will {action} {reading.instance_id} at {stamp}",
        raw_id=f"{reading.path}@{stamp}",
        action=action,
        node=reading.node,
    )
