"""The action policy: which action each kind of signal gets, and how it is configured."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from spotwright.events import EventKind, InterruptionEvent, parse_eventbridge
from spotwright.events.actions import (
    Action,
    ActionName,
    ActionPolicy,
    Step,
    plan_action,
)
from spotwright.events.imds import parse_imds
from spotwright.model.labels import DISRUPTED_TAINT_KEY

SQS = Path(__file__).parent / "data" / "events"
IMDS = Path(__file__).parent / "data" / "imds"
INSTANCE = "i-0a1b2c3d4e5f60718"


def sqs(name: str) -> InterruptionEvent:
    return parse_eventbridge((SQS / name).read_text())[0]


def imds(path: str, name: str) -> list[InterruptionEvent]:
    return parse_imds(path, (IMDS / name).read_text(), instance_id=INSTANCE, node="n-1", now=0)


DEADLINE_SAMPLES = {
    EventKind.SPOT_INTERRUPTION: "spot_interruption.json",
    EventKind.SCHEDULED_CHANGE: "health_scheduled_change.json",
    EventKind.STATE_CHANGE: "state_change_terminated.json",
    EventKind.CAPACITY_RESERVATION_INTERRUPTION: "capacity_reservation_interruption.json",
}


def before(action: Action, first: Step, second: Step) -> bool:
    return action.steps.index(first) < action.steps.index(second)


# --- signals with a deadline ------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(DEADLINE_SAMPLES))
def test_deadline_signals_are_tainted_cordoned_replaced_and_drained_by_the_deadline(
    kind: EventKind,
) -> None:
    event = sqs(DEADLINE_SAMPLES[kind])
    assert event.kind is kind and event.deadline is not None
    action = plan_action(event)
    assert action.name is ActionName.CORDON_AND_DRAIN
    assert action.steps == (
        Step.TAINT,
        Step.CORDON,
        Step.EXCLUDE_FROM_LOAD_BALANCERS,
        Step.LAUNCH_REPLACEMENT,
        Step.DRAIN,
    )
    assert action.deadline == event.deadline
    assert action.at_deadline == "force"
    assert action.taint is not None
    assert (action.taint.key, action.taint.effect) == (DISRUPTED_TAINT_KEY, "NoSchedule")
    assert action.event_id == event.id and action.instance_id == event.instance_id
    assert action.lifecycle is None


def test_imds_spot_notice_gets_the_same_plan_with_its_node() -> None:
    event = imds("spot/instance-action", "spot_instance_action.json")[0]
    action = plan_action(event)
    assert action.name is ActionName.CORDON_AND_DRAIN
    assert action.deadline == event.deadline
    assert action.node == "n-1"


def test_a_deadline_signal_without_a_deadline_is_treated_as_due() -> None:
    event = dataclasses.replace(sqs("health_scheduled_change.json"), deadline=None)
    assert plan_action(event).deadline == event.start


def test_imds_scheduled_maintenance_is_due_at_not_before() -> None:
    event = imds("events/maintenance/scheduled", "maintenance_scheduled.json")[0]
    action = plan_action(event)
    assert action.name is ActionName.CORDON_AND_DRAIN
    assert action.deadline == event.deadline


@pytest.mark.parametrize(
    ("field", "kind"),
    [
        ("spot_interruption", EventKind.SPOT_INTERRUPTION),
        ("scheduled_change", EventKind.SCHEDULED_CHANGE),
        ("state_change", EventKind.STATE_CHANGE),
        ("capacity_reservation_interruption", EventKind.CAPACITY_RESERVATION_INTERRUPTION),
    ],
)
def test_each_deadline_kind_is_configured_on_its_own(field: str, kind: EventKind) -> None:
    event = sqs(DEADLINE_SAMPLES[kind])
    cordon = plan_action(event, ActionPolicy.model_validate({field: "cordon"}))
    assert cordon.name is ActionName.CORDON and cordon.steps == (Step.CORDON,)
    assert cordon.deadline is None
    nothing = plan_action(event, ActionPolicy.model_validate({field: "none"}))
    assert nothing.name is ActionName.NONE and nothing.steps == ()
    # The other kinds keep their default.
    other = next(k for k in DEADLINE_SAMPLES if k is not kind)
    assert plan_action(
        sqs(DEADLINE_SAMPLES[other]), ActionPolicy.model_validate({field: "none"})
    ).name is (ActionName.CORDON_AND_DRAIN)


def test_policy_options_shape_the_drain() -> None:
    policy = ActionPolicy(
        exclude_from_load_balancers=False, taint_effect="NoExecute", at_deadline="leave"
    )
    action = plan_action(sqs("spot_interruption.json"), policy)
    assert Step.EXCLUDE_FROM_LOAD_BALANCERS not in action.steps
    assert action.taint is not None and action.taint.effect == "NoExecute"
    assert action.at_deadline == "leave"


# --- rebalance recommendation -----------------------------------------------------------------


def test_rebalance_default_is_replace_then_drain() -> None:
    action = plan_action(sqs("rebalance_recommendation.json"))
    assert action.name is ActionName.REPLACE_THEN_DRAIN
    # Cordoned at once, replacement launched, drained only once the replacement is ready.
    assert action.steps[0] is Step.CORDON
    assert before(action, Step.LAUNCH_REPLACEMENT, Step.WAIT_FOR_REPLACEMENT)
    assert before(action, Step.WAIT_FOR_REPLACEMENT, Step.TAINT)
    assert before(action, Step.WAIT_FOR_REPLACEMENT, Step.DRAIN)
    assert action.steps.count(Step.CORDON) == 1
    assert action.steps[-1] is Step.DRAIN
    assert action.deadline is None and action.at_deadline is None


def test_rebalance_cordon_only() -> None:
    action = plan_action(
        sqs("rebalance_recommendation.json"), ActionPolicy(rebalance_recommendation="cordon")
    )
    assert action.name is ActionName.CORDON
    assert action.steps == (Step.CORDON,)


def test_rebalance_none_records_only() -> None:
    action = plan_action(
        imds("events/recommendations/rebalance", "rebalance_recommendation.json")[0],
        ActionPolicy(rebalance_recommendation="none"),
    )
    assert action.name is ActionName.NONE and action.steps == ()


def test_rebalance_policy_from_yaml() -> None:
    policy = ActionPolicy.model_validate(yaml.safe_load("rebalanceRecommendation: cordon\n"))
    assert policy.rebalance_recommendation == "cordon"


# --- Auto Scaling lifecycle ---------------------------------------------------------------------


def test_asg_terminate_hook_drains_while_heartbeating_then_completes() -> None:
    event = sqs("asg_terminate_lifecycle.json")
    action = plan_action(event, ActionPolicy(lifecycle_heartbeat_interval="2m"))
    assert action.name is ActionName.DRAIN_AND_COMPLETE_LIFECYCLE
    assert before(action, Step.HEARTBEAT, Step.DRAIN)
    assert action.steps[-1] is Step.COMPLETE_LIFECYCLE
    assert Step.LAUNCH_REPLACEMENT not in action.steps  # the group replaces it itself
    assert action.lifecycle == event.lifecycle
    assert action.heartbeat_interval == 120.0
    assert action.deadline is None


def test_asg_terminate_from_imds_has_no_hook_to_complete() -> None:
    event = parse_imds(
        "autoscaling/target-lifecycle-state", "Terminated", instance_id=INSTANCE, now=0
    )[0]
    action = plan_action(event)
    assert action.name is ActionName.CORDON_AND_DRAIN
    assert Step.DRAIN in action.steps
    assert Step.COMPLETE_LIFECYCLE not in action.steps and Step.HEARTBEAT not in action.steps


def test_asg_launch_hook_is_completed_once_the_node_is_ready() -> None:
    event = sqs("asg_launch_lifecycle.json")
    action = plan_action(event)
    assert action.name is ActionName.COMPLETE_LAUNCH_LIFECYCLE
    assert action.steps == (Step.WAIT_FOR_NODE_READY, Step.COMPLETE_LIFECYCLE)
    assert action.lifecycle == event.lifecycle


def test_asg_test_notification_needs_nothing() -> None:
    action = plan_action(sqs("asg_test_notification.json"))
    assert action.name is ActionName.NONE and action.steps == ()


# --- maintenance canceled or completed ----------------------------------------------------------


def test_canceled_and_completed_maintenance_uncordon() -> None:
    canceled, completed = imds("events/maintenance/scheduled", "maintenance_ended.json")
    for event in (canceled, completed):
        action = plan_action(event)
        assert action.name is ActionName.UNCORDON
        assert action.steps == (Step.UNCORDON,)
        assert action.taint is not None and action.taint.key == DISRUPTED_TAINT_KEY
        assert action.deadline is None
        assert event.state is not None and event.state in action.reason


# --- the policy model and the function ----------------------------------------------------------


def test_every_kind_gets_an_action() -> None:
    for kind in EventKind:
        event = InterruptionEvent(
            id="x",
            kind=kind,
            instance_id=INSTANCE,
            start=0.0,
            deadline=None,
            source="sqs",
            detail="",
            raw_id="r",
        )
        assert isinstance(plan_action(event), Action)


def test_plan_is_pure() -> None:
    event = sqs("spot_interruption.json")
    policy = ActionPolicy()
    assert plan_action(event, policy) == plan_action(event, policy) == plan_action(event)


@pytest.mark.parametrize(
    "config",
    [
        {"rebalanceRecommendation": "drain"},
        {"spotInterruption": "replace-then-drain"},
        {"rebalance": "cordon"},
        {"taintEffect": "NoWay"},
        {"lifecycleHeartbeatInterval": "5s"},
        {"lifecycleHeartbeatInterval": "2h"},
    ],
)
def test_bad_policies_are_refused(config: dict[str, str]) -> None:
    with pytest.raises(ValidationError):
        ActionPolicy.model_validate(config)
