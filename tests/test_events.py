"""Queue-mode parsing: every sample payload becomes the expected normalized event."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from spotwright.events import (
    SUPPORTED,
    EventKind,
    EventParseError,
    InterruptionEvent,
    MalformedEvent,
    UnknownEvent,
    parse_eventbridge,
)

DATA = Path(__file__).parent / "data" / "events"


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / name).read_text())
    return data


def epoch(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def one(events: list[InterruptionEvent]) -> InterruptionEvent:
    assert len(events) == 1, events
    return events[0]


# --- each sample --------------------------------------------------------------------------


def test_spot_interruption_warning() -> None:
    event = one(parse_eventbridge((DATA / "spot_interruption.json").read_text()))
    assert event.kind is EventKind.SPOT_INTERRUPTION
    assert event.instance_id == "i-0a1b2c3d4e5f60718"
    assert event.start == epoch("2025-03-04T10:15:30")
    assert event.deadline == event.start + 120
    assert event.source == "sqs"
    assert event.action == "terminate"
    assert event.region == "us-east-1"
    assert event.raw_id == "3c6a8f0e-2b1d-4e7a-9f35-6d0c2a7b9e41"
    assert event.state is None and event.lifecycle is None
    assert "i-0a1b2c3d4e5f60718" in event.detail and "120 s" in event.detail


def test_spot_hibernate_has_no_grace() -> None:
    body = load("spot_interruption.json")
    body["detail"]["instance-action"] = "hibernate"
    event = one(parse_eventbridge(body))
    assert event.deadline == event.start
    assert event.action == "hibernate"


def test_spot_without_action_defaults_to_terminate() -> None:
    body = load("spot_interruption.json")
    del body["detail"]["instance-action"]
    assert one(parse_eventbridge(body)).action == "terminate"


def test_rebalance_recommendation_has_no_deadline() -> None:
    event = one(parse_eventbridge(load("rebalance_recommendation.json")))
    assert event.kind is EventKind.REBALANCE_RECOMMENDATION
    assert event.instance_id == "i-0a1b2c3d4e5f60718"
    assert event.start == epoch("2025-03-04T09:58:02")
    assert event.deadline is None


def test_health_scheduled_change_names_each_instance() -> None:
    events = parse_eventbridge(load("health_scheduled_change.json"))
    # The dedicated host entity (h-...) is not an instance and is skipped.
    assert [e.instance_id for e in events] == ["i-07f3c2a9d1e4b5860", "i-0c5d8e2f1a3b49607"]
    for event in events:
        assert event.kind is EventKind.SCHEDULED_CHANGE
        assert event.start == epoch("2025-03-02T18:40:11")
        assert event.deadline == epoch("2025-03-07T06:00:00")
        assert event.action == "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED"
        assert "degradation of the underlying hardware" in event.detail
        assert "\n" not in event.detail
    assert events[0].id != events[1].id
    assert events[0].raw_id == events[1].raw_id


def test_health_falls_back_to_resources() -> None:
    body = load("health_scheduled_change.json")
    del body["detail"]["affectedEntities"]
    events = parse_eventbridge(body)
    assert [e.instance_id for e in events] == ["i-07f3c2a9d1e4b5860", "i-0c5d8e2f1a3b49607"]


def test_health_events_that_are_not_ec2_scheduled_changes_need_no_action() -> None:
    assert parse_eventbridge(load("health_issue.json")) == []
    body = load("health_scheduled_change.json")
    body["detail"]["service"] = "RDS"
    assert parse_eventbridge(body) == []


def test_state_change_terminated() -> None:
    event = one(parse_eventbridge(load("state_change_terminated.json")))
    assert event.kind is EventKind.STATE_CHANGE
    assert event.state == "terminated"
    assert event.deadline == event.start == epoch("2025-03-04T10:17:31")


@pytest.mark.parametrize("state", ["stopping", "stopped", "shutting-down"])
def test_state_change_other_exit_states(state: str) -> None:
    body = load("state_change_terminated.json")
    body["detail"]["state"] = state
    assert one(parse_eventbridge(body)).state == state


def test_state_change_running_needs_no_action() -> None:
    assert parse_eventbridge(load("state_change_running.json")) == []


def test_capacity_reservation_interruption_uses_stated_termination_time() -> None:
    event = one(parse_eventbridge(load("capacity_reservation_interruption.json")))
    assert event.kind is EventKind.CAPACITY_RESERVATION_INTERRUPTION
    assert event.instance_id == "i-0f9e8d7c6b5a43210"
    assert event.deadline == epoch("2025-03-05T14:02:00")
    body = load("capacity_reservation_interruption.json")
    del body["detail"]["instance-termination-time"]
    assert one(parse_eventbridge(body)).deadline == epoch("2025-03-05T14:00:00") + 120


def test_asg_terminate_lifecycle_carries_the_hook() -> None:
    event = one(parse_eventbridge(load("asg_terminate_lifecycle.json")))
    assert event.kind is EventKind.ASG_LIFECYCLE_TERMINATE
    assert event.instance_id == "i-0d4c3b2a1f0e98765"
    assert event.deadline is None
    assert event.lifecycle is not None
    assert event.lifecycle.asg_name == "eks-spot-workers"
    assert event.lifecycle.hook_name == "spotwright-drain"
    assert event.lifecycle.token == "b3d9f1e7-4a2c-48e6-9d05-7c1a6e8f2b34"
    assert event.lifecycle.transition == "autoscaling:EC2_INSTANCE_TERMINATING"


def test_asg_launch_lifecycle() -> None:
    event = one(parse_eventbridge(load("asg_launch_lifecycle.json")))
    assert event.kind is EventKind.ASG_LIFECYCLE_LAUNCH
    assert event.instance_id == "i-0123a4b5c6d7e8f90"
    assert event.lifecycle is not None and event.lifecycle.hook_name == "spotwright-ready"


def test_asg_direct_hook_through_sns() -> None:
    event = one(parse_eventbridge(load("asg_terminate_direct_sns.json"), source="lambda"))
    assert event.kind is EventKind.ASG_LIFECYCLE_TERMINATE
    assert event.instance_id == "i-0b1c2d3e4f5a6b7c8"
    assert event.source == "lambda"
    assert event.raw_id == "4e2b9d07-c1a8-5f63-7b90-d8e2f1a4c365"
    assert event.start == pytest.approx(epoch("2025-03-04T12:05:17.482"))
    assert event.lifecycle is not None
    assert event.lifecycle.asg_name == "eks-ondemand-workers"


def test_asg_test_notification() -> None:
    event = one(parse_eventbridge(load("asg_test_notification.json")))
    assert event.kind is EventKind.ASG_TEST_NOTIFICATION
    assert event.instance_id == ""
    assert "eks-spot-workers" in event.detail


def test_every_sample_parses_and_every_kind_is_covered() -> None:
    kinds = set()
    for path in sorted(DATA.glob("*.json")):
        for event in parse_eventbridge(path.read_text()):
            kinds.add(event.kind)
    # Maintenance canceled/completed only ever come from the instance metadata.
    imds_only = {EventKind.SCHEDULED_CHANGE_CANCELED, EventKind.SCHEDULED_CHANGE_COMPLETED}
    assert kinds == set(EventKind) - imds_only


def test_bytes_body() -> None:
    body = (DATA / "rebalance_recommendation.json").read_bytes()
    assert one(parse_eventbridge(body)).kind is EventKind.REBALANCE_RECOMMENDATION


def test_supported_lists_the_rules() -> None:
    assert ("aws.ec2", "EC2 Spot Instance Interruption Warning") in SUPPORTED
    assert ("aws.health", "AWS Health Event") in SUPPORTED
    assert len(SUPPORTED) == 7


# --- stable ids -----------------------------------------------------------------------------


def test_ids_are_stable_and_depend_only_on_the_signal() -> None:
    first = one(parse_eventbridge(load("spot_interruption.json")))
    again = one(parse_eventbridge(json.dumps(load("spot_interruption.json"), indent=4)))
    assert first.id == again.id
    assert first.id.startswith("spot-interruption-")
    assert len(first.id) <= 63
    assert set(first.id) <= set("abcdefghijklmnopqrstuvwxyz0123456789-")
    # The same notice under another EventBridge id is the same event (it may arrive twice,
    # or by IMDS too); the same instance noticed at another time is a different one...
    other = load("spot_interruption.json")
    other["id"] = "00000000-0000-4000-8000-000000000000"
    assert one(parse_eventbridge(other)).id == first.id
    later = load("spot_interruption.json")
    later["time"] = (
        later["time"].replace(":00Z", ":30Z")
        if later["time"].endswith(":00Z")
        else "2030-01-01T00:00:00Z"
    )
    assert one(parse_eventbridge(later)).id != first.id
    # ...and the same EventBridge id for another kind is too.
    rebalance = load("rebalance_recommendation.json")
    rebalance["id"] = load("spot_interruption.json")["id"]
    assert one(parse_eventbridge(rebalance)).id != first.id


def test_events_are_hashable_values() -> None:
    a = one(parse_eventbridge(load("asg_terminate_lifecycle.json")))
    b = one(parse_eventbridge(load("asg_terminate_lifecycle.json")))
    assert a == b and len({a, b}) == 1


# --- errors ---------------------------------------------------------------------------------


def broken(name: str, path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """A sample with one field replaced (or removed when ``value`` is ...)."""
    body = copy.deepcopy(load(name))
    target = body
    for key in path[:-1]:
        target = target[key]
    if value is ...:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return body


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("", "empty"),
        ("{not json", "not JSON"),
        ("[1, 2]", "JSON object"),
        (broken("spot_interruption.json", ("detail", "instance-id"), ...), "'instance-id'"),
        (broken("spot_interruption.json", ("detail", "instance-id"), 42), "'instance-id'"),
        (broken("spot_interruption.json", ("detail", "instance-id"), "node-1"), "instance id"),
        (broken("spot_interruption.json", ("detail", "instance-action"), "explode"), "explode"),
        (broken("spot_interruption.json", ("detail",), ...), "'detail'"),
        (broken("spot_interruption.json", ("detail",), "x"), "'detail'"),
        (broken("spot_interruption.json", ("time",), "yesterday"), "yesterday"),
        (broken("spot_interruption.json", ("id",), ...), "'id'"),
        (broken("spot_interruption.json", ("resources",), [1]), "resources"),
        (broken("state_change_terminated.json", ("detail", "state"), "melting"), "melting"),
        (
            broken("health_scheduled_change.json", ("detail", "affectedEntities"), "i-1"),
            "affectedEntities",
        ),
        (
            broken("health_scheduled_change.json", ("detail", "startTime"), "soon"),
            "startTime",
        ),
        (
            broken("asg_terminate_lifecycle.json", ("detail", "LifecycleActionToken"), ...),
            "LifecycleActionToken",
        ),
        (
            broken(
                "asg_terminate_lifecycle.json",
                ("detail", "LifecycleTransition"),
                "autoscaling:EC2_INSTANCE_LAUNCHING",
            ),
            "contradicts",
        ),
        (
            broken("capacity_reservation_interruption.json", ("detail", "instance-id"), ...),
            "'instance-id'",
        ),
        (broken("asg_test_notification.json", ("Time",), ...), "'Time'"),
    ],
)
def test_malformed_payloads(body: Any, fragment: str) -> None:
    with pytest.raises(MalformedEvent) as info:
        parse_eventbridge(body)
    assert fragment in str(info.value)
    assert isinstance(info.value, EventParseError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (broken("spot_interruption.json", ("detail-type",), "EC2 AMI State Change"), "AMI"),
        (broken("spot_interruption.json", ("source",), "aws.s3"), "aws.s3"),
        (broken("spot_interruption.json", ("version",), "1"), "version"),
        ({"hello": "world"}, "no detail-type"),
        (
            broken("asg_test_notification.json", ("Event",), "autoscaling:EC2_INSTANCE_LAUNCH"),
            "EC2_INSTANCE_LAUNCH",
        ),
    ],
)
def test_unknown_payloads(body: Any, fragment: str) -> None:
    with pytest.raises(UnknownEvent) as info:
        parse_eventbridge(body)
    assert fragment in str(info.value)


def test_source_must_be_known() -> None:
    with pytest.raises(ValueError, match="source"):
        parse_eventbridge(load("spot_interruption.json"), source="carrier-pigeon")
