"""EC2 Spot Instance Interruption Warning: the two-minute notice.

The warning is the one signal with a hard deadline: EC2 acts 120 s after the event's
``time``. With hibernation there is no grace at all (hibernation "begins immediately"), so
the deadline is the notice itself.
"""

from __future__ import annotations

from spotwright.events._common import Envelope, detail_where, instance_id_field, optional_str
from spotwright.events.model import (
    EventKind,
    InterruptionEvent,
    MalformedEvent,
    notice_event_id,
)

__all__ = ["DETAIL_TYPE", "NOTICE_SECONDS", "SOURCE", "parse"]

SOURCE = "aws.ec2"
DETAIL_TYPE = "EC2 Spot Instance Interruption Warning"
NOTICE_SECONDS = 120.0
_ACTIONS = ("terminate", "stop", "hibernate")


def parse(env: Envelope) -> list[InterruptionEvent]:
    where = detail_where(env)
    instance_id = instance_id_field(env.detail, "instance-id", where=where)
    action = optional_str(env.detail, "instance-action", where=where) or "terminate"
    if action not in _ACTIONS:
        raise MalformedEvent(
            f"{where}: instance-action {action!r} is not one of {', '.join(_ACTIONS)}"
        )
    deadline = env.time if action == "hibernate" else env.time + NOTICE_SECONDS
    kind = EventKind.SPOT_INTERRUPTION
    return [
        env.event(
            kind,
            instance_id,
            id=notice_event_id(kind, instance_id, env.time),
            deadline=deadline,
            detail=f"spot interruption warning: EC2 will {action} {instance_id} "
            f"in {deadline - env.time:.0f} s",
            action=action,
        )
    ]
