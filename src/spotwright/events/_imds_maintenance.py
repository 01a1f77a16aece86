"""``events/maintenance/scheduled``: the instance's scheduled events, as a JSON list.

Each item has ``Code`` (``system-reboot``, ``instance-retirement``, ...), ``EventId``,
``State`` (``active``, ``canceled``, ``completed``), ``Description`` and the window
``NotBefore`` / ``NotAfter`` / ``NotBeforeDeadline`` written like ``21 Jan 2019 09:00:43
GMT``. An active item is a scheduled change whose deadline is ``NotBefore``; a canceled or
completed one says the node can go back into service, so it becomes an event of its own
kind (the action is uncordon) that shares the active one's ``raw_id``, the ``EventId``.

The list is re-read on every poll and carries no time of issue, so ``start`` is when it was
read; the id comes from the ``EventId`` only, which IMDS keeps for the life of the event.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spotwright.events._common import field_str, optional_str, parse_time
from spotwright.events._imds_common import Reading, iso, load_json, shorten
from spotwright.events.model import EventKind, InterruptionEvent, MalformedEvent, event_id

__all__ = ["PATH", "parse"]

PATH = "events/maintenance/scheduled"
_KINDS = {
    "active": EventKind.SCHEDULED_CHANGE,
    "canceled": EventKind.SCHEDULED_CHANGE_CANCELED,
    "completed": EventKind.SCHEDULED_CHANGE_COMPLETED,
}
_TIMES = ("NotBefore", "NotAfter", "NotBeforeDeadline")


def parse(reading: Reading) -> list[InterruptionEvent]:
    if not reading.text.strip():
        return []  # no scheduled events
    body = load_json(reading)
    if not isinstance(body, list):
        raise MalformedEvent(
            f"{reading.where}: body must be a JSON list, not {type(body).__name__}"
        )
    events: dict[str, InterruptionEvent] = {}
    for index, item in enumerate(body):
        where = f"{reading.where}[{index}]"
        if not isinstance(item, Mapping):
            raise MalformedEvent(f"{where}: must be an object, not {type(item).__name__}")
        event = _item(reading, item, where)
        # An event listed twice (same id and state) is one event, first one kept.
        events.setdefault(event.id, event)
    return list(events.values())


def _item(reading: Reading, item: Mapping[str, Any], where: str) -> InterruptionEvent:
    event_ref = field_str(item, "EventId", where=where)
    code = field_str(item, "Code", where=where)
    state = field_str(item, "State", where=where)
    kind = _KINDS.get(state)
    if kind is None:
        raise MalformedEvent(
            f"{where}: field 'State' is {shorten(state)}, not one of {', '.join(_KINDS)}"
        )
    times = {
        key: parse_time(text, where=f"{where}: field {key!r}")
        for key in _TIMES
        if (text := optional_str(item, key, where=where)) is not None
    }
    description = optional_str(item, "Description", where=where)
    if kind is EventKind.SCHEDULED_CHANGE:
        if "NotBefore" not in times:
            raise MalformedEvent(f"{where}: field 'NotBefore' is required for an active event")
        deadline: float | None = times["NotBefore"]
        text = f"scheduled {code} of {reading.instance_id} from {iso(times['NotBefore'])}"
    else:
        deadline = None
        text = f"scheduled {code} of {reading.instance_id} is {state}"
    if description:
        text += f": {description}"
    return InterruptionEvent(
        id=event_id(kind, event_ref, reading.instance_id),
        kind=kind,
        instance_id=reading.instance_id,
        start=reading.now,
        deadline=deadline,
        source="imds",
        detail=text,
        raw_id=event_ref,
        state=state,
        action=code,
        node=reading.node,
    )
