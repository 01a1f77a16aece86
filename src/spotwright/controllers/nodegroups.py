"""Node groups: a fixed number of nodes, split between on-demand and spot like an ASG.

A node group (eksctl's ``nodeGroups[]`` item with an ``instancesDistribution``) wants
``desired`` instances, a base of them on-demand and a percentage of the rest. This
controller keeps that count by writing node claims and nothing else: each claim is pinned
to one capacity type and one pool (instance type and zone) chosen by the group's
allocation strategy, so the ordinary NodeClaim lifecycle launches it, the interruption
handler and the termination controller drain it, and garbage collection leaves it alone
because a claim owns it. Deleting a claim is, here too, the only way to end an instance.

What an Auto Scaling group would do, this does:

- an interrupted spot member (its claim deleted by the interruption handler) is replaced
  at once by a new spot claim, while the old node drains;
- with ``capacityRebalance``, a spot member whose node got a rebalance recommendation
  (tainted or cordoned by the handler) is replaced right away, and deleted once the
  replacement is initialized;
- a launch that fails for lack of capacity marks the pool unavailable (the lifecycle
  controller does that) and the next claim goes to another pool of the same capacity
  type. The group never turns a spot shortfall into on-demand: it stays short, says so,
  and tries again every ``pending_retry_seconds`` until a pool has capacity.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence

from spotwright.controllers.context import Context
from spotwright.model import labels as wk
from spotwright.model.nodegroup import NODEGROUP_LABEL, NodeGroup
from spotwright.model.objects import NodeClaim, NodeSelectorRequirement
from spotwright.observability.logs import get_logger
from spotwright.ports.cloud import Offering
from spotwright.scheduling.distribution import (
    Member,
    PoolOffer,
    Split,
    choose_on_demand_pool,
    choose_spot_pool,
    plan_scale,
    split,
)

__all__ = ["NodeGroupController", "group_target"]

log = get_logger("nodegroup")

_CAPACITY_TYPES = (wk.ON_DEMAND, wk.SPOT)


def group_target(group: NodeGroup) -> Split:
    """The on-demand/spot split ``group`` is kept at."""
    return split(group.desired, group.on_demand_base, group.on_demand_percentage)


class NodeGroupController:
    def __init__(self, ctx: Context, groups: Sequence[NodeGroup]) -> None:
        self.ctx = ctx
        self.groups = list(groups)
        ctx.nodegroup_names.update(g.name for g in self.groups)  # for ownership checks
        self._trigger = asyncio.Event()
        self._serial = 0
        #: Instances a group could not place, by (group, capacity type), as last reported.
        self._short: dict[tuple[str, str], int] = {}

    async def run(self) -> None:
        pools = {pool.name for pool in self.ctx.nodepools}
        for group in self.groups:
            if group.name in pools:
                log.warning(
                    "a NodePool has the node group's name: its limits will count the group's "
                    "nodes; rename one of them",
                    nodegroup=group.name,
                )
            unknown = [t for t in group.instance_types if t not in self.ctx.instance_types]
            if unknown:
                log.warning(
                    "node group lists instance types this cloud does not offer",
                    nodegroup=group.name,
                    instance_types=", ".join(unknown),
                )
        watcher = asyncio.create_task(self._watch())
        retry = asyncio.create_task(self._retry_loop())
        self._trigger.set()
        try:
            while True:
                await self._trigger.wait()
                self._trigger.clear()
                await self.reconcile()
        finally:
            watcher.cancel()
            retry.cancel()

    async def _watch(self) -> None:
        # Any claim or node change may concern a group: a deleted claim, a launch that
        # failed, a node tainted by a rebalance recommendation, a replacement now ready.
        async for _event in self.ctx.cluster.watch("nodeclaim", "node"):
            self._trigger.set()

    async def _retry_loop(self) -> None:
        """A group left short (no pool available) tries again every ``pending_retry_seconds``."""
        while True:
            await self.ctx.clock.sleep(self.ctx.settings.pending_retry_seconds)
            if any(self._short.values()):
                self._trigger.set()

    async def reconcile(self) -> None:
        """One pass over every group: scale, replace, rebalance."""
        ctx = self.ctx
        now = ctx.clock.now()
        offerings = ctx.unavailable.apply(ctx.cloud.offerings(), now)
        for group in self.groups:
            await self._reconcile_group(group, offerings, now)

    async def _reconcile_group(
        self, group: NodeGroup, offerings: Sequence[Offering], now: float
    ) -> None:
        cluster = self.ctx.cluster
        live = [
            c
            for c in cluster.node_claims()
            if c.labels.get(NODEGROUP_LABEL) == group.name and c.deleting_since is None
        ]
        at_risk = [c for c in live if group.capacity_rebalance and self._at_risk(c)]
        risky = {c.name for c in at_risk}
        members = [_member(c) for c in live if c.name not in risky]
        target = group_target(group)
        plan = plan_scale(members, target)
        for name in plan.remove:
            await self._delete(name, "nodegroup_scale_in", group)
        kept = [m for m in members if m.name not in plan.remove]
        od_offers, spot_offers = self._offers(group, offerings)
        placed = {
            ct: Counter((m.instance_type, m.zone) for m in kept if m.capacity_type == ct)
            for ct in _CAPACITY_TYPES
        }
        for capacity_type, count in ((wk.ON_DEMAND, plan.add_on_demand), (wk.SPOT, plan.add_spot)):
            missing = 0
            for _ in range(count):
                if capacity_type == wk.ON_DEMAND:
                    offer = choose_on_demand_pool(od_offers, placed[capacity_type])
                else:
                    offer = choose_spot_pool(
                        spot_offers,
                        placed[capacity_type],
                        group.spot_allocation_strategy,
                        spot_instance_pools=group.spot_instance_pools,
                    )
                if offer is None:
                    missing += 1
                    continue
                placed[capacity_type][offer.pool] += 1
                await self._create(group, capacity_type, offer, now)
            self._report_short(group, capacity_type, missing, target)
        for claim in at_risk:
            capacity_type = _capacity_type(claim)
            ready = sum(1 for m in kept if m.capacity_type == capacity_type and m.ready)
            if ready >= target.of(capacity_type):
                await self._delete(claim.name, "capacity_rebalance", group)
        self._observe(group, kept, target)

    # -- reading the cluster ------------------------------------------------------------
    def _at_risk(self, claim: NodeClaim) -> bool:
        """The interruption handler marked the node (rebalance recommendation): taint or cordon."""
        node = self.ctx.cluster.node(claim.node_name) if claim.node_name else None
        if node is None:
            return False
        return node.unschedulable or any(t.key == wk.DISRUPTED_TAINT_KEY for t in node.taints)

    def _offers(
        self, group: NodeGroup, offerings: Sequence[Offering]
    ) -> tuple[list[PoolOffer], list[PoolOffer]]:
        """The pools the group may launch into now, by capacity type.

        Spot pools dearer than ``maxPrice`` (default: the type's on-demand price) are left
        out, as EC2 would not fill a request whose max price is below the spot price.
        """
        priority = {name: index for index, name in enumerate(group.instance_types)}
        zones = group.zones
        on_demand: list[PoolOffer] = []
        spot: list[PoolOffer] = []
        for offer in offerings:
            if not offer.available or offer.instance_type not in priority:
                continue
            if zones is not None and offer.zone not in zones:
                continue
            itype = self.ctx.instance_types.get(offer.instance_type)
            if itype is None:
                continue
            pool = PoolOffer(
                offer.instance_type,
                offer.zone,
                offer.price,
                priority[offer.instance_type],
                itype.interruption_band,
            )
            if offer.capacity_type == wk.ON_DEMAND:
                on_demand.append(pool)
            elif offer.capacity_type == wk.SPOT:
                ceiling = group.max_price if group.max_price is not None else itype.od_price
                if offer.price <= ceiling + 1e-12:
                    spot.append(pool)
        return on_demand, spot

    # -- writing claims -------------------------------------------------------------------
    async def _create(
        self, group: NodeGroup, capacity_type: str, offer: PoolOffer, now: float
    ) -> None:
        ctx = self.ctx
        name = self._next_name(group.name)
        labels = group.node_labels()
        labels.update(
            {
                wk.CAPACITY_TYPE: capacity_type,
                wk.INSTANCE_TYPE: offer.instance_type,
                wk.ZONE: offer.zone,
            }
        )
        claim = NodeClaim(
            name=name,
            nodepool=group.name,
            requirements=(
                NodeSelectorRequirement(wk.CAPACITY_TYPE, "In", (capacity_type,)),
                NodeSelectorRequirement(wk.INSTANCE_TYPE, "In", (offer.instance_type,)),
                NodeSelectorRequirement(wk.ZONE, "In", (offer.zone,)),
            ),
            instance_types=(offer.instance_type,),
            labels=labels,
            taints=group.node_taints(),
            created_at=now,
        )
        await ctx.cluster.create_node_claim(claim)
        ctx.metrics.nodeclaims_created.labels(group.name).inc()
        log.info(
            "created nodeclaim for node group",
            nodegroup=group.name,
            nodeclaim=name,
            capacity_type=capacity_type,
            instance_type=offer.instance_type,
            zone=offer.zone,
            price=f"${offer.price:.4f}/h",
        )

    def _next_name(self, group: str) -> str:
        while True:
            self._serial += 1
            name = f"{group}-{self._serial:05d}"
            if self.ctx.cluster.node_claim(name) is None:
                return name

    async def _delete(self, name: str, reason: str, group: NodeGroup) -> None:
        ctx = self.ctx
        claim = ctx.cluster.node_claim(name)
        if claim is None or claim.deleting_since is not None:
            return
        claim.deleting_since = ctx.clock.now()
        claim.deletion_reason = reason
        await ctx.cluster.update_node_claim(claim)
        log.info(
            "deleting nodeclaim of node group",
            nodegroup=group.name,
            nodeclaim=name,
            capacity_type=_capacity_type(claim),
            reason=reason,
        )

    # -- reporting ------------------------------------------------------------------------
    def _report_short(
        self, group: NodeGroup, capacity_type: str, missing: int, target: Split
    ) -> None:
        key = (group.name, capacity_type)
        if self._short.get(key, 0) == missing:
            return
        self._short[key] = missing
        if missing:
            log.warning(
                f"no available {capacity_type} offering for the node group, retrying",
                nodegroup=group.name,
                missing=missing,
                target=target.of(capacity_type),
                retry_in=f"{self.ctx.settings.pending_retry_seconds:g}s",
            )
        else:
            log.info(
                f"node group has its {capacity_type} capacity again",
                nodegroup=group.name,
                target=target.of(capacity_type),
            )

    def _observe(self, group: NodeGroup, members: Sequence[Member], target: Split) -> None:
        metrics = self.ctx.metrics
        for capacity_type in _CAPACITY_TYPES:
            have = sum(1 for m in members if m.capacity_type == capacity_type)
            metrics.nodegroup_nodes.labels(group.name, capacity_type).set(have)
            metrics.nodegroup_target.labels(group.name, capacity_type).set(target.of(capacity_type))


def _capacity_type(claim: NodeClaim) -> str:
    return claim.capacity_type or claim.labels.get(wk.CAPACITY_TYPE, wk.SPOT)


def _member(claim: NodeClaim) -> Member:
    return Member(
        name=claim.name,
        capacity_type=_capacity_type(claim),
        instance_type=claim.instance_type or claim.labels.get(wk.INSTANCE_TYPE, ""),
        zone=claim.zone or claim.labels.get(wk.ZONE, ""),
        ready=claim.initialized_at is not None,
        created_at=claim.created_at,
    )
