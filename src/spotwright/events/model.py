"""One normalized interruption event, whatever signal it came from.

EventBridge (through SQS or a Lambda), the instance metadata service and ASG lifecycle
hooks all say "this instance is going away (or may be)" in different shapes. The
interruption controller acts on this single model instead, and de-duplicates on its ``id``,
which is derived only from the signal itself (never from the time it was read), so the same
message delivered twice, or read by two replicas, is recognised as one event.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "EventKind",
    "EventParseError",
    "InterruptionEvent",
    "LifecycleHook",
    "MalformedEvent",
    "UnknownEvent",
    "event_id",
    "notice_event_id",
]


class EventKind(StrEnum):
    """What happened; the value is the snake_case name used in metrics and logs."""

    SPOT_INTERRUPTION = "spot_interruption"
    REBALANCE_RECOMMENDATION = "rebalance_recommendation"
    SCHEDULED_CHANGE = "scheduled_change"
    STATE_CHANGE = "state_change"
    CAPACITY_RESERVATION_INTERRUPTION = "capacity_reservation_interruption"
    ASG_LIFECYCLE_TERMINATE = "asg_lifecycle_terminate"
    ASG_LIFECYCLE_LAUNCH = "asg_lifecycle_launch"
    ASG_TEST_NOTIFICATION = "asg_test_notification"
    #: A scheduled maintenance event the instance metadata lists as canceled or completed:
    #: the node can be put back in service.
    SCHEDULED_CHANGE_CANCELED = "scheduled_change_canceled"
    SCHEDULED_CHANGE_COMPLETED = "scheduled_change_completed"


@dataclass(frozen=True, slots=True)
class LifecycleHook:
    """What CompleteLifecycleAction needs to let an ASG proceed once the node is handled."""

    asg_name: str
    hook_name: str
    token: str
    transition: str


@dataclass(frozen=True, slots=True)
class InterruptionEvent:
    """A signal about one instance, normalized.

    ``start`` is when the signal was raised (epoch seconds); ``deadline`` is when the
    instance is expected to stop (``None`` when the signal sets none, as for a rebalance
    recommendation). ``source`` says how it reached us: ``sqs``, ``imds`` or ``lambda``.
    ``action`` keeps the signal's own verb (``terminate``/``stop``/``hibernate``, a Health
    event type code, an ASG transition); ``state`` is set for state-change events only;
    ``raw_id`` is the id the signal carried (EventBridge id, IMDS event id, ASG request id).
    An ASG test notification concerns no instance: its ``instance_id`` is empty.
    """

    id: str
    kind: EventKind
    instance_id: str
    start: float
    deadline: float | None
    source: str
    detail: str
    raw_id: str
    state: str | None = None
    action: str | None = None
    region: str | None = None
    lifecycle: LifecycleHook | None = None
    #: The Kubernetes node, when the source knows it (IMDS mode runs on the node itself).
    node: str | None = None


class EventParseError(ValueError):
    """A message could not be turned into interruption events."""


class UnknownEvent(EventParseError):
    """Valid JSON, but not an event type spotwright understands (safe to drop)."""


class MalformedEvent(EventParseError):
    """An event type spotwright knows, with a field missing or of the wrong shape."""


def event_id(kind: EventKind, raw_id: str, instance_id: str) -> str:
    """A stable id: the kind, then a digest of (source event id, kind, instance).

    One EventBridge message can name several instances (AWS Health), so the instance is part
    of the digest. The result is at most 50 characters of ``[a-z0-9_-]``, so it is also a
    valid label or taint value.
    """
    digest = hashlib.sha256(f"{raw_id}\x1f{kind.value}\x1f{instance_id}".encode()).hexdigest()
    return f"{kind.value.replace('_', '-')}-{digest[:16]}"


def notice_event_id(kind: EventKind, instance_id: str, notice: float) -> str:
    """A stable id that does not depend on which source delivered the signal.

    The same spot notice reaches us through EventBridge (with an envelope id) and through
    the instance metadata (with none); what both carry is the instance, the kind and the
    time of the notice. The notice is taken to the whole second, since both sources state
    whole seconds. Same format as ``event_id``.
    """
    second = math.floor(notice)
    text = f"notice\x1f{kind.value}\x1f{instance_id}\x1f{second}"
    digest = hashlib.sha256(text.encode()).hexdigest()
    return f"{kind.value.replace('_', '-')}-{digest[:16]}"
