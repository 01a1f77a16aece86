"""The node group controller against the real lifecycle, termination and interruption
controllers: a group comes up with its split, keeps it through interruptions and capacity
shortages without turning spot into on-demand, scales in keeping its base, and leaves the
provisioner nothing to do for pods its nodes will hold."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spotwright.controllers import InterruptionHandler
from spotwright.controllers.nodegroups import NodeGroupController
from spotwright.controllers.termination import DISRUPTED_TAINT
from spotwright.model import labels as wk
from spotwright.model.nodegroup import NODEGROUP_LABEL, NodeGroup
from spotwright.model.objects import NodeClaim

if TYPE_CHECKING:
    from conftest import World


def make_group(desired: int = 5, base: int = 1, pct: int = 50, **distribution: Any) -> NodeGroup:
    return NodeGroup.model_validate(
        {
            "name": "ng",
            "minSize": 0,
            "maxSize": 20,
            "desiredCapacity": desired,
            "labels": {"role": "worker"},
            "instancesDistribution": {
                "instanceTypes": ["m5.large", "c5.large"],
                "onDemandBaseCapacity": base,
                "onDemandPercentageAboveBaseCapacity": pct,
                **distribution,
            },
        }
    )


def group_claims(w: World, *, live: bool = True) -> list[NodeClaim]:
    return [
        c
        for c in w.claims()
        if c.labels.get(NODEGROUP_LABEL) == "ng" and (not live or c.deleting_since is None)
    ]


def split_of(w: World, *, ready: bool = False) -> tuple[int, int]:
    claims = [c for c in group_claims(w) if not ready or c.initialized_at is not None]
    od = sum(1 for c in claims if c.labels[wk.CAPACITY_TYPE] == wk.ON_DEMAND)
    return od, len(claims) - od


async def start(w: World, group: NodeGroup, *, interruptions: bool = False) -> NodeGroupController:
    controller = NodeGroupController(w.ctx, [group])
    await w.start_controllers(interruptions=interruptions)
    await w.start(controller.run())
    return controller


def test_a_group_comes_up_with_its_split_pinned_pools_and_labels(sim: Any) -> None:
    async def body(w: World) -> None:
        await start(w, make_group())  # 5 = 1 + ceil(50 % of 4) = 3 on-demand, 2 spot
        await w.until(lambda: split_of(w, ready=True) == (3, 2), within=120, what="group up")
        claims = group_claims(w)
        for claim in claims:
            assert claim.nodepool == "ng" and claim.instance_types == (claim.instance_type,)
            assert claim.capacity_type == claim.labels[wk.CAPACITY_TYPE]
            node = w.cluster.node(claim.node_name)
            assert node is not None
            assert node.labels["role"] == "worker" and node.labels[NODEGROUP_LABEL] == "ng"
        # On-demand takes the first listed type (prioritized), zones stay balanced.
        on_demand = [c for c in claims if c.capacity_type == wk.ON_DEMAND]
        assert {c.instance_type for c in on_demand} == {"m5.large"}
        assert sorted(c.zone for c in on_demand) == ["us-east-1a", "us-east-1a", "us-east-1b"]
        assert {c.zone for c in claims if c.capacity_type == wk.SPOT} == {
            "us-east-1a",
            "us-east-1b",
        }
        assert w.counter("spotwright_nodegroup_nodes", nodegroup="ng", capacity_type="spot") == 2
        assert (
            w.counter(
                "spotwright_nodegroup_target_nodes", nodegroup="ng", capacity_type="on-demand"
            )
            == 3
        )
        await w.advance(600)
        assert len(w.claim_history) == 5, "a steady group creates nothing more"

    sim.run(body)


def test_an_interrupted_spot_member_is_replaced_at_once_by_spot(sim: Any) -> None:
    async def body(w: World) -> None:
        await start(w, make_group(), interruptions=True)
        await w.until(lambda: split_of(w, ready=True) == (3, 2), within=120, what="group up")
        w.deploy("web", 4, cpu="500m", node_selector={"role": "worker"})
        await w.until(lambda: w.all_ready("web"), within=60, what="web ready")
        [hit] = w.market.interrupt(1)
        await w.advance(0.5)
        victim = next(c for c in w.claims() if c.provider_id == hit.provider_id)
        assert victim.deleting_since is not None
        # The replacement exists while the old node is still draining, and it is spot.
        assert split_of(w) == (3, 2)
        await w.until(lambda: split_of(w, ready=True) == (3, 2), within=120, what="replaced")
        await w.advance(200)
        assert w.cluster.node_claim(victim.name) is None
        assert sum(1 for c in w.claim_history if c.labels[wk.CAPACITY_TYPE] == wk.ON_DEMAND) == 3
        assert w.all_ready("web") and w.ledger.lost == 0

    sim.run(body, forward_events=True)


def test_a_spot_shortage_keeps_the_group_short_of_spot_never_on_demand(sim: Any) -> None:
    async def body(w: World) -> None:
        w.market.set_capacity(wk.SPOT, instance_types=None, zones=None, available=False)
        await start(w, make_group())
        await w.until(lambda: split_of(w, ready=True) == (3, 0), within=120, what="od up")
        await w.advance(120)
        assert split_of(w) == (3, 0), "no on-demand instead of the missing spot"
        # Every spot pool was tried once (2 types x 2 zones) before the group gave up.
        assert (
            w.counter(
                "spotwright_launch_failures_total",
                reason="InsufficientInstanceCapacity",
                capacity_type="spot",
            )
            == 4
        )
        assert any("no available spot offering for the node group" in line for line in w.log)
        w.market.set_capacity(wk.SPOT, instance_types=None, zones=None, available=True)
        # Back once the unavailable-offerings cache (3 minutes) lets the pools be tried again.
        await w.until(lambda: split_of(w, ready=True) == (3, 2), within=300, what="spot back")
        assert any("node group has its spot capacity again" in line for line in w.log)

    sim.run(body)


def test_a_shortage_in_one_pool_moves_spot_to_another_pool(sim: Any) -> None:
    async def body(w: World) -> None:
        w.market.set_capacity(wk.SPOT, instance_types=["c5.large"], zones=None, available=False)
        await start(w, make_group(desired=4, base=0, pct=0, spotInstancePools=1))
        await w.until(lambda: split_of(w, ready=True) == (0, 4), within=120, what="spot up")
        assert {c.instance_type for c in group_claims(w)} == {"m5.large"}

    sim.run(body)


def test_max_price_below_the_market_leaves_spot_unfilled(sim: Any) -> None:
    async def body(w: World) -> None:
        await start(w, make_group(desired=3, base=1, pct=0, maxPrice=0.001))
        await w.until(lambda: split_of(w, ready=True) == (1, 0), within=120, what="base up")
        await w.advance(60)
        assert split_of(w) == (1, 0)

    sim.run(body)


def test_scale_in_keeps_the_base_and_removes_spot_first(sim: Any) -> None:
    async def body(w: World) -> None:
        controller = await start(w, make_group(desired=6, base=2, pct=0))
        await w.until(lambda: split_of(w, ready=True) == (2, 4), within=120, what="group up")
        controller.groups = [make_group(desired=3, base=2, pct=0)]
        await controller.reconcile()
        assert split_of(w) == (2, 1)
        deleted = [c for c in group_claims(w, live=False) if c.deleting_since is not None]
        assert {c.deletion_reason for c in deleted} == {"nodegroup_scale_in"}
        await w.until(lambda: len(group_claims(w, live=False)) == 3, within=120, what="gone")
        controller.groups = [make_group(desired=1, base=2, pct=0)]
        await controller.reconcile()
        assert split_of(w) == (1, 0), "below the base, everything left is on-demand"

    sim.run(body)


def test_capacity_rebalance_replaces_a_recommended_node_before_it_goes(sim: Any) -> None:
    async def body(w: World) -> None:
        await start(w, make_group(desired=2, base=0, pct=0, capacityRebalance=True))
        await w.until(lambda: split_of(w, ready=True) == (0, 2), within=120, what="group up")
        old = group_claims(w)[0]
        # What the interruption handler does on a rebalance recommendation.
        await w.cluster.patch_node(old.node_name, add_taints=[DISRUPTED_TAINT])
        await w.advance(0.5)
        assert len(group_claims(w)) == 3, "a replacement is ordered at once"
        assert old.deleting_since is None, "the old node stays until the replacement is up"
        await w.until(lambda: old.deleting_since is not None, within=120, what="old deleted")
        assert old.deletion_reason == "capacity_rebalance"
        assert split_of(w, ready=True) == (0, 2)

    sim.run(body)


def test_without_capacity_rebalance_a_recommendation_changes_nothing(sim: Any) -> None:
    async def body(w: World) -> None:
        await start(w, make_group(desired=2, base=0, pct=0))
        await w.until(lambda: split_of(w, ready=True) == (0, 2), within=120, what="group up")
        old = group_claims(w)[0]
        await w.cluster.patch_node(old.node_name, add_taints=[DISRUPTED_TAINT])
        await w.advance(60)
        assert len(group_claims(w)) == 2 and old.deleting_since is None

    sim.run(body)


def test_the_provisioner_counts_booting_group_nodes_as_capacity(sim: Any) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        await start(w, make_group(desired=2, base=2, pct=100))
        w.deploy("web", 2, cpu="500m", node_selector={"role": "worker"})
        await w.until(lambda: w.all_ready("web"), within=120, what="web ready")
        assert all(c.labels.get(NODEGROUP_LABEL) == "ng" for c in w.claim_history)

    sim.run(body)


def test_a_group_can_run_alongside_the_interruption_handler_rebalance_flow(sim: Any) -> None:
    async def body(w: World) -> None:
        await w.start(InterruptionHandler(w.ctx, w.queue).run())
        await start(w, make_group(desired=2, base=0, pct=0, capacityRebalance=True))
        await w.until(lambda: split_of(w, ready=True) == (0, 2), within=120, what="group up")
        [hit] = w.market.interrupt(1, rebalance_lead_seconds=90)
        await w.until(lambda: len(group_claims(w)) == 3, within=5, what="replacement ordered")
        await w.advance(400)
        assert split_of(w, ready=True) == (0, 2)
        assert all(c.provider_id != hit.provider_id for c in w.claims())
        assert w.ledger.lost == 0

    sim.run(body, forward_events=True)
