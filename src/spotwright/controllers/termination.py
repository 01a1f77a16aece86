"""Termination: a deleted node claim becomes a drained node and a terminated instance.

Deleting a claim is the single "terminate" signal, whoever sends it (interruption handling,
disruption, a user). The drain taints and cordons the node with one patch each, then evicts
in tiers (ordinary pods, then system-critical ones; daemon-set and mirror pods are left, as
are pods that tolerate the disruption taint), retrying PodDisruptionBudget refusals with
backoff. When the claim carries a deadline (an interruption notice), nothing waits past it:
a pod whose grace period would overrun the deadline is deleted with what time is left.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from spotwright.controllers.context import Context
from spotwright.model import labels as wk
from spotwright.model.objects import NodeClaim, Pod, Taint
from spotwright.observability.logs import get_logger
from spotwright.ports.cloud import CloudError
from spotwright.ports.cluster import EvictionBlocked, NotFound
from spotwright.scheduling import tolerates

__all__ = ["DISRUPTED_TAINT", "Terminator"]

log = get_logger("termination")

DISRUPTED_TAINT = Taint(wk.DISRUPTED_TAINT_KEY, "NoSchedule")
_EXCLUDE_LB = "node.kubernetes.io/exclude-from-external-load-balancers"


class Terminator:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._draining: dict[str, asyncio.Task[None]] = {}

    def _forget(self, name: str) -> Callable[[asyncio.Task[None]], None]:
        def forget(_task: asyncio.Task[None]) -> None:
            self._draining.pop(name, None)

        return forget

    async def run(self) -> None:
        async for event in self.ctx.cluster.watch("nodeclaim"):
            if event.type == "DELETED" or event.name in self._draining:
                continue
            claim = self.ctx.cluster.node_claim(event.name)
            if claim is not None and claim.deleting_since is not None:
                task = asyncio.create_task(self.terminate(claim))
                self._draining[claim.name] = task
                task.add_done_callback(self._forget(claim.name))

    async def terminate(self, claim: NodeClaim) -> None:
        ctx = self.ctx
        node = ctx.cluster.node(claim.node_name) if claim.node_name else None
        started = ctx.clock.now()
        deadline = claim.drain_deadline
        if node is not None:
            await self._cordon(node.name, claim)
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

    async def _cordon(self, node_name: str, claim: NodeClaim) -> None:
        ctx = self.ctx
        try:
            await ctx.cluster.patch_node(node_name, add_taints=[DISRUPTED_TAINT])
            log.info("tainted node", node=node_name, taint=str(DISRUPTED_TAINT))
            await ctx.cluster.patch_node(
                node_name, unschedulable=True, labels={_EXCLUDE_LB: "spotwright"}
            )
            log.info("cordoned node", node=node_name, reason=claim.deletion_reason)
            ctx.metrics.actions.labels("cordon").inc()
            await ctx.cluster.record_event(
                "Node", node_name, "Cordoned", f"Cordoned: {claim.deletion_reason or 'deleted'}"
            )
        except NotFound:
            pass

    async def drain(
        self, node_name: str, deadline: float | None, *, claim_name: str | None = None
    ) -> bool:
        """Evict every drainable pod; True when the node emptied before it vanished.

        The deadline is re-read from the claim on every pass: a rebalance recommendation
        starts a drain without one, and the interruption notice that may follow sets it.
        """
        ctx = self.ctx
        backoff: dict[str, float] = {}
        next_try: dict[str, float] = {}
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
            for pod in tier:
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
                try:
                    await ctx.cluster.evict(pod)
                except EvictionBlocked:
                    ctx.metrics.eviction_blocked.inc()
                    delay = min(
                        ctx.settings.eviction_backoff_max,
                        backoff.get(pod.key, ctx.settings.eviction_backoff_min / 2) * 2,
                    )
                    backoff[pod.key] = delay
                    next_try[pod.key] = now + delay
                    continue
                except NotFound:
                    continue
                ctx.metrics.pods_evicted.labels("drain").inc()
                log.info("evicted pod", pod=pod.key, node=node_name)
                await ctx.cluster.record_event(
                    "Pod", pod.key, "Evicted", f"Evicted from node {node_name}"
                )
            waits = [t - now for t in next_try.values() if t > now]
            step = min([0.5, *waits]) if waits else 0.5
            if deadline is not None:
                step = min(step, max(0.05, deadline - now - _max_grace(tier)))
            await ctx.clock.sleep(step)

    async def _force(self, pod: Pod, grace: float) -> None:
        try:
            await self.ctx.cluster.delete_pod(pod, grace_seconds=grace)
        except NotFound:
            return
        self.ctx.metrics.pods_evicted.labels("deadline").inc()
        log.warning("deleted pod at the drain deadline", pod=pod.key, grace=f"{grace:.0f}s")


def _drainable(pod: Pod) -> bool:
    if pod.daemon or pod.mirror:
        return False
    return tolerates(pod.tolerations, [DISRUPTED_TAINT]) is not None


def _critical(pod: Pod) -> bool:
    return pod.priority_class in ("system-cluster-critical", "system-node-critical")


def _max_grace(pods: list[Pod]) -> float:
    return max((p.grace_seconds for p in pods), default=0.0)
