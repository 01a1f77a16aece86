"""Queue-mode interruption handling.

Workers long-poll the interruption queue and hand each message to a task of its own (at
most ``interruption_concurrency`` at once; a worker polls again as soon as its batch is
handed out), so a thousand notices arriving together are all acted on within seconds.

A spot interruption, a scheduled change or a stopping instance gets its node tainted,
cordoned and labelled out of load balancers with one PATCH at once, then its node claim
deleted with the notice's deadline: the termination controller drains within it, while
the provisioner, seeing the node's pods as pending, already launches the replacement. The
pool that was reclaimed is avoided for a while.

A message stays in flight until its action is over (the claim gone: node drained,
instance terminated; see ``MessageKeeper``), so after a crash it comes back and finds the
claim already deleting, or gone. Handling is idempotent: a second copy, or a copy after a
restart, acts only where something is left to do and then waits with the first. A message
about an instance this cluster ran but whose claim is gone already is deleted; messages
about instances this cluster does not own are released for whoever does; unparseable ones
are deleted (they never will parse) and counted.

Auto Scaling terminate hooks are drained and completed (``controllers.lifecycle``) while
their message, and any copy received meanwhile, is kept in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from typing import Literal

from spotwright.controllers.context import Context
from spotwright.controllers.inflight import MessageKeeper
from spotwright.controllers.lifecycle import drain_and_complete, find_node
from spotwright.controllers.ownership import InstanceIndex
from spotwright.controllers.termination import DISRUPTED_TAINT, mark_disrupted
from spotwright.events import EventKind, EventParseError, InterruptionEvent, parse_eventbridge
from spotwright.events.actions import ActionPolicy, plan_action
from spotwright.model.objects import NodeClaim
from spotwright.observability.logs import get_logger
from spotwright.ports.autoscaling import AutoScaling
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

_HookVerdict = Literal["done", "not-ours", "in-progress"]
#: Seconds after its receipt that a message's visibility is first extended.
_FIRST_EXTENSION = 10.0


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
        self.keeper = MessageKeeper(
            queue, ctx.clock, ctx.metrics, visibility=ctx.settings.message_visibility_seconds
        )
        self._slots = asyncio.Semaphore(max(1, ctx.settings.interruption_concurrency))
        self._tasks: set[asyncio.Task[None]] = set()
        self._seen: OrderedDict[str, None] = OrderedDict()
        #: Actions under way, by event id: a second copy waits for the first's.
        self._acting: dict[str, asyncio.Task[None]] = {}
        self._waiting: set[asyncio.Task[None]] = set()
        #: Lifecycle actions being handled, with the copies of their message received since.
        self._in_progress: dict[str, list[Message]] = {}
        self.instances = InstanceIndex(ctx)

    async def run(self) -> None:
        for claim in self.ctx.cluster.node_claims():
            self.instances.note(claim)
        tasks = [asyncio.create_task(self._follow_claims())]
        tasks += [
            asyncio.create_task(self._worker())
            for _ in range(max(1, self.ctx.settings.interruption_workers))
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in [*tasks, *self._tasks, *self._acting.values(), *self._waiting]:
                task.cancel()
            await self.keeper.close()

    async def _follow_claims(self) -> None:
        """Remember each claim's instance, to recognise messages that arrive after it."""
        async for event in self.ctx.cluster.watch("nodeclaim"):
            if event.type != "DELETED":
                claim = self.ctx.cluster.node_claim(event.name)
                if claim is not None:
                    self.instances.note(claim)

    async def _worker(self) -> None:
        while True:
            messages = await self.queue.receive(max_messages=10, wait_seconds=20.0)
            received = self.ctx.clock.now()
            for message in messages:
                await self._slots.acquire()
                task = asyncio.create_task(self._handle_one(message, received))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _handle_one(self, message: Message, received: float) -> None:
        """Handle one message in its own task; its slot is freed once the urgent part is
        done (a lifecycle hook's drain runs without one)."""
        freed = False

        def free() -> None:
            nonlocal freed
            if not freed:
                freed = True
                self._slots.release()

        try:
            await self.handle(message, received_at=received, started=free)
        except Exception as exc:  # one bad message must never stop the others
            self.ctx.metrics.interruption_errors.labels(type(exc).__name__).inc()
            log.error(
                "failed to handle message, releasing it for a retry",
                message_id=message.id,
                error=f"{type(exc).__name__}: {exc}",
            )
            self.keeper.let_go(message)
            with contextlib.suppress(Exception):
                await self.queue.release(message)
        finally:
            free()

    async def handle(
        self,
        message: Message,
        *,
        received_at: float | None = None,
        started: Callable[[], None] | None = None,
    ) -> None:
        """Act on one message; it is deleted once its action is over.

        It is kept in flight from its receipt (its visibility extended from 10 s on, well
        within SQS's default 30 s), so a slow start never lets it reappear meanwhile.
        ``started`` is called once what is urgent is done, before waiting on a long drain.
        """
        self.keeper.hold(message, first_in=_FIRST_EXTENSION)
        try:
            await self._handle(message, received_at, started)
        except BaseException:
            self.keeper.let_go(message)
            raise

    async def _finish(self, message: Message, *, delete: bool) -> None:
        self.keeper.let_go(message)
        await (self.queue.delete(message) if delete else self.queue.release(message))

    async def _handle(
        self, message: Message, received_at: float | None, started: Callable[[], None] | None
    ) -> None:
        ctx = self.ctx
        received = ctx.clock.now() if received_at is None else received_at
        try:
            events = parse_eventbridge(message.body)
        except EventParseError as exc:
            ctx.metrics.interruption_errors.labels(type(exc).__name__).inc()
            log.warning(
                "dropping message that cannot be parsed", message_id=message.id, error=str(exc)
            )
            await self._finish(message, delete=True)
            return
        owned = False
        kept = False
        waits_for: list[str] = []  # claims whose removal ends the message's action
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
                verdict = await self._terminate_hook(event, message, started)
                owned = owned or verdict == "done"
                kept = kept or verdict == "in-progress"
                continue
            claim = self.instances.claim_for(event.instance_id)
            if claim is None:
                if event.instance_id and await self.instances.was_ours(event.instance_id):
                    log.info(
                        "node claim already gone, deleting the message",
                        kind=event.kind.value,
                        instance_id=event.instance_id,
                        message_id=message.id,
                    )
                    owned = True
                continue
            owned = True
            await self._act(event, claim, received, started)
            if self._waits(event.kind):
                waits_for.append(claim.name)
        if kept:
            return  # deleted together with the copy being handled (see _terminate_hook)
        if not owned and events:
            await self._finish(message, delete=False)
            return
        cluster = ctx.cluster
        pending = [name for name in waits_for if cluster.node_claim(name) is not None]
        if pending:
            self.keeper.hold(message, lambda: all(cluster.node_claim(n) is None for n in pending))
        else:
            await self._finish(message, delete=True)

    def _waits(self, kind: EventKind) -> bool:
        """Whether the action for ``kind`` ends only when the claim is gone."""
        replaces = self.ctx.settings.rebalance_action == "replace-then-drain"
        return kind in _DEADLINE_KINDS or (kind is EventKind.REBALANCE_RECOMMENDATION and replaces)

    async def _act(
        self,
        event: InterruptionEvent,
        claim: NodeClaim,
        received: float,
        started: Callable[[], None] | None,
    ) -> None:
        if event.id in self._seen:
            return
        task = self._acting.get(event.id)
        if task is None:
            task = asyncio.ensure_future(self._perform(event, claim, received, started))
            self._acting[event.id] = task
            task.add_done_callback(partial(self._acted, event.id))
        await asyncio.shield(task)

    def _acted(self, event_id: str, task: asyncio.Task[None]) -> None:
        self._acting.pop(event_id, None)
        # Only once the action succeeded: a message released after a failure acts again.
        if not task.cancelled() and task.exception() is None:
            self._remember(event_id)

    def _remember(self, event_id: str) -> None:
        self._seen[event_id] = None
        if len(self._seen) > 10_000:
            self._seen.popitem(last=False)

    async def _terminate_hook(
        self, event: InterruptionEvent, message: Message, started: Callable[[], None] | None
    ) -> _HookVerdict:
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
            self.keeper.hold(message)
            log.info(
                "lifecycle action already being handled, keeping this copy until it completes",
                message_id=message.id,
                instance_id=event.instance_id,
            )
            return "in-progress"
        claim = self.instances.claim_for(event.instance_id)
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
            if started is not None:
                started()
            await drain_and_complete(ctx, self.autoscaling, action, node)
        except BaseException:
            # The action is retried from the released message: its copies come back too.
            for copy in self._in_progress.pop(event.id, []):
                self.keeper.let_go(copy)
                with contextlib.suppress(Exception):
                    await self.queue.release(copy)
            raise
        self._remember(event.id)
        for copy in self._in_progress.pop(event.id, []):
            self.keeper.let_go(copy)
            await self.queue.delete(copy)
        return "done"

    async def _perform(
        self,
        event: InterruptionEvent,
        claim: NodeClaim,
        received: float,
        started: Callable[[], None] | None = None,
    ) -> None:
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
        current = ctx.cluster.node_claim(claim.name)
        fresh = current is not None and current.deleting_since is None
        log.info(
            "interruption received",
            deadline_in=f"{deadline - now:.0f}s",
            queued_for=f"{now - received:.3f}s",
            **fields,
        )
        # The taint first, with one PATCH: it is what stops new pods landing and makes the
        # provisioner count these pods as pending, and nothing needs to wait for the claim.
        if claim.node_name and await mark_disrupted(ctx, claim.node_name, event.kind.value):
            ctx.metrics.receipt_to_taint.observe(max(0.0, ctx.clock.now() - received))
        if started is not None:
            started()  # the urgent part is done: the next message may have the slot
        await self._delete_claim(claim, event.kind.value, deadline)
        if fresh:
            ctx.metrics.actions.labels("drain").inc()
            if claim.node_name:
                await ctx.cluster.record_event(
                    "Node",
                    claim.node_name,
                    "InstanceInterrupted",
                    f"{event.kind.value}: {event.detail}",
                    warning=True,
                )

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
        task.add_done_callback(_log_failure)

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


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        error = task.exception()
        log.error("replace-then-drain failed", error=f"{type(error).__name__}: {error}")
