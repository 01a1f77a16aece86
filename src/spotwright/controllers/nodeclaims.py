"""NodeClaim lifecycle: launch, registration, initialization.

A new claim is launched at once with the cheapest offerings of its best capacity type. When
the launch fails for lack of capacity, the failed offerings (or, for a quota error, the
whole capacity type) go into the unavailable-offerings cache and the claim is deleted: its
pods are still pending, and the next scheduling round, which no longer sees those
offerings, falls back to what is left. A claim is registered when a node with its
provider ID appears, and initialized when that node is ready.

A launch that has not succeeded within the launch timeout (5 minutes, as Karpenter's) is
given up the same way: the claim is deleted and its pods, still pending, get a new claim.
Until then, errors that are not about capacity (throttling, a 5xx, a permission being
fixed) are retried with backoff rather than deleting the claim at the first one. An
abandoned request may still start an instance; it carries the claim's tag, no claim knows
it, and garbage collection terminates it. A claim whose node never registers is the
garbage collector's (see ``garbage_collection``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from spotwright.controllers.context import Context
from spotwright.model import labels as wk
from spotwright.model.nodes import compat_labels, node_labels
from spotwright.model.objects import Node, NodeClaim
from spotwright.model.resources import Resources
from spotwright.observability.logs import get_logger
from spotwright.ports.cloud import (
    CloudError,
    Instance,
    InsufficientCapacityError,
    LaunchRequest,
    QuotaExceededError,
)
from spotwright.ports.cluster import NotFound
from spotwright.scheduling import ClaimPlan, choose_offerings

__all__ = ["NodeClaimLifecycle"]

log = get_logger("nodeclaim.lifecycle")

#: Backoff between launch attempts after an error that is not about capacity.
_RETRY_MIN = 0.1
_RETRY_MAX = 10.0


class NodeClaimLifecycle:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._launching: dict[str, asyncio.Task[None]] = {}

    def _forget(self, name: str) -> Callable[[asyncio.Task[None]], None]:
        def forget(_task: asyncio.Task[None]) -> None:
            self._launching.pop(name, None)

        return forget

    async def run(self) -> None:
        async for event in self.ctx.cluster.watch("nodeclaim", "node"):
            if event.kind == "nodeclaim" and event.type == "ADDED":
                claim = self.ctx.cluster.node_claim(event.name)
                if claim is not None and _needs_launch(claim) and claim.name not in self._launching:
                    task = asyncio.create_task(self.launch(claim))
                    self._launching[claim.name] = task
                    task.add_done_callback(self._forget(claim.name))
            elif event.kind == "node" and event.type != "DELETED":
                await self._sync_node(event.name)

    async def launch(self, claim: NodeClaim) -> None:
        ctx = self.ctx
        now = ctx.clock.now()
        offerings = ctx.unavailable.apply(ctx.cloud.offerings(), now)
        plan = ClaimPlan(
            nodepool=claim.nodepool,
            pods=[],
            requests=claim.requests,
            instance_types=claim.instance_types,
            requirements=claim.requirements,
            labels=claim.labels,
            taints=claim.taints,
        )
        choice = choose_offerings(
            plan, ctx.instance_types, offerings, max_types=ctx.settings.max_instance_types
        )
        if choice is None:
            log.error("could not launch nodeclaim, no available offering", nodeclaim=claim.name)
            ctx.metrics.launch_failures.labels("NoAvailableOffering", "").inc()
            await self._abandon(claim, "no available offering")
            return
        capacity_type, chosen = choice
        tags = (
            ("karpenter.sh/nodeclaim", claim.name),
            ("karpenter.sh/nodepool", claim.nodepool),
        )
        request = LaunchRequest(
            claim.name,
            claim.nodepool,
            capacity_type,
            chosen,
            tags,
            claim.node_class or None,
            labels=_registration_labels(claim, capacity_type),
            taints=(*claim.taints, *claim.startup_taints),
        )
        deadline = now + ctx.settings.launch_timeout_seconds - _age(claim, now)
        instance = await self._call_launch(claim, request, deadline)
        if instance is None:
            return
        current = ctx.cluster.node_claim(claim.name)
        if current is None or current.deleting_since is not None:
            # Deleted while launching (timed out, removed by hand): do not leak the instance.
            await self._drop_instance(claim.name, instance)
            return
        itype = ctx.instance_types[instance.instance_type]
        current.provider_id = instance.provider_id
        current.instance_type = instance.instance_type
        current.zone = instance.zone
        current.capacity_type = instance.capacity_type
        current.price = instance.price
        current.allocatable = itype.allocatable
        current.launched_at = ctx.clock.now()
        try:
            await ctx.cluster.update_node_claim(current)
        except NotFound:
            # Removed between the read above and the write (a mass termination does that).
            await self._drop_instance(claim.name, instance)
            return
        ctx.metrics.nodes_launched.labels(
            claim.nodepool, instance.capacity_type, instance.instance_type
        ).inc()
        log.info(
            "launched nodeclaim",
            nodeclaim=claim.name,
            provider_id=instance.provider_id,
            instance_type=instance.instance_type,
            zone=instance.zone,
            capacity_type=instance.capacity_type,
            price=f"${instance.price:.4f}/h",
            allocatable=itype.allocatable.describe(),
        )
        await ctx.cluster.record_event(
            "NodeClaim",
            claim.name,
            "Launched",
            f"Launched {instance.capacity_type} {instance.instance_type} in {instance.zone}",
        )

    async def _drop_instance(self, claim_name: str, instance: Instance) -> None:
        """Terminate the instance of a claim that went away while it launched; were this to
        fail, the instance carries the claim's tag and garbage collection terminates it."""
        try:
            await self.ctx.cloud.terminate(instance.id)
        except CloudError as exc:
            log.warning(
                "could not terminate the instance of a vanished nodeclaim, leaving it to "
                "garbage collection",
                nodeclaim=claim_name,
                instance_id=instance.id,
                error=str(exc),
            )
            return
        log.info(
            "terminated instance of a nodeclaim deleted while it launched",
            nodeclaim=claim_name,
            instance_id=instance.id,
        )

    async def _call_launch(
        self, claim: NodeClaim, request: LaunchRequest, deadline: float
    ) -> Instance | None:
        """The launched instance, or None once the claim has been given up.

        Capacity errors give the claim up at once, so the next round picks other
        offerings. Any other error (throttling, a 5xx, a permission being fixed) is
        retried with backoff, as Karpenter requeues it, until the launch timeout.
        """
        ctx = self.ctx
        capacity_type = request.capacity_type
        delay = _RETRY_MIN
        while True:
            try:
                return await asyncio.wait_for(
                    ctx.cloud.launch(request), max(deadline - ctx.clock.now(), 0.0)
                )
            except TimeoutError:
                await self._time_out(claim, capacity_type)
                return None
            except InsufficientCapacityError as exc:
                await self._capacity_short(claim, capacity_type, exc)
                return None
            except QuotaExceededError as exc:
                ctx.unavailable.mark_capacity_type(exc.capacity_type, ctx.clock.now())
                ctx.metrics.launch_failures.labels(exc.code, exc.capacity_type).inc()
                log.error(
                    f"{exc.code}, avoiding capacity type {exc.capacity_type} for "
                    f"{_short(ctx.settings.unavailable_ttl_seconds)}",
                    nodeclaim=claim.name,
                )
                await self._abandon(claim, f"{exc.code}: {exc.message}")
                return None
            except CloudError as exc:
                ctx.metrics.launch_failures.labels(exc.code, capacity_type).inc()
                if ctx.clock.now() + delay >= deadline:
                    await self._time_out(claim, capacity_type, last_error=str(exc))
                    return None
                log.error(
                    "could not launch nodeclaim, retrying",
                    nodeclaim=claim.name,
                    error=str(exc),
                    retry_in=f"{delay:g}s",
                )
                await ctx.clock.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX)
                current = ctx.cluster.node_claim(claim.name)
                if current is None or current.deleting_since is not None:
                    return None  # deleted meanwhile: nothing left to launch for

    async def _capacity_short(
        self, claim: NodeClaim, capacity_type: str, exc: InsufficientCapacityError
    ) -> None:
        """Avoid every offering that failed for the cache's TTL, and give the claim up."""
        ctx = self.ctx
        now = ctx.clock.now()
        for err in exc.errors:
            o = err.offering
            ctx.unavailable.mark_offering(o.capacity_type, o.instance_type, o.zone, now)
            ctx.metrics.launch_failures.labels(err.code, o.capacity_type).inc()
            log.debug(
                f"{err.code} for offering {{ instanceType: {o.instance_type}, "
                f"zone: {o.zone}, capacityType: {o.capacity_type} }}, avoiding for "
                f"{_short(ctx.settings.unavailable_ttl_seconds)}"
            )
        pools = sorted({e.offering.instance_type for e in exc.errors})
        log.error(
            f"{exc.code} for {len(exc.errors)} offering(s), avoiding them for "
            f"{_short(ctx.settings.unavailable_ttl_seconds)}",
            nodeclaim=claim.name,
            capacity_type=capacity_type,
            instance_types=", ".join(pools[:5]) + (" ..." if len(pools) > 5 else ""),
        )
        await self._abandon(claim, f"{exc.code}: {exc.message}")

    async def _time_out(
        self, claim: NodeClaim, capacity_type: str, *, last_error: str = ""
    ) -> None:
        ctx = self.ctx
        timeout = ctx.settings.launch_timeout_seconds
        ctx.metrics.launch_failures.labels("LaunchTimeout", capacity_type).inc()
        message = f"Launch did not succeed within {_short(timeout)}"
        if last_error:
            message += f" (last error: {last_error})"
        log.error(
            f"deleting nodeclaim, launch did not succeed within {_short(timeout)}",
            nodeclaim=claim.name,
            capacity_type=capacity_type,
            last_error=last_error or None,
        )
        await self._abandon(claim, message, reason="LaunchTimeout", metric="launch_timeout")

    async def _abandon(
        self,
        claim: NodeClaim,
        message: str,
        *,
        reason: str = "LaunchFailed",
        metric: str = "insufficient_capacity",
    ) -> None:
        """Delete a claim that never got an instance; its pods are still pending."""
        ctx = self.ctx
        ctx.metrics.nodeclaims_terminated.labels(metric).inc()
        await ctx.cluster.record_event("NodeClaim", claim.name, reason, message, warning=True)
        try:
            await ctx.cluster.remove_node_claim(claim.name)
        except NotFound:
            log.debug("nodeclaim already gone", nodeclaim=claim.name)

    async def _sync_node(self, node_name: str) -> None:
        ctx = self.ctx
        node = ctx.cluster.node(node_name)
        if node is None or not node.provider_id:
            return
        claim = next(
            (c for c in ctx.cluster.node_claims() if c.provider_id == node.provider_id), None
        )
        if claim is None:
            return
        now = ctx.clock.now()
        changed = False
        if claim.registered_at is None:
            claim.registered_at = now
            claim.node_name = node.name
            changed = True
            log.info("registered nodeclaim", nodeclaim=claim.name, node=node.name)
            await self._complete_node(node, claim)
        if node.ready and claim.initialized_at is None and not _startup_tainted(node, claim):
            claim.initialized_at = now
            changed = True
            log.info(
                "initialized nodeclaim",
                nodeclaim=claim.name,
                node=node.name,
                allocatable=(claim.allocatable or Resources()).describe(),
            )
        if changed:
            try:
                await ctx.cluster.update_node_claim(claim)
            except NotFound:
                # Removed since the node appeared (a mass termination): nothing to track.
                log.debug(
                    "nodeclaim gone before its registration was written", nodeclaim=claim.name
                )

    async def _complete_node(self, node: Node, claim: NodeClaim) -> None:
        """Give a newly registered node the labels and taints its claim promised.

        Pods were placed on the claim by those labels (the NodePool's, the instance
        type's, the capacity type in Karpenter's, EKS's and eksctl's words) and kept off
        it by those taints, but a kubelet started from the user's own bootstrap knows
        none of them; like Karpenter's registration, this adds whatever is missing (and
        never changes what the kubelet set).
        """
        ctx = self.ctx
        itype = ctx.instance_types.get(claim.instance_type)
        if itype is None:
            return
        want = node_labels(
            claim=claim,
            instance_type=itype,
            zone=claim.zone,
            region=ctx.cloud.region,
            capacity_type=claim.capacity_type,
            hostname=node.labels.get(wk.HOSTNAME, node.name),
        )
        labels: dict[str, str | None] = {k: v for k, v in want.items() if k not in node.labels}
        present = {(t.key, t.effect) for t in node.taints}
        # startup taints go on only now: once an agent has removed them, they stay off
        wanted = (*claim.taints, *claim.startup_taints)
        taints = [t for t in wanted if (t.key, t.effect) not in present]
        if not labels and not taints:
            return
        try:
            await ctx.cluster.patch_node(node.name, add_taints=taints, labels=labels)
        except NotFound:
            return
        log.info(
            "added the nodeclaim's labels and taints to its node",
            nodeclaim=claim.name,
            node=node.name,
            labels=", ".join(sorted(labels)) or None,
            taints=", ".join(str(t) for t in taints) or None,
        )


