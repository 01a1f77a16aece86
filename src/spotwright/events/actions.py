"""What to do about each kind of interruption signal: the action policy, as a pure function.

The handler in every mode (queue, IMDS, serverless) and ``spotwright events decode`` ask the
same question of an event, "what would you do?", and get the same answer from
``plan_action(event, policy)``: a named action and its ordered steps, with the drain's
deadline and the lifecycle hook to keep alive and complete. Executing the steps (PATCHing
taints, evicting, calling Auto Scaling) is the controllers' job; deciding them is not, so
the decision can be printed, tested and configured without a cluster.

Defaults follow the issue: anything with a deadline (spot interruption, scheduled change,
an instance stopping or terminating, a capacity reservation reclaimed) is tainted, cordoned,
taken out of load balancers, replaced at once and drained by its deadline; a rebalance
recommendation launches the replacement first and drains once it is ready; an ASG
terminate hook is drained while heartbeats keep it open, then completed; a scheduled
maintenance that was canceled or completed puts the node back in service.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Literal, assert_never

from pydantic import Field

from spotwright.events.model import EventKind, InterruptionEvent, LifecycleHook
from spotwright.model import labels as wk
from spotwright.model.durations import Duration
from spotwright.model.fields import ConfigModel
from spotwright.model.objects import Effect, Taint

__all__ = [
    "LIFECYCLE_RESULT_FAILURE",
    "LIFECYCLE_RESULT_SUCCESS",
    "Action",
    "ActionName",
    "ActionPolicy",
    "DeadlineChoice",
    "RebalanceChoice",
    "Step",
    "plan_action",
]

#: What CompleteLifecycleAction is called with once the steps succeeded, or failed.
LIFECYCLE_RESULT_SUCCESS = "CONTINUE"
LIFECYCLE_RESULT_FAILURE = "ABANDON"

#: What may be done about a signal that comes with a deadline.
DeadlineChoice = Literal["cordon-and-drain", "cordon", "none"]
#: What may be done about a rebalance recommendation.
RebalanceChoice = Literal["replace-then-drain", "cordon", "none"]


class ActionName(StrEnum):
    """The action as a whole, as logs, metrics and ``events decode`` name it."""

    NONE = "none"
    CORDON = "cordon"
    CORDON_AND_DRAIN = "cordon-and-drain"
    REPLACE_THEN_DRAIN = "replace-then-drain"
    DRAIN_AND_COMPLETE_LIFECYCLE = "drain-and-complete-lifecycle"
    COMPLETE_LAUNCH_LIFECYCLE = "complete-launch-lifecycle"
    UNCORDON = "uncordon"


class Step(StrEnum):
    """One thing to do to the node or the cloud, in the order the action lists them."""

    #: PATCH the disruption taint onto the node (never a full-object update).
    TAINT = "taint"
    #: Mark the node unschedulable.
    CORDON = "cordon"
    #: Label the node out of external load balancers before its pods go.
    EXCLUDE_FROM_LOAD_BALANCERS = "exclude-from-load-balancers"
    #: Count the node's pods as pending now, so their replacement capacity starts booting.
    LAUNCH_REPLACEMENT = "launch-replacement"
    #: Hold the following steps until the replacement capacity is ready.
    WAIT_FOR_REPLACEMENT = "wait-for-replacement"
    #: Keep the lifecycle hook alive (RecordLifecycleActionHeartbeat) while what follows runs.
    HEARTBEAT = "heartbeat"
    #: Evict the node's pods in tiers, within PodDisruptionBudgets, by the deadline if any.
    DRAIN = "drain"
    #: Wait until the node is Ready (launch hooks).
    WAIT_FOR_NODE_READY = "wait-for-node-ready"
    #: CompleteLifecycleAction: CONTINUE after success, ABANDON after failure.
    COMPLETE_LIFECYCLE = "complete-lifecycle"
    #: Undo taint, cordon and load-balancer label, unless another event still holds the node.
    UNCORDON = "uncordon"


class ActionPolicy(ConfigModel):
    """Which action each kind of signal gets; every field has the recommended default.

    Keys are camelCase in YAML (``rebalanceRecommendation: cordon``) and snake_case in
    Python. A kind without a field here has a fixed action (see ``plan_action``).
    """

    spot_interruption: DeadlineChoice = "cordon-and-drain"
    scheduled_change: DeadlineChoice = "cordon-and-drain"
    state_change: DeadlineChoice = "cordon-and-drain"
    capacity_reservation_interruption: DeadlineChoice = "cordon-and-drain"
    rebalance_recommendation: RebalanceChoice = "replace-then-drain"
    #: Effect of the disruption taint.
    taint_effect: Effect = "NoSchedule"
    #: Label drained nodes ``node.kubernetes.io/exclude-from-external-load-balancers``.
    exclude_from_load_balancers: bool = True
    #: At a drain deadline, force-delete the pods left (``force``) or leave them to the
    #: instance's end (``leave``). Forcing is the default: the instance goes anyway.
    at_deadline: Literal["force", "leave"] = "force"
    #: How often to heartbeat an ASG lifecycle hook while draining (AWS allows 30 s to 1 h).
    lifecycle_heartbeat_interval: Annotated[Duration, Field(ge=30.0, le=3600.0)] = 60.0


@dataclass(frozen=True, slots=True)
class Action:
    """What the handler would do about one event.

    ``deadline`` bounds the drain (epoch seconds; ``None``: no bound, PodDisruptionBudgets
    alone pace it) and ``at_deadline`` says what happens to pods left then. ``taint`` is
    the taint the action puts on the node, or for ``uncordon`` the one it removes.
    ``lifecycle`` is the hook to heartbeat and complete. ``reason`` is one sentence for
    logs and Kubernetes Events.
    """

    name: ActionName
    steps: tuple[Step, ...]
    event_id: str
    instance_id: str
    node: str | None
    reason: str
    deadline: float | None = None
    at_deadline: Literal["force", "leave"] | None = None
    taint: Taint | None = None
    lifecycle: LifecycleHook | None = None
    heartbeat_interval: float | None = None

    def has(self, step: Step) -> bool:
        return step in self.steps


def plan_action(event: InterruptionEvent, policy: ActionPolicy | None = None) -> Action:
    """The action ``policy`` (default: ``ActionPolicy()``) gives ``event``. Pure."""
    policy = policy or ActionPolicy()
    kind = event.kind
    match kind:
        case EventKind.SPOT_INTERRUPTION:
            return _deadline_action(event, policy, policy.spot_interruption)
        case EventKind.SCHEDULED_CHANGE:
            return _deadline_action(event, policy, policy.scheduled_change)
        case EventKind.STATE_CHANGE:
            return _deadline_action(event, policy, policy.state_change)
        case EventKind.CAPACITY_RESERVATION_INTERRUPTION:
            return _deadline_action(event, policy, policy.capacity_reservation_interruption)
        case EventKind.REBALANCE_RECOMMENDATION:
            return _rebalance_action(event, policy)
        case EventKind.ASG_LIFECYCLE_TERMINATE:
            return _terminate_hook_action(event, policy)
        case EventKind.ASG_LIFECYCLE_LAUNCH:
            if event.lifecycle is None:
                return _action(event, ActionName.NONE, (), "launch hook without a token")
            return _action(
                event,
                ActionName.COMPLETE_LAUNCH_LIFECYCLE,
                (Step.WAIT_FOR_NODE_READY, Step.COMPLETE_LIFECYCLE),
                "instance launching behind a lifecycle hook: complete it once the node is Ready",
                lifecycle=event.lifecycle,
            )
        case EventKind.ASG_TEST_NOTIFICATION:
            return _action(
                event, ActionName.NONE, (), "Auto Scaling test notification: nothing to do"
            )
        case EventKind.SCHEDULED_CHANGE_CANCELED | EventKind.SCHEDULED_CHANGE_COMPLETED:
            return _action(
                event,
                ActionName.UNCORDON,
                (Step.UNCORDON,),
                f"scheduled maintenance {event.state or 'ended'}: put the node back in service",
                taint=_taint(policy),
            )
        case _:
            assert_never(kind)


def _deadline_action(
    event: InterruptionEvent, policy: ActionPolicy, choice: DeadlineChoice
) -> Action:
    what = event.kind.value.replace("_", " ")
    if choice == "none":
        return _action(event, ActionName.NONE, (), f"{what}: configured to do nothing")
    if choice == "cordon":
        return _action(event, ActionName.CORDON, (Step.CORDON,), f"{what}: configured to cordon")
    # No stated deadline means the instance may already be going: act as if it had passed.
    deadline = event.deadline if event.deadline is not None else event.start
    return _action(
        event,
        ActionName.CORDON_AND_DRAIN,
        _drain_steps(policy, before_drain=(Step.LAUNCH_REPLACEMENT,)),
        f"{what}: replace and drain before the instance goes",
        deadline=deadline,
        at_deadline=policy.at_deadline,
        taint=_taint(policy),
    )


def _rebalance_action(event: InterruptionEvent, policy: ActionPolicy) -> Action:
    choice = policy.rebalance_recommendation
    if choice == "none":
        return _action(event, ActionName.NONE, (), "rebalance recommendation: record only")
    if choice == "cordon":
        return _action(
            event,
            ActionName.CORDON,
            (Step.CORDON,),
            "rebalance recommendation: cordon, no new pods on an instance at risk",
        )
    # Cordon at once (no new pods on an instance at risk), but move the running pods only
    # once their new home is ready: no deadline, the PDBs pace the drain.
    return _action(
        event,
        ActionName.REPLACE_THEN_DRAIN,
        _drain_steps(
            policy, first=(Step.CORDON, Step.LAUNCH_REPLACEMENT, Step.WAIT_FOR_REPLACEMENT)
        ),
        "rebalance recommendation: launch the replacement, drain once it is ready",
        taint=_taint(policy),
    )


def _terminate_hook_action(event: InterruptionEvent, policy: ActionPolicy) -> Action:
    if event.lifecycle is None:
        # Read from the instance metadata (target lifecycle state): the group waits for no
        # hook we could complete, so this is a plain drain with no deadline of ours.
        return _action(
            event,
            ActionName.CORDON_AND_DRAIN,
            _drain_steps(policy),
            "Auto Scaling group terminating the instance: drain",
            taint=_taint(policy),
        )
    steps = _drain_steps(policy)
    drain_at = steps.index(Step.DRAIN)
    return _action(
        event,
        ActionName.DRAIN_AND_COMPLETE_LIFECYCLE,
        (*steps[:drain_at], Step.HEARTBEAT, *steps[drain_at:], Step.COMPLETE_LIFECYCLE),
        f"Auto Scaling group {event.lifecycle.asg_name} terminating the instance: drain "
        f"while heartbeating hook {event.lifecycle.hook_name}, then complete it",
        taint=_taint(policy),
        lifecycle=event.lifecycle,
        heartbeat_interval=policy.lifecycle_heartbeat_interval,
    )


def _drain_steps(
    policy: ActionPolicy, *, first: tuple[Step, ...] = (), before_drain: tuple[Step, ...] = ()
) -> tuple[Step, ...]:
    """``first``, then taint, cordon, load-balancer label, ``before_drain``, drain."""
    steps = [*first, Step.TAINT, Step.CORDON]
    if policy.exclude_from_load_balancers:
        steps.append(Step.EXCLUDE_FROM_LOAD_BALANCERS)
    steps.extend(before_drain)
    steps.append(Step.DRAIN)
    return tuple(dict.fromkeys(steps))  # each step once, where it first appears


def _taint(policy: ActionPolicy) -> Taint:
    return Taint(wk.DISRUPTED_TAINT_KEY, policy.taint_effect)


def _action(
    event: InterruptionEvent,
    name: ActionName,
    steps: tuple[Step, ...],
    reason: str,
    *,
    deadline: float | None = None,
    at_deadline: Literal["force", "leave"] | None = None,
    taint: Taint | None = None,
    lifecycle: LifecycleHook | None = None,
    heartbeat_interval: float | None = None,
) -> Action:
    return Action(
        name=name,
        steps=steps,
        event_id=event.id,
        instance_id=event.instance_id,
        node=event.node,
        reason=reason,
        deadline=deadline,
        at_deadline=at_deadline,
        taint=taint,
        lifecycle=lifecycle,
        heartbeat_interval=heartbeat_interval,
    )
