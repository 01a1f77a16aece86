"""Leftovers that cost money are cleaned up: unregistered claims and unclaimed instances."""

from __future__ import annotations

import random

from spotwright.adapters.memory_cluster import MemoryCluster
from spotwright.adapters.sim_market import SimulatedMarket
from spotwright.adapters.virtual_loop import run_virtual
from spotwright.catalog import load_catalog
from spotwright.controllers import Context, GarbageCollector, Settings
from spotwright.model.objects import NodeClaim
from spotwright.observability.metrics import Metrics
from spotwright.ports.clock import LoopClock
from spotwright.ports.cloud import LaunchRequest, Offering

EPOCH = 1_767_225_600.0


def _world() -> tuple[Context, SimulatedMarket, MemoryCluster]:
    catalog = load_catalog()
    types = [catalog.get("m5.large")]
    clock = LoopClock(epoch=EPOCH)
    cluster = MemoryCluster(clock)
    market = SimulatedMarket(
        types,
        region="us-east-1",
        zones=["us-east-1a"],
        clock=clock,
        rng=random.Random(1),
        interruptions="none",
        on_running=lambda _i: None,  # no kubelet: the node never registers
        on_terminated=lambda _i, _r: None,
        publish=lambda _e: None,
    )
    ctx = Context(
        cluster=cluster,
        cloud=market,
        clock=clock,
        metrics=Metrics(),
        nodepools=[],
        instance_types={t.name: t for t in types},
        settings=Settings(registration_timeout_seconds=900),
    )
    return ctx, market, cluster


def _request(name: str) -> LaunchRequest:
    offering = Offering("m5.large", "us-east-1a", "on-demand", 0.096)
    return LaunchRequest(name, "default", "on-demand", (offering,))


def test_instance_without_a_claim_is_terminated_after_its_grace() -> None:
    async def main() -> list[str]:
        ctx, market, _ = _world()
        orphan = await market.launch(_request("gone"))
        gc = GarbageCollector(ctx)
        await gc.collect()  # too young: left alone
        assert [i.id for i in await market.list_owned()] == [orphan.id]
        await ctx.clock.sleep(120)
        await gc.collect()
        return [i.id for i in await market.list_owned()]

    assert run_virtual(main()) == []


def test_claimed_instance_is_kept() -> None:
    async def main() -> int:
        ctx, market, cluster = _world()
        instance = await market.launch(_request("keep"))
        claim = NodeClaim(
            name="keep",
            nodepool="default",
            provider_id=instance.provider_id,
            launched_at=ctx.clock.now(),
            registered_at=ctx.clock.now(),
        )
        await cluster.create_node_claim(claim)
        await ctx.clock.sleep(600)
        await GarbageCollector(ctx).collect()
        return len(await market.list_owned())

    assert run_virtual(main()) == 1


def test_claim_whose_node_never_registers_is_deleted_after_the_timeout() -> None:
    async def main() -> tuple[str | None, str]:
        ctx, market, cluster = _world()
        instance = await market.launch(_request("stuck"))
        claim = NodeClaim(
            name="stuck",
            nodepool="default",
            provider_id=instance.provider_id,
            launched_at=ctx.clock.now(),
        )
        await cluster.create_node_claim(claim)
        gc = GarbageCollector(ctx)
        await ctx.clock.sleep(600)
        await gc.collect()
        early = cluster.node_claim("stuck")
        assert early is not None and early.deleting_since is None
        await ctx.clock.sleep(400)
        await gc.collect()
        late = cluster.node_claim("stuck")
        assert late is not None
        return late.deletion_reason, cluster.events[-1].reason

    assert run_virtual(main()) == ("registration_timeout", "RegistrationTimeout")


def test_claim_whose_instance_vanished_is_deleted_so_it_stops_counting() -> None:
    async def main() -> tuple[str, bool]:
        ctx, market, cluster = _world()
        instance = await market.launch(_request("ghost"))
        now = ctx.clock.now()
        claim = NodeClaim(
            name="ghost",
            nodepool="default",
            provider_id=instance.provider_id,
            launched_at=now,
            registered_at=now,
        )
        await cluster.create_node_claim(claim)
        await market.terminate(instance.id)  # e.g. a state-change message that was lost
        await GarbageCollector(ctx).collect()
        gone = cluster.node_claim("ghost")
        assert gone is not None
        return gone.deletion_reason, gone.deleting_since is not None

    assert run_virtual(main()) == ("instance_terminated", True)