def _registration_labels(claim: NodeClaim, capacity_type: str) -> tuple[tuple[str, str], ...]:
    """The labels a node of ``claim`` registers with before the instance type is known: the
    claim's, its NodePool and capacity type (also in EKS's and eksctl's words)."""
    labels = {**claim.labels, wk.NODEPOOL: claim.nodepool, wk.CAPACITY_TYPE: capacity_type}
    for key, value in compat_labels(capacity_type).items():
        labels.setdefault(key, value)
    return tuple(sorted(labels.items()))


def _startup_tainted(node: Node, claim: NodeClaim) -> bool:
    """Whether a startup taint is still on the node: until its agent removes them all, the
    node is not initialized (Karpenter's rule), though pods are already bound for it."""
    startup = {(t.key, t.effect) for t in claim.startup_taints}
    return any((t.key, t.effect) in startup for t in node.taints)


def _needs_launch(claim: NodeClaim) -> bool:
    """A claim seen again (a restart lists every claim as added) must not launch twice."""
    return not claim.provider_id and claim.launched_at is None and claim.deleting_since is None


def _age(claim: NodeClaim, now: float) -> float:
    """Seconds since the claim was created; 0 when its creation time is unknown (0)."""
    return now - claim.created_at if claim.created_at > 0 else 0.0


def _short(seconds: float) -> str:
    return f"{int(seconds // 60)}m" if seconds >= 60 and seconds % 60 == 0 else f"{seconds:g}s"
