"""EC2 Capacity Reservation Instance Interruption Warning.

Instances in an interruptible Capacity Reservation get the same two-minute treatment as
spot when the owner reclaims the capacity; the event states the termination time itself,
which is used when present.
"""

from __future__ import annotations

from spotwright.events._common import (
    Envelope,
    detail_where,
    instance_id_field,
    optional_str,
    parse_time,
)
from spotwright.events.model import EventKind, InterruptionEvent

__all__ = ["DETAIL_TYPE", "SOURCE", "parse"]

SOURCE = "aws.ec2"
DETAIL_TYPE = "EC2 Capacity Reservation Instance Interruption Warning"
_DEFAULT_NOTICE_SECONDS = 120.0


def parse(env: Envelope) -> list[InterruptionEvent]:
    where = detail_where(env)
    instance_id = instance_id_field(env.detail, "instance-id", where=where)
    action = optional_str(env.detail, "instance-action", where=where) or "terminate"
    when = optional_str(env.detail, "instance-termination-time", where=where)
    deadline = (
        parse_time(when, where=f"{where} instance-termination-time")
        if when
        else env.time + _DEFAULT_NOTICE_SECONDS
    )
    kind = EventKind.CAPACITY_RESERVATION_INTERRUPTION
    return [
        env.event(
            kind,
            instance_id,
            deadline=deadline,
            detail=f"capacity reservation interruption: EC2 will {action} {instance_id} "
            f"in {max(0.0, deadline - env.time):.0f} s",
            action=action,
        )
    ]
