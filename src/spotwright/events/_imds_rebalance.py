"""``events/recommendations/rebalance``: ``{"noticeTime": "<ISO>"}``, present once issued.

The recommendation sets no deadline. Its id is derived from the instance and the notice
time, which is also the ``time`` of the EventBridge recommendation, so reading it on every
poll, or receiving it through the queue as well, yields one event.
"""

from __future__ import annotations

from collections.abc import Mapping

from spotwright.events._common import field_str, parse_time
from spotwright.events._imds_common import Reading, iso, load_json
from spotwright.events.model import (
    EventKind,
    InterruptionEvent,
    MalformedEvent,
    notice_event_id,
)

__all__ = ["PATH", "parse"]

PATH = "events/recommendations/rebalance"


def parse(reading: Reading) -> list[InterruptionEvent]:
    body = load_json(reading)
    if not isinstance(body, Mapping):
        raise MalformedEvent(
            f"{reading.where}: body must be a JSON object, not {type(body).__name__}"
        )
    notice = parse_time(
        field_str(body, "noticeTime", where=reading.where),
        where=f"{reading.where}: field 'noticeTime'",
    )
    kind = EventKind.REBALANCE_RECOMMENDATION
    stamp = iso(notice)
    return [
        InterruptionEvent(
            id=notice_event_id(kind, reading.instance_id, notice),
            kind=kind,
            instance_id=reading.instance_id,
            start=notice,
            deadline=None,
            source="imds",
            detail=f"rebalance recommendation: {reading.instance_id} is at elevated risk "
            f"of interruption (noticed {stamp})",
            raw_id=f"{reading.path}@{stamp}",
            node=reading.node,
        )
    ]
