"""The mock's state and configuration without HTTP: times, formats, schedules, validation.

What the server renders is decided here, so the edge cases (time layouts, zones, pinned
versus delayed notices, cancelling an event) are pinned down directly and cheaply.
"""

from __future__ import annotations

from typing import Any

import pytest

from spotwright.imds import (
    MockConfig,
    MockState,
    RebalanceNotice,
    aws_event_time,
    parse_time,
    scheduled_event,
    scheduled_event_from_spec,
    spot_notice,
)
from spotwright.imds.state import region_of_zone

T0 = parse_time("2026-03-01T12:00:00Z", what="test")


def test_aws_event_time_does_not_pad_the_day() -> None:
    assert aws_event_time(parse_time("2019-01-02T09:00:43Z", what="t")) == (
        "2 Jan 2019 09:00:43 GMT"
    )
    assert parse_time("21 Jan 2019 09:00:43 GMT", what="t") == parse_time(
        "2019-01-21T09:00:43Z", what="t"
    )
    assert parse_time("2019-01-21T09:00:43", what="t") == parse_time(
        "2019-01-21T09:00:43+00:00", what="t"
    )


@pytest.mark.parametrize(
    ("zone", "region"),
    [
        ("us-east-1a", "us-east-1"),
        ("eu-central-2c", "eu-central-2"),
        ("us-west-2-lax-1a", "us-west-2"),
        ("us-gov-west-1b", "us-gov-west-1"),
        ("ap-southeast-4a", "ap-southeast-4"),
    ],
)
def test_region_of_zone(zone: str, region: str) -> None:
    assert region_of_zone(zone) == region


def test_spot_notice_delayed_or_pinned() -> None:
    delayed = spot_notice("terminate", now=T0 + 0.7, delay=30)
    assert (delayed.notice_time, delayed.action_time) == (T0 + 30, T0 + 150)
    pinned = spot_notice("stop", now=T0, action_time=T0 + 600)
    assert (pinned.notice_time, pinned.action_time) == (T0 + 480, T0 + 600)
    assert pinned.body() == {"action": "stop", "time": "2026-03-01T12:10:00Z"}
    with pytest.raises(ValueError, match="not both"):
        spot_notice(now=T0, delay=1, action_time=T0)
    with pytest.raises(ValueError, match="terminate, stop, hibernate"):
        spot_notice("reboot", now=T0)


def test_state_visibility_lifecycle_and_reset() -> None:
    now = [T0]
    state = MockState(lambda: now[0])
    state.schedule_spot(spot_notice(now=T0, delay=10))
    state.schedule_rebalance(RebalanceNotice(T0 + 5))
    state.put_event(scheduled_event("instance-retirement", now=T0))
    state.set_lifecycle("Terminated", delay=20)
    assert state.visible_spot() is None and state.visible_rebalance() is None
    assert state.lifecycle_state() == "InService"
    now[0] = T0 + 10
    assert state.visible_spot() is not None and state.visible_rebalance() is not None
    now[0] = T0 + 20
    assert state.lifecycle_state() == "Terminated"
    (event,) = state.visible_events()
    canceled = state.with_event_state(event.event_id, "canceled")
    assert (canceled.state, canceled.not_before) == ("canceled", event.not_before)
    with pytest.raises(KeyError):
        state.with_event_state("instance-event-00000000", "canceled")
    state.reset()
    assert state.snapshot()["spotInterruption"] is None
    assert state.visible_events() == [] and state.lifecycle_state() == "InService"


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"instance_id": "i-XYZ"}, "not an EC2 instance id"),
        ({"zone": "moon-1a"}, "availability zone"),
        ({"instance_type": "large"}, "instance type"),
        ({"local_ipv4": "10.0.0.300"}, "IPv4"),
        ({"mac": "0e-49"}, "MAC"),
        ({"port": 70000}, "port"),
        ({"spot_delay": 5, "spot_time": T0}, "not both"),
        ({"rebalance_delay": -1}, "0 or more"),
        ({"asg_target_state": "Running"}, "InService"),
    ],
)
def test_config_refuses_what_no_instance_could_have(options: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        MockConfig(**options)


def test_scheduled_event_specs() -> None:
    event = scheduled_event_from_spec(
        "code=instance-stop, state=completed, id=instance-event-0123456789abcdef0, "
        "not-before=2026-05-01T00:00:00Z, description=host moves",
        now=T0,
    )
    assert event.body() == {
        "Code": "instance-stop",
        "Description": "host moves",
        "State": "completed",
        "EventId": "instance-event-0123456789abcdef0",
        "NotBefore": "1 May 2026 00:00:00 GMT",
        "NotAfter": "8 May 2026 00:00:00 GMT",
        "NotBeforeDeadline": "10 May 2026 00:00:00 GMT",
    }
    bare = scheduled_event_from_spec("system-maintenance", now=T0)
    assert (bare.code, bare.state, bare.not_before) == ("system-maintenance", "active", T0)
    assert bare.event_id == scheduled_event_from_spec("system-maintenance", now=T0).event_id
    for bad, fragment in [
        ("reboot", "system-reboot"),
        ("code=system-reboot,colour=red", "key=value"),
        ("state=gone", "active"),
        ("not-before=noon", "ISO-8601"),
    ]:
        with pytest.raises(ValueError, match=fragment):
            scheduled_event_from_spec(bad, now=T0)
