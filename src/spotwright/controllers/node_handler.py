"""IMDS mode's actor: what the handler running on a node does about that node's own signals.

In IMDS mode one handler runs on every node (a DaemonSet) and acts on nothing but its own
Node. It asks ``plan_action`` what each event calls for and carries the steps out through
the Cluster port, the way queue mode does, with three differences that come from where it
runs:

* there is no NodeClaim to delete (the instance may not even be spotwright's): the handler
  taints, cordons and labels the Node itself and drains it with ``Terminator.drain``, bound
  by the notice's deadline;
* "launch the replacement" means putting the disruption taint on now, which is what makes
  spotwright's provisioner, and Karpenter, count the node's pods as pending; a rebalance
  recommendation then waits until the capacity launched since is ready (or a configurable
  time has passed) before draining. That wait is the one moment the handler looks past its
  own node: a live handler caches only its Node and its pods, and is given a
  ``capacity_view`` that shows it the cluster's Nodes and NodeClaims for the wait's length;
* a scheduled maintenance that is canceled or completed puts the node back in service,
  undoing only what this handler changed. What it changed is written on the Node itself
  (label ``spotwright.io/handler-added``), so a restarted handler still knows, and a node
  an operator cordoned by hand is never uncordoned by it. A node that another event still
  holds (a spot notice, a rebalance) stays out of service.

Every step is logged, counted (``spotwright_node_handler_steps{step, result}``), recorded
as a Kubernetes Event on the Node, and handed to listeners such as the webhook reporter. A
more urgent event (a spot notice during a rebalance drain) takes the drain over; a less
urgent one joins the drain in progress rather than starting a second one.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterable, Callable, Sequence
from dataclasses import dataclass, replace

from spotwright.controllers.context import Context
from spotwright.controllers.handler_steps import event_reason, step_counter
from spotwright.controllers.termination import DISRUPTED_TAINT, Terminator
from spotwright.events.actions import Action, ActionName, ActionPolicy, Step, plan_action
from spotwright.events.model import EventKind, InterruptionEvent
from spotwright.model import labels as wk
from spotwright.model.objects import Node, Taint
from spotwright.observability.logs import get_logger
from spotwright.observability.webhook import StepReport
from spotwright.ports.cluster import ClusterError, NotFound

__all__ = ["ADDED_LABEL", "EXCLUDE_LB_LABEL", "CapacityView", "NodeHandler", "StepListener"]

log = get_logger("handler")

EXCLUDE_LB_LABEL = "node.kubernetes.io/exclude-from-external-load-balancers"
EXCLUDE_LB_VALUE = "spotwright"
#: On the Node: which of taint, cordon and load-balancer label this handler added.
ADDED_LABEL = "spotwright.io/handler-added"
_TAINT, _CORDON, _LB = "taint", "cordon", "lb"

#: Something told about every step: the webhook reporter, a test.
StepListener = Callable[[StepReport], None]
#: A block during which the cluster's reads cover every Node and NodeClaim (see module doc).
CapacityView = Callable[[], contextlib.AbstractAsyncContextManager[object]]

_QUIET_RESULTS = ("ok", "skipped")
_IMDS_CANNOT = "not possible in IMDS mode: a lifecycle hook's token only reaches the queue"


@dataclass(eq=False)
class _Drain:
    """An action that will drain the node, and what may stop it before it is done."""

    event: InterruptionEvent
    urgency: float  # its deadline; inf when it has none
    task: asyncio.Task[object] | None
    phase: str = "marking"  # then "waiting" (for the replacement), then "draining"
    ended: str | None = None

    def stop(self, why: str) -> None:
        self.ended = why
        if self.phase != "marking" and self.task is not None:
            self.task.cancel()


class NodeHandler:
    """Carries out ``plan_action`` for the events of one node, ``node_name``."""

    def __init__(
        self,
        ctx: Context,
        node_name: str,
        *,
        policy: ActionPolicy | None = None,
        listeners: Sequence[StepListener] = (),
        capacity_view: CapacityView | None = None,
    ) -> None:
        self.ctx = ctx
        self.node_name = node_name
        #: None: the cluster's reads already cover everything (the in-memory cluster).
        self.capacity_view = capacity_view
        self.policy = policy or ActionPolicy()
        forced = self.policy.at_deadline == "force"
        self._terminator = Terminator(
            replace(ctx, settings=replace(ctx.settings, force_at_deadline=forced))
        )
        self.listeners = list(listeners)
        self._steps = step_counter(ctx.metrics.registry)
        self._lock = asyncio.Lock()
        #: Events that keep the node out of service, by id.
        self._holds: dict[str, InterruptionEvent] = {}
        self._drains: dict[str, _Drain] = {}
        self._added: set[str] = set()

    async def run(
        self,
        events: AsyncIterable[InterruptionEvent],
        *,
        on_failure: Callable[[InterruptionEvent], None] | None = None,
    ) -> None:
        """Handle each event in a task of its own, so polling goes on during a drain.

        ``on_failure`` hears of events whose action failed (the poller then reads them
        again); when the source ends, the actions under way are awaited.
        """
        tasks: set[asyncio.Task[None]] = set()
        try:
            async for event in events:
                task = asyncio.create_task(self._handle_guarded(event, on_failure))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.gather(*list(tasks))
        finally:
            for task in list(tasks):
                task.cancel()

    async def _handle_guarded(
        self, event: InterruptionEvent, on_failure: Callable[[InterruptionEvent], None] | None
    ) -> None:
        try:
            ok = await self.handle(event)
        except Exception as exc:  # one event's failure must not stop the others
            log.error(
                "failed to handle event", event_id=event.id, error=f"{type(exc).__name__}: {exc}"
            )
            ok = False
        if not ok:
            self.ctx.metrics.interruption_errors.labels("action_failed").inc()
            if on_failure is not None:
                on_failure(event)

    async def handle(self, event: InterruptionEvent) -> bool:
        """Carry out the event's action; False when a step failed (worth another try).

        A more urgent event, or the end of a maintenance, may cancel the task running this
        while it waits or drains; ``run`` gives every event a task of its own for that.
        """
        if event.node is not None and event.node != self.node_name:
            log.warning("ignoring an event about another node", node=event.node, event_id=event.id)
            return True
        action = plan_action(event, self.policy)
        now = self.ctx.clock.now()
        self.ctx.metrics.interruption_messages.labels(event.kind.value).inc()
        log.info(
            "interruption received",
            kind=event.kind.value,
            instance_id=event.instance_id,
            node=self.node_name,
            action=action.name.value,
            deadline_in="none" if action.deadline is None else f"{action.deadline - now:.0f}s",
            event_id=event.id,
        )
        await self._note(event, action, "received", "ok", f"{event.detail}; {action.reason}")
        if action.name is ActionName.NONE:
            self.ctx.metrics.actions.labels(action.name.value).inc()
            return True
        if action.has(Step.UNCORDON):
            return await self._end_maintenance(event, action)
        return await self._act(event, action)

    async def _act(self, event: InterruptionEvent, action: Action) -> bool:
        self._holds[event.id] = event
        drain: _Drain | None = None
        covering: _Drain | None = None
        if action.has(Step.DRAIN):
            urgency = action.deadline if action.deadline is not None else math.inf
            covering = next((d for d in self._drains.values() if d.urgency <= urgency), None)
            if covering is None:
                for other in self._drains.values():
                    other.stop(f"superseded by {event.kind.value} ({event.id})")
                drain = _Drain(event, urgency, asyncio.current_task())
                self._drains[event.id] = drain
        since = self.ctx.clock.now()
        try:
            for step in action.steps:
                if drain is not None and drain.ended is not None:
                    break
                if covering is not None and step in (Step.WAIT_FOR_REPLACEMENT, Step.DRAIN):
                    why = f"already drained for {covering.event.kind.value} ({covering.event.id})"
                    await self._note(event, action, step, "skipped", why)
                    continue
                await self._step(step, event, action, drain, since)
        except asyncio.CancelledError:
            if drain is None or drain.ended is None:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            log.info("stopped the drain", event_id=event.id, why=drain.ended)
        except NotFound:
            log.warning("node is gone, nothing left to do", node=self.node_name, event_id=event.id)
            return True
        except ClusterError:
            return False  # the step reported it
        finally:
            if drain is not None:
                self._drains.pop(event.id, None)
        self.ctx.metrics.actions.labels(action.name.value).inc()
        return True

    async def _step(
        self,
        step: Step,
        event: InterruptionEvent,
        action: Action,
        drain: _Drain | None,
        since: float,
    ) -> None:
        try:
            result, detail = await self._perform(step, action, drain, since)
        except ClusterError as exc:
            if isinstance(exc, NotFound):
                raise
            await self._note(event, action, step, "error", str(exc))
            raise
        await self._note(event, action, step, result, detail)

    async def _perform(
        self, step: Step, action: Action, drain: _Drain | None, since: float
    ) -> tuple[str, str]:
        taint = action.taint or DISRUPTED_TAINT
        match step:
            case Step.TAINT:
                changed = await self._mark(taint=taint)
                return "ok", f"{'tainted' if changed else 'already tainted'} {taint}"
            case Step.CORDON:
                changed = await self._mark(cordon=True)
                return "ok", "cordoned" if changed else "already cordoned"
            case Step.EXCLUDE_FROM_LOAD_BALANCERS:
                changed = await self._mark(exclude=True)
                return "ok", f"labelled {EXCLUDE_LB_LABEL}" if changed else "already excluded"
            case Step.LAUNCH_REPLACEMENT:
                await self._mark(taint=taint)
                return "ok", "the node's pods count as pending: replacement capacity starts now"
            case Step.WAIT_FOR_REPLACEMENT:
                if drain is not None:
                    drain.phase = "waiting"
                return await self._wait_for_replacement(since)
            case Step.DRAIN:
                if drain is not None:
                    drain.phase = "draining"
                return await self._drain(action.deadline)
            case _:
                return "skipped", _IMDS_CANNOT

    async def _drain(self, deadline: float | None) -> tuple[str, str]:
        ctx = self.ctx
        started = ctx.clock.now()
        finished = await self._terminator.drain(self.node_name, deadline)
        now = ctx.clock.now()
        took = now - started
        ctx.metrics.drain_duration.observe(took)
        late = deadline is not None and now > deadline
        ctx.metrics.drains.labels(
            "deadline_exceeded" if late or not finished else "before_deadline"
        ).inc()
        if not finished:
            return "node_gone", f"the node went away {took:.0f}s into the drain"
        if late:
            return "deadline_exceeded", f"drained in {took:.0f}s, past the deadline"
        left = "" if deadline is None else f", {deadline - now:.0f}s before the deadline"
        return "ok", f"drained in {took:.0f}s{left}"

    async def _wait_for_replacement(self, since: float) -> tuple[str, str]:
        """Wait until the capacity launched since the taint is ready, or give up and drain.

        The provisioner is first given its batching window to order that capacity; then
        node claims created since and Nodes registered since must all be ready. With no
        new capacity needed (room elsewhere), that is the case at once.
        """
        ctx = self.ctx
        settings = ctx.settings
        give_up = since + settings.replacement_wait_seconds
        window = settings.batch_max_seconds + settings.batch_idle_seconds
        view = self.capacity_view() if self.capacity_view is not None else contextlib.nullcontext()
        # Entering lists the cluster's Nodes and NodeClaims (a live handler's view): the
        # batching window runs from the taint, so that time is not added to it.
        async with view:
            await ctx.clock.sleep(max(0.0, min(since + window, give_up) - ctx.clock.now()))
            while True:
                now = ctx.clock.now()
                booting = self._booting_since(since)
                if not booting:
                    return "ok", f"replacement capacity ready after {now - since:.0f}s"
                if now >= give_up:
                    return "timeout", (
                        f"{', '.join(booting)} still not ready after {now - since:.0f}s; "
                        "draining anyway"
                    )
                await ctx.clock.sleep(min(1.0, give_up - now))

    def _booting_since(self, since: float) -> list[str]:
        cluster = self.ctx.cluster
        after = since - 1.0  # API timestamps are whole seconds
        claims = [
            f"nodeclaim/{c.name}"
            for c in cluster.node_claims()
            if c.created_at >= after and c.deleting_since is None and c.initialized_at is None
        ]
        nodes = [
            f"node/{n.name}"
            for n in cluster.nodes()
            if n.created_at >= after and not n.ready and n.name != self.node_name
        ]
        return claims + nodes

    async def _end_maintenance(self, event: InterruptionEvent, action: Action) -> bool:
        """A scheduled maintenance is over: back in service, unless something else holds it."""
        ended = [
            key
            for key, held in self._holds.items()
            if held.kind is EventKind.SCHEDULED_CHANGE and held.raw_id == event.raw_id
        ]
        for key in ended:
            del self._holds[key]
        state = event.state or "over"
        if self._holds:
            others = ", ".join(sorted({held.kind.value for held in self._holds.values()}))
            why = f"scheduled maintenance {state}, but the node is still held for {others}"
            await self._note(event, action, Step.UNCORDON, "skipped", why)
            return True
        for key in ended:
            drain = self._drains.get(key)
            if drain is not None:
                drain.stop(f"scheduled maintenance {state}")
        try:
            undone = await self._undo()
        except NotFound:
            log.warning("node is gone, nothing to uncordon", node=self.node_name)
            return True
        except ClusterError as exc:
            await self._note(event, action, Step.UNCORDON, "error", str(exc))
            return False
        if undone:
            detail = f"scheduled maintenance {state}: removed {', '.join(undone)}"
        else:
            detail = (
                f"scheduled maintenance {state}: nothing to undo (not taken out by this handler)"
            )
        await self._note(event, action, Step.UNCORDON, "ok", detail)
        self.ctx.metrics.actions.labels(action.name.value).inc()
        return True

    # -- the Node, changed with patches that also record what was changed -----------------

    def _node(self) -> Node:
        node = self.ctx.cluster.node(self.node_name)
        if node is None:
            raise NotFound(f"node {self.node_name} not found")
        return node

    def _recorded(self, node: Node) -> set[str]:
        text = node.labels.get(ADDED_LABEL, "")
        return self._added | {part for part in text.split(".") if part}

    async def _mark(
        self, *, taint: Taint | None = None, cordon: bool = False, exclude: bool = False
    ) -> bool:
        """Taint, cordon or label the node where it is not yet; True if anything changed."""
        async with self._lock:
            node = self._node()
            added = self._recorded(node)
            new: set[str] = set()
            labels: dict[str, str | None] = {}
            if taint is not None and not any(t.key == taint.key for t in node.taints):
                new.add(_TAINT)
            if cordon and not node.unschedulable:
                new.add(_CORDON)
            if exclude and EXCLUDE_LB_LABEL not in node.labels:
                new.add(_LB)
                labels[EXCLUDE_LB_LABEL] = EXCLUDE_LB_VALUE
            if not new:
                return False
            labels[ADDED_LABEL] = ".".join(sorted(added | new))
            await self.ctx.cluster.patch_node(
                self.node_name,
                add_taints=[taint] if taint is not None and _TAINT in new else [],
                unschedulable=True if _CORDON in new else None,
                labels=labels,
            )
            self._added = added | new
            return True

    async def _undo(self) -> list[str]:
        """Remove what this handler added, in one patch; what was removed, for the Event."""
        async with self._lock:
            node = self._node()
            added = self._recorded(node)
            removed: list[str] = []
            remove_taints: list[str] = []
            if _TAINT in added and any(t.key == wk.DISRUPTED_TAINT_KEY for t in node.taints):
                remove_taints.append(wk.DISRUPTED_TAINT_KEY)
                removed.append(f"taint {wk.DISRUPTED_TAINT_KEY}")
            uncordon = _CORDON in added and node.unschedulable
            if uncordon:
                removed.append("cordon")
            labels: dict[str, str | None] = {}
            if _LB in added and node.labels.get(EXCLUDE_LB_LABEL) == EXCLUDE_LB_VALUE:
                labels[EXCLUDE_LB_LABEL] = None
                removed.append(f"label {EXCLUDE_LB_LABEL}")
            if ADDED_LABEL in node.labels:
                labels[ADDED_LABEL] = None
            if remove_taints or uncordon or labels:
                await self.ctx.cluster.patch_node(
                    self.node_name,
                    remove_taints=remove_taints,
                    unschedulable=False if uncordon else None,
                    labels=labels,
                )
            self._added = set()
            return removed

    # -- every step seen three ways, and by the listeners ---------------------------------

    async def _note(
        self, event: InterruptionEvent, action: Action, step: Step | str, result: str, detail: str
    ) -> None:
        ctx = self.ctx
        name = step.value if isinstance(step, Step) else step
        fields = {
            "step": name,
            "result": result,
            "node": self.node_name,
            "kind": event.kind.value,
            "event_id": event.id,
            "detail": detail,
        }
        quiet = result in _QUIET_RESULTS
        if quiet:
            log.info("handler step", **fields)
        else:
            log.warning("handler step", **fields)
        self._steps.labels(name, result).inc()
        reason = event_reason(step, result) if isinstance(step, Step) else "InterruptionReceived"
        warning = not quiet or (step == "received" and action.deadline is not None)
        with contextlib.suppress(ClusterError):
            await ctx.cluster.record_event("Node", self.node_name, reason, detail, warning=warning)
        report = StepReport(
            kind=event.kind.value,
            instance_id=event.instance_id,
            node=self.node_name,
            action=action.name.value,
            step=name,
            result=result,
            time=ctx.clock.now(),
            detail=detail,
            event_id=event.id,
        )
        for listener in self.listeners:
            try:
                listener(report)
            except Exception as exc:  # a listener must never break an action
                log.error("step listener failed", error=f"{type(exc).__name__}: {exc}")
