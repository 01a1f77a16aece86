"""Termination: a deleted node claim becomes a drained node and a terminated instance.

Deleting a claim is the single "terminate" signal, whoever sends it (interruption handling,
disruption, a user). The node is tainted, cordoned and labelled out of load balancers with
one patch (skipped when the interruption handler already did it at the message's receipt),
then drained in tiers (ordinary pods, then system-critical ones; daemon-set and mirror pods
are left, as are pods that tolerate the disruption taint), retrying PodDisruptionBudget
refusals with backoff, or sooner when a pod of the budget turns ready, and holding a
replace-then-drain's pods until ready nodes have room (``eviction_gates``). At most
``eviction_concurrency`` evictions are in flight at once across all drains: a thousand
nodes drained together must leave the API client's connections free for the next
interrupted node's taint. When the claim carries a deadline
(an interruption notice), nothing waits past it: a pod whose grace period would overrun
the deadline is deleted with what time is left.

A pod annotated ``karpenter.sh/do-not-disrupt`` is not evicted while the annotation is in
force ("true": always; a Go duration such as "30m": until that long after the pod started).
It only holds the graceful part of a drain back: at the deadline of an interruption it is
deleted like every other pod left, since the instance goes regardless. An annotation that
does not parse is ignored, with a Warning Event on the pod.

A termination that fails (an API error, a race with another writer) is logged, counted and
started again with backoff while the claim is still being deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import weakref
from collections.abc import Callable

from spotwright.controllers.context import Context
from spotwright.controllers.eviction_gates import BudgetWaker, Room, budgets_of, promise
from spotwright.model import labels as wk
from spotwright.model.objects import NodeClaim, Pod, PodDisruptionBudget, Taint
from spotwright.observability.logs import get_logger
from spotwright.ports.cloud import CloudError
from spotwright.ports.cluster import Cluster, EvictionBlocked, NotFound
from spotwright.scheduling import tolerates
from spotwright.scheduling.fit import pod_requests

__all__ = [
    "DISRUPTED_TAINT",
    "DO_NOT_DISRUPT",
    "EXCLUDE_LB_LABEL",
    "Terminator",
    "mark_disrupted",
    "parse_go_duration",
]

log = get_logger("termination")

DISRUPTED_TAINT = Taint(wk.DISRUPTED_TAINT_KEY, "NoSchedule")
#: The label that takes a node out of external load balancers before its pods go.
EXCLUDE_LB_LABEL = "node.kubernetes.io/exclude-from-external-load-balancers"
#: The pod annotation that holds graceful eviction back (Karpenter's name, so that
#: workloads written for Karpenter keep their protection).
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"

#: The deletion reason of a replace-then-drain (``EventKind.REBALANCE_RECOMMENDATION``).
_REBALANCE = "rebalance_recommendation"
#: How long a replace-then-drain holds pods that no ready node has room for, once no claim
#: is booting: long enough for the provisioner's next look (it counts them as pending) to
#: order a node, short of leaving them for the interruption notice. While a claim boots
#: the hold goes on, since that claim is usually the room they wait for.
_HOLD_SECONDS = 15.0
#: Retries of a failed termination: 1 s, doubling, at most this long apart.
_RETRY_MAX_SECONDS = 60.0
#: One bound on evictions in flight per cluster, shared by every drain (the termination
#: controller's, the lifecycle hooks', the serverless drainer's).
_EVICTION_SLOTS: weakref.WeakKeyDictionary[Cluster, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def _eviction_slots(ctx: Context) -> asyncio.Semaphore:
    slots = _EVICTION_SLOTS.get(ctx.cluster)
    if slots is None:
        slots = asyncio.Semaphore(max(1, ctx.settings.eviction_concurrency))
        _EVICTION_SLOTS[ctx.cluster] = slots
    return slots


async def mark_disrupted(ctx: Context, node_name: str, reason: str) -> bool:
    """Taint, cordon and label the node out of load balancers, with one PATCH.

    Nothing is sent when the cached node shows all three already: the interruption
    handler marks the node at the message's receipt and the termination controller
    arrives here right after. False when the node is gone.
    """
    node = ctx.cluster.node(node_name)
    if node is None:
        return False
    tainted = any(
        t.key == DISRUPTED_TAINT.key and t.effect == DISRUPTED_TAINT.effect for t in node.taints
    )
    if tainted and node.unschedulable and EXCLUDE_LB_LABEL in node.labels:
        return True
    try:
        await ctx.cluster.patch_node(
            node_name,
            add_taints=[DISRUPTED_TAINT],
            unschedulable=True,
            labels={EXCLUDE_LB_LABEL: "spotwright"},
        )
    except NotFound:
        return False
    log.info("tainted node", node=node_name, taint=str(DISRUPTED_TAINT), reason=reason)
    ctx.metrics.actions.labels("cordon").inc()
    await ctx.cluster.record_event("Node", node_name, "Cordoned", f"Cordoned: {reason}")
    return True


class Terminator:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._draining: dict[str, asyncio.Task[None]] = {}
        self._failures: dict[str, int] = {}
        self._retries: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        try:
            async for event in self.ctx.cluster.watch("nodeclaim"):
                if event.type == "DELETED" or event.name in self._draining:
                    continue
                claim = self.ctx.cluster.node_claim(event.name)
                if claim is not None and claim.deleting_since is not None:
                    self._start(claim)
        finally:
            for task in [*self._draining.values(), *self._retries]:
                task.cancel()

    def _start(self, claim: NodeClaim) -> None:
        task = asyncio.create_task(self.terminate(claim))
        self._draining[claim.name] = task
        task.add_done_callback(self._finished(claim.name))

    def _finished(self, name: str) -> Callable[[asyncio.Task[None]], None]:
        def finished(task: asyncio.Task[None]) -> None:
            if self._draining.get(name) is task:
                del self._draining[name]
            if task.cancelled():
                return
            error = task.exception()
            if error is None:
                self._failures.pop(name, None)
                return
            attempt = self._failures.get(name, 0) + 1
            self._failures[name] = attempt
            delay = min(_RETRY_MAX_SECONDS, 2.0 ** (attempt - 1))
            self.ctx.metrics.termination_errors.labels(type(error).__name__).inc()
            log.error(
                "terminating nodeclaim failed, retrying",
                nodeclaim=name,
                error=f"{type(error).__name__}: {error}",
                attempt=attempt,
                retry_in=f"{delay:.0f}s",
            )
            retry = asyncio.create_task(self._retry(name, delay))
            self._retries.add(retry)
            retry.add_done_callback(self._retries.discard)

        return finished

    async def _retry(self, name: str, delay: float) -> None:
        """Start the claim's termination again, unless it is gone or already running."""
        await self.ctx.clock.sleep(delay)
        claim = self.ctx.cluster.node_claim(name)
        if claim is None:
            self._failures.pop(name, None)
            return
        if name not in self._draining and claim.deleting_since is not None:
            self._start(claim)

    async def terminate(self, claim: NodeClaim) -> None:
        ctx = self.ctx
        node = ctx.cluster.node(claim.node_name) if claim.node_name else None
        started = ctx.clock.now()
        deadline = claim.drain_deadline
        if node is not None:
            await mark_disrupted(ctx, node.name, claim.deletion_reason or "deleted")
            finished = await self.drain(node.name, deadline, claim_name=claim.name)
            took = ctx.clock.now() - started
            ctx.metrics.drain_duration.observe(took)
            if finished:
                ctx.metrics.drains.labels("before_deadline").inc()
                log.info(
                    "drained node", node=node.name, nodeclaim=claim.name, duration=f"{took:.1f}s"
                )
                await ctx.cluster.record_event(
                    "Node", node.name, "Drained", f"Drained in {took:.0f}s"
                )
            else:
                ctx.metrics.drains.labels("deadline_exceeded").inc()
                log.warning(
                    "node went away before it was drained",
                    node=node.name,
                    nodeclaim=claim.name,
                    duration=f"{took:.1f}s",
                )
        if claim.provider_id:
            await self._terminate_instance(claim.provider_id.rsplit("/", 1)[-1])
            log.info(
                "terminated instance",
                nodeclaim=claim.name,
                provider_id=claim.provider_id,
                reason=claim.deletion_reason,
            )
        if node is not None:
            with contextlib.suppress(NotFound):
                await ctx.cluster.delete_node(node.name)
        ctx.metrics.nodeclaims_terminated.labels(claim.deletion_reason or "deleted").inc()
        await ctx.cluster.remove_node_claim(claim.name)

    async def _terminate_instance(self, instance_id: str) -> None:
        """Terminate, retrying transient failures; an instance already gone is done."""
        delay = 1.0
        while True:
            try:
                await self.ctx.cloud.terminate(instance_id)
                return
            except CloudError as exc:
                if exc.code == "InvalidInstanceID.NotFound":
                    return
                log.error(
                    "could not terminate instance, retrying",
                    instance_id=instance_id,
                    error=str(exc),
                    retry_in=f"{delay:.0f}s",
                )
                await self.ctx.clock.sleep(delay)
                delay = min(delay * 2, 60.0)

    async def drain(
        self, node_name: str, deadline: float | None, *, claim_name: str | None = None
    ) -> bool:
        """Evict every drainable pod; True when the node emptied before it vanished.

        The deadline is re-read from the claim on every pass: a rebalance recommendation
        starts a drain without one, and the interruption notice that may follow sets it.
        """
        ctx = self.ctx
        waker = BudgetWaker(ctx.cluster)
        try:
            return await self._drain(node_name, deadline, claim_name, waker)
        finally:
            await waker.close()

    async def _drain(
        self, node_name: str, deadline: float | None, claim_name: str | None, waker: BudgetWaker
    ) -> bool:
        ctx = self.ctx
        backoff: dict[str, float] = {}
        next_try: dict[str, float] = {}
        told: set[str] = set()  # pods whose do-not-disrupt annotation got its Event
        refused: set[str] = set()  # pods whose PDB refusal got its Event
        hold_until = ctx.clock.now() + ctx.settings.replacement_wait_seconds
        held_since: float | None = None
        while True:
            claim = ctx.cluster.node_claim(claim_name) if claim_name else None
            if claim is not None:
                deadline = claim.drain_deadline
            if ctx.cluster.node(node_name) is None:
                return False
            pods = [p for p in ctx.cluster.pods_on(node_name) if _drainable(p)]
            if not pods:
                return True
            now = ctx.clock.now()
            critical = [p for p in pods if _critical(p)]
            ordinary = [p for p in pods if not _critical(p)]
            tier = ordinary or critical
            # A replace-then-drain has time: its pods leave once ready nodes have room for
            # all of them (the largest first, as spreading would crowd them out), so none
            # waits for a node and none leaves before the replacement is up.
            holding = deadline is None and now < hold_until and _replacing(claim)
            leaving = sorted(
                (p for p in tier if not p.terminating), key=lambda p: -pod_requests(p).cpu
            )
            if holding and not Room(ctx.cluster, node_name, now).take_all(leaving):
                # While a claim boots, the provisioner is adding room (these pods count as
                # pending to it): wait for it, then give it one more look.
                if held_since is None or _booting(ctx.cluster):
                    held_since = now
                if now - held_since < _HOLD_SECONDS:
                    await waker.sleep(ctx.clock, 0.5)
                    continue
                # The provisioner sees no need for more room: let the pods go pending,
                # which it acts on at once, rather than keep them until the notice.
                holding = False
            else:
                held_since = None
            # Largest first, as Room placed them: their replacements are created, and
            # scheduled, in this order, so small pods do not take the gap a large one needs.
            for pod in sorted(tier, key=lambda p: -pod_requests(p).cpu):
                if pod.terminating:
                    continue
                # Before the backoff check: a pod waiting out a PDB refusal must not miss
                # its last chance to shut down within the deadline. Forced only once its
                # grace would overrun it: until then an eviction may still be allowed.
                if (
                    deadline is not None
                    and ctx.settings.force_at_deadline
                    and (now + pod.grace_seconds > deadline)
                ):
                    await self._force(pod, max(0.0, deadline - now))
                    continue
                if next_try.get(pod.key, 0.0) > now:
                    continue
                if await self._protected(pod, node_name, now, told):
                    continue
                try:
                    async with _eviction_slots(ctx):
                        await ctx.cluster.evict(pod)
                except EvictionBlocked as exc:
                    ctx.metrics.eviction_blocked.inc()
                    delay = min(
                        ctx.settings.eviction_backoff_max,
                        backoff.get(pod.key, ctx.settings.eviction_backoff_min / 2) * 2,
                    )
                    backoff[pod.key] = delay
                    next_try[pod.key] = now + delay
                    budgets = budgets_of(ctx.cluster, pod, exc.budget)
                    waker.refused(budgets)
                    if pod.key not in refused:
                        refused.add(pod.key)
                        await self._refused(pod, node_name, exc.budget or _names(budgets))
                    continue
                except NotFound:
                    continue
                if holding:
                    promise(ctx.cluster, pod, now)
                ctx.metrics.pods_evicted.labels("drain").inc()
                log.info("evicted pod", pod=pod.key, node=node_name)
                await ctx.cluster.record_event(
                    "Pod", pod.key, "Evicted", f"Evicted from node {node_name}"
                )
            waits = [t - now for t in next_try.values() if t > now]
            step = min([0.5, *waits]) if waits else 0.5
            # Only forcing happens at the deadline: with "leave" nothing changes then.
            going = [p for p in tier if not p.terminating]
            if deadline is not None and ctx.settings.force_at_deadline and going:
                step = min(step, max(0.05, deadline - now - _max_grace(going)))
            if await waker.sleep(ctx.clock, step):
                # A budget's pod became ready: its refused pods may go now, whatever
                # their timers say (their backoff keeps growing while refused).
                next_try.clear()

    async def _refused(self, pod: Pod, node_name: str, budget: str) -> None:
        """One Warning Event per pod and drain naming the budget; retries stay quiet."""
        log.info("eviction refused by a disruption budget", pod=pod.key, budget=budget)
        await self.ctx.cluster.record_event(
            "Pod",
            pod.key,
            "EvictionBlocked",
            f"Draining node {node_name}: eviction refused by disruption budget {budget}; "
            "retrying with backoff",
            warning=True,
        )

    async def _protected(self, pod: Pod, node_name: str, now: float, told: set[str]) -> bool:
        """Whether the pod's do-not-disrupt annotation holds its eviction back now.

        Each pod's annotation is reported once per drain: a Normal Event while it protects
        the pod, a Warning Event when it does not parse (and is then ignored).
        """
        value = pod.annotations.get(DO_NOT_DISRUPT)
        if value is None:
            return False
        first = pod.key not in told
        told.add(pod.key)
        if value.strip().lower() == "true":
            if first:
                await self._tell(pod, node_name, "not evicted: annotated do-not-disrupt")
            return True
        try:
            span = parse_go_duration(value)
        except ValueError as exc:
            if first:
                log.warning(
                    "ignoring invalid do-not-disrupt annotation", pod=pod.key, error=str(exc)
                )
                await self.ctx.cluster.record_event(
                    "Pod",
                    pod.key,
                    "InvalidDoNotDisrupt",
                    f"Ignoring {DO_NOT_DISRUPT}={value!r}: {exc}",
                    warning=True,
                )
            return False
        # Karpenter counts from status.startTime; a pod not started yet (or read from a
        # source without it) counts from its creation, which only makes it earlier.
        began = pod.started_at if pod.started_at is not None else pod.created_at
        until = began + span
        if now >= until:
            return False
        if first:
            await self._tell(
                pod, node_name, f"not evicted for {until - now:.0f}s more: annotated do-not-disrupt"
            )
        return True

    async def _tell(self, pod: Pod, node_name: str, why: str) -> None:
        log.info("pod protected from eviction", pod=pod.key, node=node_name, detail=why)
        await self.ctx.cluster.record_event(
            "Pod", pod.key, "DisruptionBlocked", f"Draining node {node_name}: {why}"
        )

    async def _force(self, pod: Pod, grace: float) -> None:
        try:
            async with _eviction_slots(self.ctx):
                await self.ctx.cluster.delete_pod(pod, grace_seconds=grace)
        except NotFound:
            return
        self.ctx.metrics.pods_evicted.labels("deadline").inc()
        log.warning("deleted pod at the drain deadline", pod=pod.key, grace=f"{grace:.0f}s")


