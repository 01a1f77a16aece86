"""EC2 Instance State-change Notification.

Only the states on the way out matter (stopping, stopped, shutting-down, terminated): the
instance is already going, so the deadline is the event itself. ``pending`` and
``running`` are valid but give nothing to do, so they parse to no events and the message
can be deleted.
"""

from __future__ import annotations

from spotwright.events._common import Envelope, detail_where, field_str, instance_id_field
from spotwright.events.model import EventKind, InterruptionEvent, MalformedEvent

__all__ = ["ACTIONABLE_STATES", "DETAIL_TYPE", "SOURCE", "parse"]

SOURCE = "aws.ec2"
DETAIL_TYPE = "EC2 Instance State-change Notification"
ACTIONABLE_STATES = ("stopping", "stopped", "shutting-down", "terminated")
_IGNORED_STATES = ("pending", "running")


def parse(env: Envelope) -> list[InterruptionEvent]:
    where = detail_where(env)
    instance_id = instance_id_field(env.detail, "instance-id", where=where)
    state = field_str(env.detail, "state", where=where)
    if state in _IGNORED_STATES:
        return []
    if state not in ACTIONABLE_STATES:
        raise MalformedEvent(f"{where}: {state!r} is not an EC2 instance state")
    kind = EventKind.STATE_CHANGE
    return [
        env.event(
            kind,
            instance_id,
            deadline=env.time,
            detail=f"instance state change: {instance_id} is {state}",
            state=state,
        )
    ]
