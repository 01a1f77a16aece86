"""NodeClaim lifecycle: launch, registration, initialization.

A new claim is launched at once with the cheapest offerings of its best capacity type. When
the launch fails for lack of capacity, the failed offerings (or, for a quota error, the
whole capacity type) go into the unavailable-offerings cache and the claim is deleted: its
pods are still pending, and the next scheduling round, which no longer sees those
offerings, falls back to what is left. A claim is registered when a node with its
provider ID appears, and initialized when that node is ready.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from spotwright.controllers.context import Context
from spotwright.model.objects import NodeClaim
from spotwright.model.resources import Resources
from spotwright.observability.logs import get_logger
from spotwright.ports.cloud import (
    CloudError,
    InsufficientCapacityError,
    LaunchRequest,
    QuotaExceededError,
)
from spotwright.scheduling import ClaimPlan, choose_offerings

__all__ = ["NodeClaimLifecycle"]

log = get_logger("nodeclaim.lifecycle")


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
                if claim is not None and claim.name not in self._launching:
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
        request = LaunchRequest(claim.name, claim.nodepool, capacity_type, chosen, tags)
        try:
            instance = await ctx.cloud.launch(request)
        except InsufficientCapacityError as exc:
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
            return
        except QuotaExceededError as exc:
            ctx.unavailable.mark_capacity_type(exc.capacity_type, ctx.clock.now())
            ctx.metrics.launch_failures.labels(exc.code, exc.capacity_type).inc()
            log.error(
                f"{exc.code}, avoiding capacity type {exc.capacity_type} for "
                f"{_short(ctx.settings.unavailable_ttl_seconds)}",
                nodeclaim=claim.name,
            )
            await self._abandon(claim, f"{exc.code}: {exc.message}")
            return
        except CloudError as exc:
            ctx.metrics.launch_failures.labels(exc.code, capacity_type).inc()
            log.error("could not launch nodeclaim", nodeclaim=claim.name, error=str(exc))
            await self._abandon(claim, str(exc))
            return
        current = ctx.cluster.node_claim(claim.name)
        if current is None:  # deleted while launching: do not leak the instance
            await ctx.cloud.terminate(instance.id)
            return
        itype = ctx.instance_types[instance.instance_type]
        current.provider_id = instance.provider_id
        current.instance_type = instance.instance_type
        current.zone = instance.zone
        current.capacity_type = instance.capacity_type
        current.price = instance.price
        current.allocatable = itype.allocatable
        current.launched_at = ctx.clock.now()
        await ctx.cluster.update_node_claim(current)
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

    async def _abandon(self, claim: NodeClaim, reason: str) -> None:
        ctx = self.ctx
        ctx.metrics.nodeclaims_terminated.labels("insufficient_capacity").inc()
        await ctx.cluster.record_event(
            "NodeClaim", claim.name, "LaunchFailed", reason, warning=True
        )
        await ctx.cluster.remove_node_claim(claim.name)

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
        if node.ready and claim.initialized_at is None:
            claim.initialized_at = now
            changed = True
            log.info(
                "initialized nodeclaim",
                nodeclaim=claim.name,
                node=node.name,
                allocatable=(claim.allocatable or Resources()).describe(),
            )
        if changed:
            await ctx.cluster.update_node_claim(claim)


def _short(seconds: float) -> str:
    return f"{int(seconds // 60)}m" if seconds >= 60 and seconds % 60 == 0 else f"{seconds:g}s"