_GO_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "\u00b5s": 1e-6,
    "\u03bcs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")


def parse_go_duration(text: str) -> float:
    """Seconds in a Go ``time.ParseDuration`` string ("30m", "1h30m", "1.5h", "-5s", "0").

    Go's grammar exactly, since that is what Karpenter reads the annotation with: a sign,
    then numbers each followed by a unit (a bare number other than 0 has none, so it is
    refused, as Go refuses it).
    """
    rest = text.strip()
    sign = -1.0 if rest.startswith("-") else 1.0
    rest = rest[1:] if rest[:1] in "+-" else rest
    if rest == "0":
        return 0.0
    if not rest:
        raise ValueError(f"{text!r} is not a duration like 30m or 1h30m")
    total = 0.0
    position = 0
    while position < len(rest):
        match = _GO_PART.match(rest, position)
        if match is None:
            raise ValueError(f"{text!r} is not a duration like 30m or 1h30m")
        total += float(match.group(1)) * _GO_UNITS[match.group(2)]
        position = match.end()
    return sign * total


def _drainable(pod: Pod) -> bool:
    if pod.daemon or pod.mirror:
        return False
    return tolerates(pod.tolerations, [DISRUPTED_TAINT]) is not None


def _critical(pod: Pod) -> bool:
    return pod.priority_class in ("system-cluster-critical", "system-node-critical")


def _max_grace(pods: list[Pod]) -> float:
    return max((p.grace_seconds for p in pods), default=0.0)


def _booting(cluster: Cluster) -> bool:
    """Whether some claim is launching or joining: capacity that is on its way."""
    return any(c.initialized_at is None and c.deleting_since is None for c in cluster.node_claims())


def _replacing(claim: NodeClaim | None) -> bool:
    """A drain started by a rebalance recommendation, which has time to wait for room."""
    return claim is not None and claim.deletion_reason == _REBALANCE


def _names(budgets: list[PodDisruptionBudget]) -> str:
    named = [f"{b.namespace}/{b.name}" for b in budgets if b.name]
    return ", ".join(named) or "(not named in the answer)"
