"""Queue-mode interruption handling.

Workers long-poll the interruption queue, turn each message into normalized events and act
on the node claim of the instance: a spot interruption, a scheduled change or a stopping
instance gets its claim deleted with the notice's deadline (the termination controller
then taints, cordons and drains within it, while the provisioner, seeing the node's pods as
pending, already launches the replacement). The pool that was reclaimed is avoided for a
while. A message is deleted only once its action succeeded; messages about instances this
cluster does not own are released for whoever does; unparseable ones are deleted (they
never will parse) and counted.

Auto Scaling terminate hooks (``drain_and_complete``) concern nodes that may have no claim
at all (an ASG-managed node group), so their node is looked up by the claim first, then by
providerID, then by the instance's private DNS name (``find_node``). It is tainted, cordoned
and drained while a heartbeat keeps the hook open every policy interval; the lifecycle
action is then completed with CONTINUE, or ABANDON if the drain failed, and only then is
the message deleted. A copy of the message received while the first is being handled is
kept in flight and deleted with it. The group's test notification is deleted and logged.
The serverless drainer (``spotwright.serverless``) uses the same functions.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Literal, TypeVar

from spotwright.controllers.context import Context
from spotwright.controllers.termination import DISRUPTED_TAINT, Terminator
from spotwright.events import (
    EventKind,
    EventParseError,
    InterruptionEvent,
    parse_eventbridge,
)
from spotwright.events.actions import Action, ActionPolicy, Step, plan_action
from spotwright.model import labels as wk
from spotwright.model.objects import NodeClaim
from spotwright.observability.logs import get_logger
from spotwright.ports.autoscaling import AutoScaling, LifecycleActionGone, LifecycleResult
from spotwright.ports.clock import Clock
from spotwright.ports.cloud import CloudError
from spotwright.ports.cluster import NotFound
from spotwright.ports.queue import Message, MessageQueue

__all__ = [
    "EXCLUDE_LB_LABEL",
    "DrainTimedOut",
    "InterruptionHandler",
    "LifecycleOutcome",
    "bounded",
    "cordon_and_drain",
    "drain_and_complete",
    "find_node",
]

T = TypeVar("T")

log = get_logger("interruption")

_DEADLINE_KINDS = {
    EventKind.SPOT_INTERRUPTION,
    EventKind.SCHEDULED_CHANGE,
    EventKind.STATE_CHANGE,
    EventKind.CAPACITY_RESERVATION_INTERRUPTION,
}


#: The label that takes a node out of external load balancers before its pods go.
EXCLUDE_LB_LABEL = "node.kubernetes.io/exclude-from-external-load-balancers"

_HookVerdict = Literal["done", "not-ours", "in-progress"]


class InterruptionHandler:
    def __init__(
        self,
        ctx: Context,
        queue: MessageQueue,
        autoscaling: AutoScaling | None = None,
        *,
        policy: ActionPolicy | None = None,
    ) -> None:
        self.ctx = ctx
        self.queue = queue
        #: Completes Auto Scaling lifecycle actions; without it, terminate hooks are drained
        #: and left to time out to their default result.
        self.autoscaling = autoscaling
        self.policy = policy or ActionPolicy()
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._waiting: set[asyncio.Task[None]] = set()
        #: Lifecycle actions being handled, with the copies of their message received since.
        self._in_progress: dict[str, list[Message]] = {}

    async def run(self) -> None:
        workers = [
            asyncio.create_task(self._worker())
            for _ in range(max(1, self.ctx.settings.interruption_workers))
        ]
        try:
            await asyncio.gather(*workers)
        finally:
            for worker in workers:
                worker.cancel()

    async def _worker(self) -> None:
        while True:
            messages = await self.queue.receive(max_messages=10, wait_seconds=20.0)
            for message in messages:
                try:
                    await self.handle(message)
                except Exception as exc:  # one bad message must never stop the loop
                    self.ctx.metrics.interruption_errors.labels(type(exc).__name__).inc()
                    log.error(
                        "failed to handle message, releasing it for a retry",
                        message_id=message.id,
                        error=f"{type(exc).__name__}: {exc}",
                    )
                    await self.queue.release(message)

    async def handle(self, message: Message) -> None:
        ctx = self.ctx
        try:
            events = parse_eventbridge(message.body)
        except EventParseError as exc:
            ctx.metrics.interruption_errors.labels(type(exc).__name__).inc()
            log.warning(
                "dropping message that cannot be parsed", message_id=message.id, error=str(exc)
            )
            await self.queue.delete(message)
            return
        owned = False
        kept = False
        for event in events:
            if event.kind is EventKind.ASG_TEST_NOTIFICATION:
                log.info(
                    "deleting Auto Scaling test notification",
                    message_id=message.id,
                    detail=event.detail,
                )
                owned = True
                continue
            if event.kind is EventKind.ASG_LIFECYCLE_TERMINATE and event.lifecycle is not None:
                verdict = await self._terminate_hook(event, message)
                owned = owned or verdict == "done"
                kept = kept or verdict == "in-progress"
                continue
            claim = self._claim_for(event.instance_id)
            if claim is None:
                continue
            owned = True
            await self._act(event, claim)
        if kept:
            return  # deleted together with the copy being handled (see _terminate_hook)
        if owned or not events:
            await self.queue.delete(message)
        else:
            await self.queue.release(message)

    async def _act(self, event: InterruptionEvent, claim: NodeClaim) -> None:
        if event.id in self._seen:
            return
        await self._perform(event, claim)
        # Only once the action succeeded: a message released after a failure acts again.
        self._remember(event.id)

    def _remember(self, event_id: str) -> None:
        self._seen[event_id] = None
        if len(self._seen) > 10_000:
            self._seen.popitem(last=False)

    async def _terminate_hook(self, event: InterruptionEvent, message: Message) -> _HookVerdict:
        """Drain the node of a terminating ASG instance, then complete its lifecycle action.

        ``done``: the message can go; ``not-ours``: no node of this cluster runs the
        instance (release it for its owner); ``in-progress``: another copy of the message
        is being handled, and this one is deleted along with it.
        """
        ctx = self.ctx
        if event.id in self._seen:
            return "done"
        copies = self._in_progress.get(event.id)
        if copies is not None:
            copies.append(message)
            log.info(
                "lifecycle action already being handled, keeping this copy until it completes",
                message_id=message.id,
                instance_id=event.instance_id,
            )
            return "in-progress"
        claim = self._claim_for(event.instance_id)
        if claim is not None:
            node: str | None = claim.node_name or await find_node(ctx, event.instance_id)
        else:
            node = await find_node(ctx, event.instance_id)
            if node is None:
                log.info(
                    "no node of this cluster runs the instance, releasing the message",
                    instance_id=event.instance_id,
                    message_id=message.id,
                )
                return "not-ours"
        self._in_progress[event.id] = []
        try:
            ctx.metrics.interruption_messages.labels(event.kind.value).inc()
            action = plan_action(event, self.policy)
            log.info(
                "lifecycle hook received",
                kind=event.kind.value,
                instance_id=event.instance_id,
                node=node or "<none>",
                reason=action.reason,
            )
            await drain_and_complete(ctx, self.autoscaling, action, node)
        except BaseException:
            # The action is retried from the released message: its copies come back too.
            for copy in self._in_progress.pop(event.id, []):
                with contextlib.suppress(Exception):
                    await self.queue.release(copy)
            raise
        self._remember(event.id)
        for copy in self._in_progress.pop(event.id, []):
            await self.queue.delete(copy)
        return "done"

    async def _perform(self, event: InterruptionEvent, claim: NodeClaim) -> None:
        ctx = self.ctx
        ctx.metrics.interruption_messages.labels(event.kind.value).inc()
        now = ctx.clock.now()
        fields = {
            "kind": event.kind.value,
            "instance_id": event.instance_id,
            "nodeclaim": claim.name,
            "node": claim.node_name or "<none>",
        }
        if event.kind is EventKind.REBALANCE_RECOMMENDATION:
            log.info(
                "rebalance recommendation received", action=ctx.settings.rebalance_action, **fields
            )
            await self._rebalance(claim)
            return
        if event.kind not in _DEADLINE_KINDS:
            log.info("ignoring event", **fields)
            return
        if event.kind is EventKind.SPOT_INTERRUPTION and claim.instance_type:
            ctx.unavailable.mark_offering("spot", claim.instance_type, claim.zone, now)
        deadline = event.deadline if event.deadline is not None else now
        left = deadline - now
        log.info("interruption received", deadline_in=f"{left:.0f}s", **fields)
        if claim.node_name:
            await ctx.cluster.record_event(
                "Node",
                claim.node_name,
                "InstanceInterrupted",
                f"{event.kind.value}: {event.detail}",
                warning=True,
            )
        await self._delete_claim(claim, event.kind.value, deadline)
        ctx.metrics.actions.labels("drain").inc()

    async def _rebalance(self, claim: NodeClaim) -> None:
        ctx = self.ctx
        action = ctx.settings.rebalance_action
        if action == "none":
            return
        if action == "cordon":
            if claim.node_name:
                # The Node may be gone already (deleted, or its instance just ended):
                # nothing left to cordon, and no reason to stop handling messages.
                with contextlib.suppress(NotFound):
                    await ctx.cluster.patch_node(claim.node_name, unschedulable=True)
            ctx.metrics.actions.labels("cordon").inc()
            return
        ctx.metrics.actions.labels("replace-then-drain").inc()
        if claim.node_name:
            # The taint makes the provisioner count the node's pods as pending now, so the
            # replacement boots while they keep serving; the drain waits for it.
            with contextlib.suppress(NotFound):
                await ctx.cluster.patch_node(claim.node_name, add_taints=[DISRUPTED_TAINT])
            log.info("tainted node, replacement first", node=claim.node_name, nodeclaim=claim.name)
        task = asyncio.create_task(self._drain_when_replaced(claim.name, ctx.clock.now()))
        self._waiting.add(task)
        task.add_done_callback(self._waiting.discard)

    async def _drain_when_replaced(self, claim_name: str, since: float) -> None:
        """Drain once every claim launched since the recommendation is initialized.

        A batch window is let pass first so that the provisioner has ordered the
        replacement; an interruption notice meanwhile deletes the claim with its deadline,
        which ends this wait.
        """
        ctx = self.ctx
        settings = ctx.settings
        give_up = since + settings.replacement_wait_seconds
        await ctx.clock.sleep(settings.batch_max_seconds + settings.batch_idle_seconds)
        while ctx.clock.now() < give_up:
            claim = ctx.cluster.node_claim(claim_name)
            if claim is None or claim.deleting_since is not None:
                return
            booting = [
                c
                for c in ctx.cluster.node_claims()
                if c.created_at >= since and c.deleting_since is None and c.initialized_at is None
            ]
            if not booting:
                break
            await ctx.clock.sleep(1.0)
        claim = ctx.cluster.node_claim(claim_name)
        if claim is None:
            return
        log.info(
            "replacement ready, draining",
            nodeclaim=claim_name,
            waited=f"{ctx.clock.now() - since:.0f}s",
        )
        await self._delete_claim(claim, EventKind.REBALANCE_RECOMMENDATION.value, None)

    async def _delete_claim(self, claim: NodeClaim, reason: str, deadline: float | None) -> None:
        ctx = self.ctx
        current = ctx.cluster.node_claim(claim.name)
        if current is None:
            return
        if current.deleting_since is not None:
            if deadline is not None and (
                current.drain_deadline is None or deadline < current.drain_deadline
            ):
                current.drain_deadline = deadline
                await ctx.cluster.update_node_claim(current)
            return
        current.deleting_since = ctx.clock.now()
        current.drain_deadline = deadline
        current.deletion_reason = reason
        await ctx.cluster.update_node_claim(current)

    def _claim_for(self, instance_id: str) -> NodeClaim | None:
        suffix = "/" + instance_id
        for claim in self.ctx.cluster.node_claims():
            if claim.provider_id.endswith(suffix):
                return claim
        return None


# ---------------------------------------------------------------------------------------
# Shared with the serverless drainer: find the node, cordon and drain it, complete the hook.


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

    Each is one PATCH. The drain evicts within PodDisruptionBudgets and, with a
    ``deadline``, deletes what is left at it when ``ctx.settings.force_at_deadline``.
    True when the node was emptied (or needed no drain); False when it went away first.
    """
    cluster = ctx.cluster
    try:
        if action.has(Step.TAINT):
            taint = action.taint or DISRUPTED_TAINT
            await cluster.patch_node(node_name, add_taints=[taint])
            log.info("tainted node", node=node_name, taint=str(taint))
        cordon = action.has(Step.CORDON)
        exclude = action.has(Step.EXCLUDE_FROM_LOAD_BALANCERS)
        if cordon or exclude:
            await cluster.patch_node(
                node_name,
                unschedulable=True if cordon else None,
                labels={EXCLUDE_LB_LABEL: "spotwright"} if exclude else None,
            )
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
