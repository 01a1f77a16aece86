"""Auto Scaling lifecycle hooks: instance terminating or launching, and test messages.

Hooks reach the queue two ways: as EventBridge events (``aws.autoscaling``, detail-type
``EC2 Instance-terminate/launch Lifecycle Action``) or sent by the ASG straight to SQS (or
via SNS) as a flat object without ``detail-type``. Both become the same event, carrying the
hook name, group and token so the handler can complete the lifecycle action once the node
is drained (terminate) or ready (launch). The group's test message is recognised so that it
can be acknowledged and dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spotwright.events._common import (
    Envelope,
    detail_where,
    field_str,
    instance_id_field,
    optional_str,
    parse_time,
)
from spotwright.events.model import (
    EventKind,
    InterruptionEvent,
    LifecycleHook,
    MalformedEvent,
    UnknownEvent,
    event_id,
)

__all__ = [
    "LAUNCH_DETAIL_TYPE",
    "SOURCE",
    "TERMINATE_DETAIL_TYPE",
    "is_direct_message",
    "parse",
    "parse_direct",
]

SOURCE = "aws.autoscaling"
TERMINATE_DETAIL_TYPE = "EC2 Instance-terminate Lifecycle Action"
LAUNCH_DETAIL_TYPE = "EC2 Instance-launch Lifecycle Action"
TERMINATING = "autoscaling:EC2_INSTANCE_TERMINATING"
LAUNCHING = "autoscaling:EC2_INSTANCE_LAUNCHING"
TEST_NOTIFICATION = "autoscaling:TEST_NOTIFICATION"
_KINDS = {
    TERMINATING: EventKind.ASG_LIFECYCLE_TERMINATE,
    LAUNCHING: EventKind.ASG_LIFECYCLE_LAUNCH,
}
_TRANSITION_OF = {TERMINATE_DETAIL_TYPE: TERMINATING, LAUNCH_DETAIL_TYPE: LAUNCHING}


def parse(env: Envelope) -> list[InterruptionEvent]:
    """An EventBridge lifecycle action; the detail-type fixes the transition."""
    where = detail_where(env)
    expected = _TRANSITION_OF[env.detail_type]
    transition = optional_str(env.detail, "LifecycleTransition", where=where) or expected
    if transition != expected:
        raise MalformedEvent(
            f"{where}: LifecycleTransition {transition!r} contradicts the detail-type"
        )
    return [_hook_event(env.detail, transition, env.id, env.time, env.origin, env.region, where)]


def is_direct_message(obj: Mapping[str, Any]) -> bool:
    """Whether a message without ``detail-type`` looks like one an ASG sent directly."""
    event = obj.get("Event")
    return "LifecycleTransition" in obj or (
        isinstance(event, str) and event.startswith("autoscaling:")
    )


def parse_direct(obj: Mapping[str, Any], origin: str) -> list[InterruptionEvent]:
    """A lifecycle or test message an Auto Scaling group delivered without EventBridge."""
    where = "Auto Scaling notification"
    raw_id = optional_str(obj, "RequestId", where=where) or optional_str(
        obj, "LifecycleActionToken", where=where
    )
    if raw_id is None:
        raise MalformedEvent(f"{where}: neither RequestId nor LifecycleActionToken is present")
    start = parse_time(field_str(obj, "Time", where=where), where=f"{where} Time")
    event = optional_str(obj, "Event", where=where)
    if event == TEST_NOTIFICATION:
        group = optional_str(obj, "AutoScalingGroupName", where=where) or "?"
        kind = EventKind.ASG_TEST_NOTIFICATION
        return [
            InterruptionEvent(
                id=event_id(kind, raw_id, ""),
                kind=kind,
                instance_id="",
                start=start,
                deadline=None,
                source=origin,
                detail=f"test notification from Auto Scaling group {group}",
                raw_id=raw_id,
                action=TEST_NOTIFICATION,
            )
        ]
    transition = optional_str(obj, "LifecycleTransition", where=where)
    if transition not in _KINDS:
        what = transition or event or "nothing"
        raise UnknownEvent(f"{where}: unsupported lifecycle transition or event {what!r}")
    return [_hook_event(obj, transition, raw_id, start, origin, None, where)]


def _hook_event(
    detail: Mapping[str, Any],
    transition: str,
    raw_id: str,
    start: float,
    origin: str,
    region: str | None,
    where: str,
) -> InterruptionEvent:
    instance_id = instance_id_field(detail, "EC2InstanceId", where=where)
    hook = LifecycleHook(
        asg_name=field_str(detail, "AutoScalingGroupName", where=where),
        hook_name=field_str(detail, "LifecycleHookName", where=where),
        token=field_str(detail, "LifecycleActionToken", where=where),
        transition=transition,
    )
    kind = _KINDS[transition]
    verb = "terminating" if kind is EventKind.ASG_LIFECYCLE_TERMINATE else "launching"
    return InterruptionEvent(
        id=event_id(kind, raw_id, instance_id),
        kind=kind,
        instance_id=instance_id,
        start=start,
        deadline=None,
        source=origin,
        detail=f"Auto Scaling group {hook.asg_name} is {verb} {instance_id} "
        f"(hook {hook.hook_name})",
        raw_id=raw_id,
        action=transition,
        region=region or None,
        lifecycle=hook,
    )
