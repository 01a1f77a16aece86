"""``autoscaling/target-lifecycle-state``: the state the Auto Scaling group is moving to.

A plain-text body. ``Terminated`` means the group is terminating this instance: the node is
drained like for a terminate lifecycle hook, but there is no hook to complete from here
(the hook's token only travels through the queue). Every other state the group reports
(``InService``, the warm-pool ``Warmed:*`` states, ...) needs nothing.

The body has no time and no id, and the instance reaches ``Terminated`` once in its life,
so the id is derived from the instance and the state alone (the Node Termination Handler
hashes the current time instead, which makes a new event on every poll).
"""

from __future__ import annotations

from spotwright.events._imds_common import Reading, shorten
from spotwright.events.model import EventKind, InterruptionEvent, UnknownEvent, event_id

__all__ = ["PATH", "TERMINATED", "parse"]

PATH = "autoscaling/target-lifecycle-state"
TERMINATED = "Terminated"
_NOTHING_TO_DO = frozenset({"InService", "Pending", "Standby", "Detached"})


def parse(reading: Reading) -> list[InterruptionEvent]:
    state = reading.text.strip()
    if not state or state in _NOTHING_TO_DO or state.startswith("Warmed:"):
        return []
    if state != TERMINATED:
        raise UnknownEvent(f"{reading.where}: unrecognised target state {shorten(state)}")
    kind = EventKind.ASG_LIFECYCLE_TERMINATE
    raw_id = f"{PATH}:{TERMINATED}"
    return [
        InterruptionEvent(
            id=event_id(kind, raw_id, reading.instance_id),
            kind=kind,
            instance_id=reading.instance_id,
            start=reading.now,
            deadline=None,
            source="imds",
            detail=f"Auto Scaling group is terminating {reading.instance_id} "
            "(target lifecycle state Terminated)",
            raw_id=raw_id,
            action=TERMINATED,
            node=reading.node,
        )
    ]
