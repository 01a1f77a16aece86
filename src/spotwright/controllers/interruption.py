"""Queue-mode interruption handling.

Workers long-poll the interruption queue, turn each message into normalized events and act
on the node claim of the instance: a spot interruption, a scheduled change or a stopping
instance gets its claim deleted with the notice's deadline (the termination controller
then taints, cordons and drains within it, while the provisioner, seeing the node's pods as
pending, already launches the replacement). The pool that was reclaimed is avoided for a
while. A message is deleted only once its action succeeded; messages about instances this
cluster does not own are released for whoever does; unparseable ones are deleted (they
never will parse) and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict

from spotwright.controllers.context import Context
from spotwright.controllers.termination import DISRUPTED_TAINT
from spotwright.events import (
    EventKind,
    EventParseError,
    InterruptionEvent,
    parse_eventbridge,
)
from spotwright.model.objects import NodeClaim
from spotwright.observability.logs import get_logger
from spotwright.ports.cluster import NotFound
from spotwright.ports.queue import Message, MessageQueue

__all__ = ["InterruptionHandler"]

log = get_logger("interruption")

_DEADLINE_KINDS = {
    EventKind.SPOT_INTERRUPTION,
    EventKind.SCHEDULED_CHANGE,
    EventKind.STATE_CHANGE,
    EventKind.CAPACITY_RESERVATION_INTERRUPTION,
}


class InterruptionHandler:
    def __init__(self, ctx: Context, queue: MessageQueue) -> None:
        self.ctx = ctx
        self.queue = queue
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._waiting: set[asyncio.Task[None]] = set()

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
        for event in events:
            claim = self._claim_for(event.instance_id)
            if claim is None:
                continue
            owned = True
            await self._act(event, claim)
        if owned or not events:
            await self.queue.delete(message)
        else:
            await self.queue.release(message)

    async def _act(self, event: InterruptionEvent, claim: NodeClaim) -> None:
        if event.id in self._seen:
            return
        await self._perform(event, claim)
        # Only once the action succeeded: a message released after a failure acts again.
        self._seen[event.id] = None
        if len(self._seen) > 10_000:
            self._seen.popitem(last=False)

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
