"""What the metadata mock is currently announcing, and when each notice becomes visible.

A handler under test polls the same paths over and over; what it must see is a notice that
is absent (404) until the moment EC2 would have raised it and then identical on every poll,
because a body that changes between polls looks like a new event to a de-duplicating
handler. So every notice is stored with fixed times, resolved once, when it is scheduled:
a delay is turned into an absolute moment against the mock's clock, and a pinned time is
kept as it is. The state is plain data behind an injectable clock, so tests move time
forward instead of sleeping, and the HTTP layer only renders what this module says.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from spotwright.adapters._market_signals import iso_z
from spotwright.events._common import is_instance_id

__all__ = [
    "ACTIONS",
    "EVENT_CODES",
    "EVENT_STATES",
    "LIFECYCLE_STATES",
    "NOTICE_SECONDS",
    "LifecycleSchedule",
    "MockState",
    "RebalanceNotice",
    "ScheduledEvent",
    "SpotNotice",
    "aws_event_time",
    "check_instance_id",
    "iso_z",
    "parse_time",
    "region_of_zone",
    "scheduled_event",
    "scheduled_event_from_spec",
    "spot_notice",
    "whole_second",
]

#: EC2 acts this long after it raises a spot interruption notice.
NOTICE_SECONDS = 120.0
#: What ``spot/instance-action`` may say EC2 will do.
ACTIONS = ("terminate", "stop", "hibernate")
#: Codes of ``events/maintenance/scheduled`` items, as EC2 documents them.
EVENT_CODES = (
    "instance-reboot",
    "system-reboot",
    "system-maintenance",
    "instance-retirement",
    "instance-stop",
)
EVENT_STATES = ("active", "completed", "canceled")
#: The steady states an Auto Scaling instance can be heading for.
LIFECYCLE_STATES = (
    "InService",
    "Terminated",
    "Detached",
    "Standby",
    "Warmed:Hibernated",
    "Warmed:Running",
    "Warmed:Stopped",
    "Warmed:Terminated",
)
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_DAY = 86400.0
# us-east-1a -> us-east-1; us-west-2-lax-1a (a Local Zone) -> us-west-2; us-gov-west-1a too.
_REGION = re.compile(r"^([a-z]{2}(?:-gov|-iso[a-z]?)?-[a-z]+-\d+)(?:-[a-z0-9-]+)?[a-z]$")


def aws_event_time(epoch: float) -> str:
    """The layout scheduled events use: ``21 Jan 2019 09:00:43 GMT`` (day not zero-padded).

    Written by hand rather than with ``%b`` so the month name never follows the locale.
    """
    moment = datetime.fromtimestamp(epoch, UTC)
    return f"{moment.day} {_MONTHS[moment.month - 1]} {moment:%Y %H:%M:%S} GMT"


def parse_time(text: str, *, what: str) -> float:
    """Epoch seconds from ISO-8601 (``2026-01-01T00:00:00Z``) or the scheduled-event layout.

    A time without a zone is UTC, as everywhere in AWS. Raises ``ValueError`` naming
    ``what`` so the CLI and the control endpoint can show it as it is.
    """
    value = text.strip()
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        try:
            moment = datetime.strptime(value, "%d %b %Y %H:%M:%S GMT")
        except ValueError:
            raise ValueError(
                f"{what}: expected an ISO-8601 time like 2026-01-01T12:00:00Z, got {text!r}"
            ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def region_of_zone(zone: str) -> str:
    """The region an availability zone (or Local/Wavelength zone) belongs to."""
    match = _REGION.match(zone)
    if match is None:
        raise ValueError(f"expected an availability zone like us-east-1a, got {zone!r}")
    return match.group(1)


def check_instance_id(value: str) -> str:
    """The value itself if it is an EC2 instance id, else a ``ValueError`` that says so."""
    if not is_instance_id(value):
        raise ValueError(
            f"{value!r} is not an EC2 instance id (i- and 8 to 17 lowercase hex digits)"
        )
    return value


def _choice(value: str, allowed: tuple[str, ...], *, what: str) -> str:
    if value not in allowed:
        raise ValueError(f"{what}: expected one of {', '.join(allowed)}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class SpotNotice:
    """A spot interruption notice: raised at ``notice_time``, EC2 acts at ``action_time``."""

    action: str
    notice_time: float
    action_time: float

    def body(self) -> dict[str, str]:
        return {"action": self.action, "time": iso_z(self.action_time)}


def spot_notice(
    action: str = "terminate",
    *,
    now: float,
    delay: float | None = None,
    action_time: float | None = None,
) -> SpotNotice:
    """A notice raised ``delay`` seconds after ``now``, or one whose action time is pinned.

    A pinned action time is what a handler reads in the ``time`` field; the notice becomes
    visible two minutes before it, exactly as EC2 raises it. Without either, it is raised
    at ``now``.
    """
    _choice(action, ACTIONS, what="action")
    if delay is not None and action_time is not None:
        raise ValueError("give a delay or a pinned time for the notice, not both")
    if action_time is not None:
        return SpotNotice(action, action_time - NOTICE_SECONDS, action_time)
    raised = whole_second(now + (delay or 0.0))
    return SpotNotice(action, raised, raised + NOTICE_SECONDS)


def whole_second(epoch: float) -> float:
    """Round down to the second: bodies carry whole seconds, so visibility must agree."""
    return float(math.floor(epoch))


@dataclass(frozen=True, slots=True)
class RebalanceNotice:
    """A rebalance recommendation; it is visible from its own ``noticeTime`` on."""

    notice_time: float

    def body(self) -> dict[str, str]:
        return {"noticeTime": iso_z(self.notice_time)}


@dataclass(frozen=True, slots=True)
class ScheduledEvent:
    """One item of ``events/maintenance/scheduled``; visible from the moment it is added."""

    event_id: str
    code: str
    state: str
    description: str
    not_before: float
    not_after: float
    not_before_deadline: float

    def body(self) -> dict[str, str]:
        return {
            "Code": self.code,
            "Description": self.description,
            "State": self.state,
            "EventId": self.event_id,
            "NotBefore": aws_event_time(self.not_before),
            "NotAfter": aws_event_time(self.not_after),
            "NotBeforeDeadline": aws_event_time(self.not_before_deadline),
        }


def scheduled_event(
    code: str = "system-reboot",
    *,
    now: float,
    state: str = "active",
    event_id: str | None = None,
    description: str | None = None,
    not_before: float | None = None,
    not_after: float | None = None,
    not_before_deadline: float | None = None,
) -> ScheduledEvent:
    """A scheduled event with amazon-ec2-metadata-mock's defaults for what is left out.

    ``NotBefore`` defaults to ``now``, ``NotAfter`` to a week after it and
    ``NotBeforeDeadline`` to nine days after it. The id defaults to a digest of the code
    and window, not to something random, so an event given with the same times keeps its
    id when the mock restarts, and a handler that remembers ids sees the same event; the
    state is left out, so cancelling an event keeps its id, as EC2 does.
    """
    _choice(code, EVENT_CODES, what="code")
    _choice(state, EVENT_STATES, what="state")
    start = whole_second(now) if not_before is None else not_before
    end = start + 7 * _DAY if not_after is None else not_after
    deadline = start + 9 * _DAY if not_before_deadline is None else not_before_deadline
    if end < start:
        raise ValueError("notAfter must not be before notBefore")
    if deadline < start:
        raise ValueError("notBeforeDeadline must not be before notBefore")
    if event_id is None:
        digest = hashlib.sha256(f"{code}|{start:.0f}|{end:.0f}".encode()).hexdigest()
        event_id = f"instance-event-{digest[:17]}"
    elif not re.fullmatch(r"instance-event-[0-9a-f]{8,17}", event_id):
        raise ValueError(
            f"eventId: expected instance-event- and 8 to 17 lowercase hex digits, got {event_id!r}"
        )
    text = description if description is not None else f"scheduled {code.replace('-', ' ')}"
    return ScheduledEvent(event_id, code, state, text, start, end, deadline)


_SPEC_KEYS = {
    "code": "code",
    "state": "state",
    "id": "event_id",
    "description": "description",
    "not-before": "not_before",
    "not-after": "not_after",
    "not-before-deadline": "not_before_deadline",
}


def scheduled_event_from_spec(spec: str, *, now: float) -> ScheduledEvent:
    """A scheduled event from the command line's short form.

    Either a bare code (``system-reboot``) or comma-separated ``key=value`` pairs with keys
    code, state, id, description, not-before, not-after and not-before-deadline, e.g.
    ``code=instance-stop,state=canceled,not-before=2026-01-01T00:00:00Z``.
    """
    text = spec.strip()
    if "=" not in text:
        return scheduled_event(text, now=now)
    fields: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in _SPEC_KEYS:
            raise ValueError(
                f"{part.strip()!r} is not key=value with a key among {', '.join(_SPEC_KEYS)}"
            )
        fields[_SPEC_KEYS[key]] = value.strip()
    times = {
        name: parse_time(fields.pop(name), what=name.replace("_", "-"))
        for name in ("not_before", "not_after", "not_before_deadline")
        if name in fields
    }
    return scheduled_event(
        fields.pop("code", "system-reboot"),
        now=now,
        state=fields.pop("state", "active"),
        event_id=fields.pop("event_id", None),
        description=fields.pop("description", None),
        **times,
    )


@dataclass(frozen=True, slots=True)
class LifecycleSchedule:
    """The target lifecycle state now, and optionally the one it changes to at ``at``."""

    current: str = "InService"
    pending: str | None = None
    at: float | None = None

    def state(self, now: float) -> str:
        if self.pending is not None and self.at is not None and now >= self.at:
            return self.pending
        return self.current


class MockState:
    """The notices one mocked instance carries, read and changed against one clock.

    Everything is resolved to absolute times when it is set, so reading is a pure function
    of the clock: two polls in the same state give byte-identical bodies.
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.spot: SpotNotice | None = None
        self.rebalance: RebalanceNotice | None = None
        self.events: dict[str, ScheduledEvent] = {}
        self.lifecycle = LifecycleSchedule()

    def now(self) -> float:
        return self._clock()

    # -- changes -------------------------------------------------------------------------

    def schedule_spot(self, notice: SpotNotice) -> None:
        self.spot = notice

    def schedule_rebalance(self, notice: RebalanceNotice) -> None:
        self.rebalance = notice

    def put_event(self, event: ScheduledEvent) -> None:
        """Add an event, or replace the one with its id (to cancel or complete it)."""
        self.events[event.event_id] = event

    def set_lifecycle(self, state: str, *, delay: float | None = None) -> None:
        """Head for ``state`` now, or after ``delay`` seconds from the current state."""
        _choice(state, LIFECYCLE_STATES, what="state")
        if delay is None or delay <= 0:
            self.lifecycle = LifecycleSchedule(current=state)
        else:
            current = self.lifecycle.state(self.now())
            self.lifecycle = LifecycleSchedule(current, state, whole_second(self.now() + delay))

    def reset(self) -> None:
        """No notices at all and back in service, as a freshly launched instance."""
        self.spot = None
        self.rebalance = None
        self.events = {}
        self.lifecycle = LifecycleSchedule()

    # -- what a poll sees ----------------------------------------------------------------

    def visible_spot(self) -> SpotNotice | None:
        notice = self.spot
        return notice if notice is not None and self.now() >= notice.notice_time else None

    def visible_rebalance(self) -> RebalanceNotice | None:
        notice = self.rebalance
        return notice if notice is not None and self.now() >= notice.notice_time else None

    def visible_events(self) -> list[ScheduledEvent]:
        return sorted(self.events.values(), key=lambda event: (event.not_before, event.event_id))

    def lifecycle_state(self) -> str:
        return self.lifecycle.state(self.now())

    def snapshot(self) -> dict[str, Any]:
        """Everything scheduled, visible or not, for the control endpoint's ``GET state``."""
        now = self.now()
        spot = self.spot
        rebalance = self.rebalance
        pending = self.lifecycle
        return {
            "now": iso_z(now),
            "spotInterruption": None
            if spot is None
            else {
                **spot.body(),
                "noticeTime": iso_z(spot.notice_time),
                "visible": now >= spot.notice_time,
            },
            "rebalanceRecommendation": None
            if rebalance is None
            else {**rebalance.body(), "visible": now >= rebalance.notice_time},
            "scheduledEvents": [event.body() for event in self.visible_events()],
            "lifecycleState": {
                "current": pending.state(now),
                "pending": None
                if pending.pending is None or pending.at is None or now >= pending.at
                else {"state": pending.pending, "at": iso_z(pending.at)},
            },
        }

    def with_event_state(self, event_id: str, state: str) -> ScheduledEvent:
        """The stored event with a new state (used to cancel or complete it in place)."""
        _choice(state, EVENT_STATES, what="state")
        event = self.events.get(event_id)
        if event is None:
            raise KeyError(event_id)
        return replace(event, state=state)
