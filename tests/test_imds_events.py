"""IMDS mode parsing: every sample metadata body becomes the expected normalized event."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotwright.events import (
    EventKind,
    InterruptionEvent,
    MalformedEvent,
    UnknownEvent,
    parse_eventbridge,
)
from spotwright.events.imds import IMDS_PATHS, POLLED_PATHS, normalize_path, parse_imds
from spotwright.events.model import notice_event_id

DATA = Path(__file__).parent / "data" / "imds"
SQS_DATA = Path(__file__).parent / "data" / "events"
INSTANCE = "i-0a1b2c3d4e5f60718"  # the instance of the queue samples in data/events
NOW = datetime(2025, 3, 4, 10, 16, 0, tzinfo=UTC).timestamp()


def epoch(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def body(name: str) -> str:
    return (DATA / name).read_text()


def parse(path: str, text: str | bytes, *, now: float = NOW) -> list[InterruptionEvent]:
    return parse_imds(path, text, instance_id=INSTANCE, node="ip-10-0-1-23.ec2.internal", now=now)


def one(events: list[InterruptionEvent]) -> InterruptionEvent:
    assert len(events) == 1, events
    return events[0]


# --- spot/instance-action -------------------------------------------------------------------


def test_spot_instance_action() -> None:
    event = one(parse("spot/instance-action", body("spot_instance_action.json")))
    assert event.kind is EventKind.SPOT_INTERRUPTION
    assert event.instance_id == INSTANCE
    assert event.node == "ip-10-0-1-23.ec2.internal"
    assert event.source == "imds"
    assert event.action == "terminate"
    # "time" is when EC2 acts: the deadline; the notice came two minutes before.
    assert event.deadline == epoch("2025-03-04T10:17:30")
    assert event.start == epoch("2025-03-04T10:15:30")
    assert event.raw_id == "spot/instance-action@2025-03-04T10:17:30Z"
    assert event.lifecycle is None and event.state is None
    assert INSTANCE in event.detail and "terminate" in event.detail


@pytest.mark.parametrize("action", ["stop", "hibernate"])
def test_spot_other_actions_keep_the_time_as_deadline(action: str) -> None:
    text = json.dumps({"action": action, "time": "2025-03-05T22:41:07Z"})
    event = one(parse("spot/instance-action", text))
    assert event.action == action
    assert event.deadline == epoch("2025-03-05T22:41:07")


def test_hibernate_sample() -> None:
    event = one(parse("spot/instance-action", body("spot_instance_action_hibernate.json")))
    assert event.action == "hibernate" and event.kind is EventKind.SPOT_INTERRUPTION


def test_legacy_termination_time_is_a_terminate_notice() -> None:
    legacy = one(parse("spot/termination-time", "2025-03-04T10:17:30Z\n"))
    current = one(parse("spot/instance-action", body("spot_instance_action.json")))
    assert legacy.action == "terminate"
    assert (legacy.id, legacy.deadline, legacy.start) == (
        current.id,
        current.deadline,
        current.start,
    )


def test_full_paths_and_bytes_are_accepted() -> None:
    short = one(parse("spot/instance-action", body("spot_instance_action.json")))
    full = one(
        parse(
            "/latest/meta-data/spot/instance-action",
            body("spot_instance_action.json").encode(),
        )
    )
    assert full == short
    assert normalize_path("/latest/meta-data/events/maintenance/scheduled/") == (
        "events/maintenance/scheduled"
    )


# --- events/recommendations/rebalance -------------------------------------------------------


def test_rebalance_recommendation() -> None:
    event = one(parse("events/recommendations/rebalance", body("rebalance_recommendation.json")))
    assert event.kind is EventKind.REBALANCE_RECOMMENDATION
    assert event.start == epoch("2025-03-04T09:58:02")
    assert event.deadline is None
    assert event.source == "imds" and event.node == "ip-10-0-1-23.ec2.internal"


# --- events/maintenance/scheduled -----------------------------------------------------------


def test_active_maintenance_is_a_scheduled_change_due_at_not_before() -> None:
    event = one(parse("events/maintenance/scheduled", body("maintenance_scheduled.json")))
    assert event.kind is EventKind.SCHEDULED_CHANGE
    assert event.deadline == epoch("2025-03-07T06:00:00")
    assert event.state == "active"
    assert event.action == "instance-retirement"
    assert event.raw_id == "instance-event-0b1c2d3e4f5a69788"
    assert event.start == NOW  # the list carries no time of issue: when it was read
    assert "degraded hardware" in event.detail


def test_canceled_and_completed_maintenance_have_kinds_of_their_own() -> None:
    canceled, completed = parse("events/maintenance/scheduled", body("maintenance_ended.json"))
    assert canceled.kind is EventKind.SCHEDULED_CHANGE_CANCELED
    assert canceled.state == "canceled"
    assert canceled.raw_id == "instance-event-0d59937288b749b32"
    assert completed.kind is EventKind.SCHEDULED_CHANGE_COMPLETED
    assert completed.state == "completed"
    assert canceled.deadline is None and completed.deadline is None


def test_canceled_event_shares_the_raw_id_but_not_the_id_of_the_active_one() -> None:
    items = json.loads(body("maintenance_ended.json"))[:1]
    canceled = one(parse("events/maintenance/scheduled", json.dumps(items)))
    items[0]["State"] = "active"
    active = one(parse("events/maintenance/scheduled", json.dumps(items)))
    assert active.raw_id == canceled.raw_id
    assert active.id != canceled.id


def test_single_digit_days_and_an_event_listed_twice() -> None:
    items = json.loads(body("maintenance_ended.json"))
    events = parse("events/maintenance/scheduled", json.dumps([items[1], items[1]]))
    assert len(events) == 1


@pytest.mark.parametrize("text", ["[]", "", "  \n"])
def test_no_scheduled_events(text: str) -> None:
    assert parse("events/maintenance/scheduled", text) == []


# --- autoscaling/target-lifecycle-state -----------------------------------------------------


def test_target_state_terminated_is_an_asg_terminate_without_a_hook() -> None:
    event = one(parse("autoscaling/target-lifecycle-state", "Terminated"))
    assert event.kind is EventKind.ASG_LIFECYCLE_TERMINATE
    assert event.lifecycle is None  # the hook token only travels through the queue
    assert event.deadline is None
    assert event.start == NOW


@pytest.mark.parametrize("state", ["InService", "InService\n", "Warmed:Stopped", ""])
def test_other_target_states_need_nothing(state: str) -> None:
    assert parse("autoscaling/target-lifecycle-state", state) == []


# --- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "text", "fragments"),
    [
        ("spot/instance-action", "", ["spot/instance-action", "empty"]),
        ("spot/instance-action", "<html>401</html>", ["spot/instance-action", "not JSON"]),
        ("spot/instance-action", "[1]", ["spot/instance-action", "JSON object"]),
        ("spot/instance-action", '{"time": "2025-03-04T10:17:30Z"}', ["'action'", "missing"]),
        (
            "spot/instance-action",
            '{"action": "explode", "time": "2025-03-04T10:17:30Z"}',
            ["'action'", "explode"],
        ),
        ("spot/instance-action", '{"action": "stop"}', ["spot/instance-action", "'time'"]),
        (
            "spot/instance-action",
            '{"action": "stop", "time": "soon"}',
            ["spot/instance-action", "'time'", "soon"],
        ),
        ("spot/termination-time", "tomorrow", ["spot/termination-time", "tomorrow"]),
        ("events/recommendations/rebalance", "{}", ["rebalance", "'noticeTime'"]),
        (
            "events/recommendations/rebalance",
            '{"noticeTime": 5}',
            ["rebalance", "'noticeTime'", "int"],
        ),
        ("events/maintenance/scheduled", "{}", ["maintenance/scheduled", "JSON list"]),
        ("events/maintenance/scheduled", '["x"]', ["maintenance/scheduled[0]", "object"]),
        (
            "events/maintenance/scheduled",
            '[{"Code": "system-reboot", "State": "active", "NotBefore": "1 Jan 2025 0:00:00 GMT"}]',
            ["maintenance/scheduled[0]", "'EventId'"],
        ),
        (
            "events/maintenance/scheduled",
            '[{"Code": "system-reboot", "EventId": "instance-event-1", "State": "pending"}]',
            ["[0]", "'State'", "pending"],
        ),
        (
            "events/maintenance/scheduled",
            '[{"Code": "system-reboot", "EventId": "instance-event-1", "State": "active"}]',
            ["[0]", "'NotBefore'"],
        ),
        (
            "events/maintenance/scheduled",
            '[{"Code": "system-reboot", "EventId": "e", "State": "active", "NotBefore": "Monday"}]',
            ["[0]", "'NotBefore'", "Monday"],
        ),
        (
            "events/maintenance/scheduled",
            '[{"Code": "c", "EventId": "e", "State": "canceled", "NotAfter": 7}]',
            ["[0]", "'NotAfter'"],
        ),
        ("spot/instance-action", b"\xff\xfe", ["spot/instance-action", "UTF-8"]),
    ],
)
def test_malformed_bodies_name_the_path_and_field(
    path: str, text: str | bytes, fragments: list[str]
) -> None:
    with pytest.raises(MalformedEvent) as caught:
        parse(path, text)
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_unknown_paths_and_states() -> None:
    with pytest.raises(UnknownEvent, match="instance-type"):
        parse("instance-type", "m5.large")
    with pytest.raises(UnknownEvent, match=r"target-lifecycle-state.*Exploded"):
        parse("autoscaling/target-lifecycle-state", "Exploded")


def test_the_instance_id_is_checked() -> None:
    with pytest.raises(ValueError, match="instance id"):
        parse_imds(
            "spot/instance-action", body("spot_instance_action.json"), instance_id="node", now=0
        )


def test_every_polled_path_is_understood() -> None:
    assert set(POLLED_PATHS) <= set(IMDS_PATHS)
    assert "spot/termination-time" in IMDS_PATHS


# --- ids: stable, time-free, source-independent ----------------------------------------------


def test_spot_id_is_derived_from_what_the_queue_notice_also_carries() -> None:
    """The IMDS id is a function of (kind, instance, notice time), all of which the
    EventBridge warning for the same notice carries too."""
    imds = one(parse("spot/instance-action", body("spot_instance_action.json")))
    sqs = one(parse_eventbridge((SQS_DATA / "spot_interruption.json").read_text()))
    assert (sqs.instance_id, sqs.start, sqs.deadline) == (
        imds.instance_id,
        imds.start,
        imds.deadline,
    )
    assert imds.id == notice_event_id(sqs.kind, sqs.instance_id, sqs.start)


def test_rebalance_id_is_derived_from_what_the_queue_recommendation_also_carries() -> None:
    imds = one(parse("events/recommendations/rebalance", body("rebalance_recommendation.json")))
    sqs = one(parse_eventbridge((SQS_DATA / "rebalance_recommendation.json").read_text()))
    assert sqs.start == imds.start
    assert imds.id == notice_event_id(sqs.kind, sqs.instance_id, sqs.start)


def test_the_same_notice_from_imds_and_sqs_is_one_event() -> None:
    imds = one(parse("spot/instance-action", body("spot_instance_action.json")))
    sqs = one(parse_eventbridge((SQS_DATA / "spot_interruption.json").read_text()))
    assert imds.id == sqs.id


instance_ids = st.text(alphabet="0123456789abcdef", min_size=17, max_size=17).map(
    lambda digits: "i-" + digits
)
# Whole seconds between 2001 and 2096, as AWS writes them.
instants = st.integers(min_value=1_000_000_000, max_value=4_000_000_000).map(float)
reads = st.floats(min_value=0, max_value=4e9, allow_nan=False)


def iso(epoch_seconds: float, *, offset_form: bool = False) -> str:
    text = datetime.fromtimestamp(epoch_seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return text.replace("Z", "+00:00") if offset_form else text


def gmt(epoch_seconds: float) -> str:
    moment = datetime.fromtimestamp(epoch_seconds, UTC)
    return f"{moment.day} {moment.strftime('%b %Y %H:%M:%S')} GMT"


@given(
    instance=instance_ids,
    when=instants,
    action=st.sampled_from(["terminate", "stop", "hibernate"]),
    state=st.sampled_from(["active", "canceled", "completed"]),
    first_read=reads,
    second_read=reads,
)
def test_ids_are_stable_and_never_depend_on_the_time_of_the_read(
    instance: str, when: float, action: str, state: str, first_read: float, second_read: float
) -> None:
    maintenance = [
        {
            "Code": "system-reboot",
            "EventId": f"instance-event-{instance[2:]}",
            "State": state,
            "NotBefore": gmt(when),
            "NotAfter": gmt(when + 3600),
        }
    ]
    bodies = {
        "spot/instance-action": json.dumps({"action": action, "time": iso(when)}),
        "events/recommendations/rebalance": json.dumps({"noticeTime": iso(when)}),
        "events/maintenance/scheduled": json.dumps(maintenance),
        "autoscaling/target-lifecycle-state": "Terminated",
    }
    for path, text in bodies.items():
        first = one(parse_imds(path, text, instance_id=instance, now=first_read))
        again = one(parse_imds(path, text, instance_id=instance, node="n", now=second_read))
        assert first.id == again.id, path
        assert len(first.id) <= 63 and set(first.id) <= set("abcdefghijklmnopqrstuvwxyz0123456789-")
    # The same instant written another way is the same notice.
    reworded = json.dumps({"time": iso(when, offset_form=True), "action": action})
    assert (
        one(parse_imds("spot/instance-action", reworded, instance_id=instance, now=first_read)).id
        == one(
            parse_imds(
                "spot/instance-action", bodies["spot/instance-action"], instance_id=instance, now=0
            )
        ).id
    )


@given(instance=instance_ids, when=instants, later=st.integers(min_value=1, max_value=10**6))
def test_a_later_notice_is_another_event(instance: str, when: float, later: int) -> None:
    def spot_id(at: float) -> str:
        text = json.dumps({"action": "stop", "time": iso(at)})
        return one(parse_imds("spot/instance-action", text, instance_id=instance, now=0)).id

    assert spot_id(when) != spot_id(when + later)


def test_every_kind_comes_from_some_sample_of_either_source() -> None:
    """The canceled and completed maintenance kinds exist only in the metadata."""
    imds_bodies = {
        "spot_instance_action.json": "spot/instance-action",
        "spot_instance_action_hibernate.json": "spot/instance-action",
        "rebalance_recommendation.json": "events/recommendations/rebalance",
        "maintenance_scheduled.json": "events/maintenance/scheduled",
        "maintenance_ended.json": "events/maintenance/scheduled",
    }
    assert set(imds_bodies) | {"target_lifecycle_state.json"} == {
        p.name for p in DATA.glob("*.json")
    }
    kinds = {e.kind for name, path in imds_bodies.items() for e in parse(path, body(name))}
    wrapped = json.loads(body("target_lifecycle_state.json"))
    kinds |= {e.kind for e in parse(wrapped["path"], wrapped["body"])}
    kinds |= {e.kind for p in SQS_DATA.glob("*.json") for e in parse_eventbridge(p.read_text())}
    assert kinds == set(EventKind)
