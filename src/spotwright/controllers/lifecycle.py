"""Shared node lifecycle steps: find an instance's node, cordon and drain it, complete a hook.

Queue mode (``InterruptionHandler``), the serverless drainer (``spotwright.serverless``) and
Auto Scaling terminate hooks all need the same few steps on a node that may have no node
claim at all (an ASG-managed node group): find it by claim, providerID or private DNS name;
taint, cordon and label it out of load balancers with PATCHes; drain it within its
PodDisruptionBudgets; and, for a lifecycle hook, heartbeat while draining and complete the
action with CONTINUE, or ABANDON when the drain failed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from spotwright.controllers.context import Context
from spotwright.controllers.termination import DISRUPTED_TAINT, EXCLUDE_LB_LABEL, Terminator
from spotwright.events.actions import Action, ActionPolicy, Step
from spotwright.model import labels as wk
from spotwright.observability.logs import get_logger
from spotwright.ports.autoscaling import AutoScaling, LifecycleActionGone, LifecycleResult
from spotwright.ports.clock import Clock
from spotwright.ports.cloud import CloudError
from spotwright.ports.cluster import NotFound

__all__ = [
    "EXCLUDE_LB_LABEL",
    "DrainTimedOut",
    "LifecycleOutcome",
    "bounded",
    "cordon_and_drain",
    "drain_and_complete",
    "find_node",
]

T = TypeVar("T")

log = get_logger("lifecycle")


class DrainTimedOut(Exception):
    """The drain did not finish within the time it was given."""


@dataclass(frozen=True, slots=True)
class LifecycleOutcome:
    """How a terminate hook was handled.

    ``result`` is what CompleteLifecycleAction was called with (``None``: not called, for
    want of an AutoScaling port); ``already_over`` says Auto Scaling answered that the
    action was no longer pending. ``drained`` is False when the node went away first, and
    ``None`` when there was no node to drain. ``error`` explains an ABANDON.
    """

    result: LifecycleResult | None
    drained: bool | None
    heartbeats: int
    already_over: bool = False
    error: str | None = None


async def find_node(ctx: Context, instance_id: str) -> str | None:
    """The name of the node running ``instance_id``, or None if no node of ours does.

    Looked up by node claim, then by the Node's providerID, then (for nodes registered
    without one) by the instance's private DNS name, which EKS uses as node name and as
    ``kubernetes.io/hostname`` (in full or up to the first dot).
    """
    suffix = "/" + instance_id
    cluster = ctx.cluster
    for claim in cluster.node_claims():
        if claim.provider_id.endswith(suffix) and claim.node_name:
            return claim.node_name
    for node in cluster.nodes():
        if node.provider_id.endswith(suffix):
            return node.name
    described = await ctx.cloud.describe([instance_id])
    dns = described[0].private_dns if described else ""
    if not dns:
        return None
    names = {dns, dns.split(".", 1)[0]}
    for node in cluster.nodes():
        if node.name == dns or node.labels.get(wk.HOSTNAME) in names:
            return node.name
    return None


async def cordon_and_drain(
    ctx: Context, node_name: str, action: Action, *, deadline: float | None = None
) -> bool:
    """Taint, cordon and label the node as ``action`` lists, then drain it if it says so.

    All of that is one PATCH. The drain evicts within PodDisruptionBudgets and, with a
    ``deadline``, deletes what is left at it when ``ctx.settings.force_at_deadline``.
    True when the node was emptied (or needed no drain); False when it went away first.
    """
    cluster = ctx.cluster
    taint = (action.taint or DISRUPTED_TAINT) if action.has(Step.TAINT) else None
    cordon = action.has(Step.CORDON)
    exclude = action.has(Step.EXCLUDE_FROM_LOAD_BALANCERS)
    try:
        if taint is not None or cordon or exclude:
            await cluster.patch_node(
                node_name,
                add_taints=[taint] if taint is not None else (),
                unschedulable=True if cordon else None,
                labels={EXCLUDE_LB_LABEL: "spotwright"} if exclude else None,
            )
        if taint is not None:
            log.info("tainted node", node=node_name, taint=str(taint))
        if cordon or exclude:
            log.info("cordoned node", node=node_name, reason=action.reason)
            ctx.metrics.actions.labels("cordon").inc()
            await cluster.record_event("Node", node_name, "Cordoned", f"Cordoned: {action.reason}")
    except NotFound:
        log.info("node is gone, nothing to drain", node=node_name)
        return False
    if not action.has(Step.DRAIN):
        return True
    started = ctx.clock.now()
    drained = await Terminator(ctx).drain(node_name, deadline)
    took = ctx.clock.now() - started
    ctx.metrics.drain_duration.observe(took)
    ctx.metrics.drains.labels("before_deadline" if drained else "deadline_exceeded").inc()
    if drained:
        log.info("drained node", node=node_name, duration=f"{took:.1f}s")
        await cluster.record_event("Node", node_name, "Drained", f"Drained in {took:.0f}s")
    else:
        log.warning("node went away before it was drained", node=node_name)
    return drained


async def drain_and_complete(
    ctx: Context,
    autoscaling: AutoScaling | None,
    action: Action,
    node_name: str | None,
    *,
    limit: float | None = None,
) -> LifecycleOutcome:
    """Cordon and drain ``node_name`` with heartbeats, then complete the lifecycle action.

    Heartbeats go out every ``action.heartbeat_interval`` seconds while the drain runs.
    CONTINUE follows a drain that finished (or a node that went away, or no node at all);
    ABANDON follows a drain that failed or outlasted ``limit`` seconds. An action that Auto
    Scaling says is over already counts as completed. A failure to complete is raised,
    so that the caller retries.
    """
    hook = action.lifecycle
    if hook is None:
        raise ValueError(f"action {action.name} for {action.instance_id} has no lifecycle hook")
    where = {"asg": hook.asg_name, "hook": hook.hook_name, "instance_id": action.instance_id}
    beats: list[float] = []
    keeper: asyncio.Task[None] | None = None
    if autoscaling is not None:
        interval = action.heartbeat_interval or ActionPolicy().lifecycle_heartbeat_interval
        keeper = asyncio.create_task(_keep_alive(ctx.clock, autoscaling, action, interval, beats))
    drained: bool | None = None
    error: str | None = None
    try:
        if node_name is not None:
            drained = await bounded(
                ctx.clock, limit, cordon_and_drain(ctx, node_name, action, deadline=None)
            )
    except Exception as exc:  # any failure of the drain is an ABANDON, never a crash
        error = f"{type(exc).__name__}: {exc}"
        ctx.metrics.interruption_errors.labels(type(exc).__name__).inc()
        log.error("drain for lifecycle hook failed", node=node_name, error=error, **where)
    finally:
        if keeper is not None:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
    result: LifecycleResult = "CONTINUE" if error is None else "ABANDON"
    if autoscaling is None:
        log.warning(
            "no Auto Scaling client: the hook is left to time out to its default result",
            node=node_name,
            **where,
        )
        return LifecycleOutcome(None, drained, len(beats), error=error)
    already_over = False
    try:
        await autoscaling.complete(hook, result)
    except LifecycleActionGone as exc:
        already_over = True
        log.info("lifecycle action was already over", detail=exc.message, **where)
    else:
        log.info("completed lifecycle action", result=result, node=node_name, **where)
    ctx.metrics.actions.labels(f"complete-lifecycle-{result.lower()}").inc()
    if node_name is not None:
        await ctx.cluster.record_event(
            "Node",
            node_name,
            "LifecycleActionCompleted",
            f"Completed lifecycle hook {hook.hook_name} of {hook.asg_name}: {result}"
            + (" (it was already over)" if already_over else ""),
            warning=result == "ABANDON",
        )
    return LifecycleOutcome(result, drained, len(beats), already_over, error)


async def _keep_alive(
    clock: Clock, autoscaling: AutoScaling, action: Action, interval: float, sent: list[float]
) -> None:
    """RecordLifecycleActionHeartbeat every ``interval`` seconds until cancelled."""
    hook = action.lifecycle
    assert hook is not None
    while True:
        await clock.sleep(interval)
        try:
            await autoscaling.heartbeat(hook)
        except LifecycleActionGone as exc:
            log.warning(
                "lifecycle action no longer pending, stopping heartbeats",
                detail=exc.message,
                instance_id=action.instance_id,
            )
            return
        except CloudError as exc:
            log.warning(
                "lifecycle heartbeat failed, trying again at the next interval",
                error=str(exc),
                instance_id=action.instance_id,
            )
            continue
        sent.append(clock.now())
        log.debug(
            "sent lifecycle heartbeat",
            asg=hook.asg_name,
            hook=hook.hook_name,
            instance_id=action.instance_id,
            count=len(sent),
        )


async def bounded(clock: Clock, limit: float | None, work: Awaitable[T]) -> T:
    """``work``'s result, or DrainTimedOut once ``limit`` seconds of ``clock`` have passed."""
    if limit is None:
        return await work
    task = asyncio.ensure_future(work)
    timer = asyncio.ensure_future(clock.sleep(max(0.0, limit)))
    try:
        await asyncio.wait({task, timer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        raise DrainTimedOut(f"not finished within {limit:.0f}s")
    return task.result()
