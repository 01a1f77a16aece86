"""Claims that never become nodes are given up, and their pods still end up running.

Two ways a claim gets stuck in the wild: the launch call never comes back (an API that
hangs, a throttled region), and the instance starts but its node never joins (a bad AMI,
a broken bootstrap script). Karpenter deletes such claims after 5 minutes without a launch
and 15 minutes without a registration; spotwright does the same, and what a user cares
about is the end of the story: the pods run on a replacement, and no instance is left
running (and billing) behind the abandoned claim. Each test runs the real controllers
against the in-memory cluster and the simulated market, in virtual time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from spotwright.catalog import InstanceType
from spotwright.controllers import GarbageCollector, NodeClaimLifecycle, Provisioner, Settings
from spotwright.controllers.provisioning import _NAME_ALPHABET
from spotwright.model.objects import Node
from spotwright.ports.cloud import Cloud, CloudError, Instance, LaunchRequest, Offering

if TYPE_CHECKING:
    from conftest import Simulator, World


class SlowLaunches:
    """The market, except that its first ``count`` launch calls take ``delay`` seconds
    (forever when None) before they go through."""

    def __init__(self, market: Cloud, w: World, *, count: int, delay: float | None) -> None:
        self.market = market
        self.region = market.region
        self.w = w
        self.slow_left = count
        self.delay = delay
        self.requests: list[LaunchRequest] = []

    def instance_types(self) -> Sequence[InstanceType]:
        return self.market.instance_types()

    def offerings(self) -> Sequence[Offering]:
        return self.market.offerings()

    async def launch(self, request: LaunchRequest) -> Instance:
        self.requests.append(request)
        if self.slow_left > 0:
            self.slow_left -= 1
            if self.delay is None:
                await asyncio.Event().wait()  # never set: the call hangs
            else:
                await self.w.clock.sleep(self.delay)
        return await self.market.launch(request)

    async def terminate(self, instance_id: str) -> None:
        await self.market.terminate(instance_id)

    async def describe(self, instance_ids: Sequence[str]) -> list[Instance]:
        return await self.market.describe(instance_ids)

    async def list_owned(self) -> list[Instance]:
        return await self.market.list_owned()


async def start_all(w: World) -> None:
    await w.start_controllers()
    await w.start(GarbageCollector(w.ctx).run())


def running(w: World) -> list[Instance]:
    return [i for i in w.market.instances() if i.state in ("pending", "running")]


# -- launch timeout -----------------------------------------------------------------------


def test_a_launch_that_hangs_is_given_up_after_five_minutes_and_the_pods_run_elsewhere(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        cloud = SlowLaunches(w.market, w, count=1, delay=None)
        w.ctx.cloud = cloud
        await start_all(w)
        w.deploy("web", 3)
        took = await w.until(lambda: w.all_ready("web"), within=900, what="web ready")
        first, second = w.claim_history
        assert w.cluster.node_claim(first.name) is None
        [event] = w.events("LaunchTimeout", first.name)
        assert event.warning and "5m" in event.message
        assert (
            w.counter(
                "spotwright_launch_failures_total", reason="LaunchTimeout", capacity_type="spot"
            )
            == 1
        )
        assert w.counter("spotwright_nodeclaims_terminated_total", reason="launch_timeout") == 1
        nodes = {p.node_name for p in w.pods_of("web")}
        assert nodes == {second.node_name}
        assert 300 <= took < 300 + 120  # the timeout, then one launch and one boot
        assert len(cloud.requests) == 2

    sim.run(body)


def test_the_launch_timeout_is_a_setting(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        w.ctx.cloud = SlowLaunches(w.market, w, count=1, delay=None)
        await start_all(w)
        w.deploy("web", 1)
        took = await w.until(lambda: w.all_ready("web"), within=900, what="web ready")
        assert 60 <= took < 60 + 120
        assert "1m" in w.events("LaunchTimeout")[0].message

    sim.run(body, settings=Settings(launch_timeout_seconds=60))


def test_a_launch_that_returns_after_the_timeout_leaves_no_instance_running(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        w.ctx.cloud = SlowLaunches(w.market, w, count=1, delay=420)
        await start_all(w)
        w.deploy("web", 2)
        await w.until(lambda: w.all_ready("web"), within=900, what="web ready")
        await w.advance(600)  # the slow launch has come back by now
        [claim] = w.claims()
        assert [i.provider_id for i in running(w)] == [claim.provider_id]
        assert w.all_ready("web")

    sim.run(body)


def test_a_claim_nobody_is_launching_is_deleted_by_the_sweep(sim: Simulator) -> None:
    """A claim left unlaunched (its controller died mid-launch) does not block its pods."""

    async def body(w: World) -> None:
        w.add_nodepool()
        await w.start(Provisioner(w.ctx).run(), GarbageCollector(w.ctx).run())
        w.deploy("web", 2)
        await w.advance(30)
        [orphan] = w.claims()  # no lifecycle controller: nothing launches it
        await w.until(
            lambda: orphan.deleting_since is not None, within=300 + 130, what="claim deleted"
        )
        assert orphan.deletion_reason == "launch_timeout"
        assert w.events("LaunchTimeout", orphan.name)
        assert w.rel(orphan.deleting_since) - w.rel(orphan.created_at) >= 300

    sim.run(body)


def test_a_claim_seen_again_after_a_restart_is_not_launched_twice(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        await w.start_controllers()
        w.deploy("web", 2)
        await w.until(lambda: w.all_ready("web"), within=120, what="web ready")
        [claim] = w.claims()
        # A restarted controller's informer lists every claim again as ADDED.
        await w.start(NodeClaimLifecycle(w.ctx).run())
        await w.cluster.create_node_claim(claim)
        await w.advance(60)
        assert len(w.market.instances()) == 1
        assert [i.provider_id for i in running(w)] == [claim.provider_id]

    sim.run(body)


# -- registration timeout -----------------------------------------------------------------


def test_a_node_that_never_registers_is_replaced_after_fifteen_minutes(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        register = w.cluster.register_node
        lost: list[str] = []

        def first_never_joins(node: Node) -> None:
            if not lost:
                lost.append(node.name)  # a broken bootstrap: the kubelet never starts
                return
            register(node)

        w.cluster.register_node = first_never_joins  # type: ignore[method-assign]
        await start_all(w)
        w.deploy("web", 3)
        took = await w.until(lambda: w.all_ready("web"), within=1800, what="web ready")
        first, second = w.claim_history
        assert first.launched_at is not None and first.registered_at is None
        assert first.deletion_reason == "registration_timeout"
        assert w.events("RegistrationTimeout", first.name)[0].warning
        assert w.cluster.node_claim(first.name) is None
        # 15 minutes after launch, found by a sweep that runs every 2 minutes.
        assert 900 <= took < 900 + 120 + 120
        assert {p.node_name for p in w.pods_of("web")} == {second.node_name}
        assert [i.provider_id for i in running(w)] == [second.provider_id]
        assert w.counter("spotwright_nodeclaims_terminated_total", reason="registration_timeout")

    sim.run(body)


# -- names --------------------------------------------------------------------------------


def test_claims_are_named_like_karpenters_and_the_same_on_every_run(sim: Simulator) -> None:
    async def body(w: World) -> list[str]:
        w.add_nodepool("spot-pool")
        await w.start(Provisioner(w.ctx).run())
        w.deploy("a", 1, cpu="7")
        w.deploy("b", 1, cpu="7")
        w.deploy("c", 1, cpu="7")
        await w.advance(20)
        return [c.name for c in w.claim_history]

    names = sim.run(body)
    assert len(names) == 3 and len(set(names)) == 3
    for name in names:
        prefix, _, suffix = name.rpartition("-")
        assert prefix == "spot-pool"
        assert len(suffix) == 5 and set(suffix) <= set(_NAME_ALPHABET)
    assert sim.run(body) == names


class FlakyLaunches(SlowLaunches):
    """The market, except that launch calls fail with ``code`` while ``failing`` is set."""

    def __init__(self, market: Cloud, w: World, code: str) -> None:
        super().__init__(market, w, count=0, delay=None)
        self.code = code
        self.failing = True

    async def launch(self, request: LaunchRequest) -> Instance:
        self.requests.append(request)
        if self.failing:
            raise CloudError(self.code, "injected")
        return await self.market.launch(request)


def test_a_transient_launch_error_is_retried_on_the_same_claim(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        cloud = FlakyLaunches(w.market, w, "RequestLimitExceeded")
        w.ctx.cloud = cloud
        await start_all(w)
        w.deploy("web", 2)
        await w.advance(30)
        assert len(cloud.requests) > 2  # retried, with backoff
        cloud.failing = False
        await w.until(lambda: w.all_ready("web"), within=120, what="web ready")
        assert len(w.claim_history) == 1  # never given up, never replaced
        assert w.events("LaunchFailed") == [] and w.events("LaunchTimeout") == []

    sim.run(body)


def test_an_error_that_never_clears_ends_in_the_launch_timeout(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        cloud = FlakyLaunches(w.market, w, "UnauthorizedOperation")
        w.ctx.cloud = cloud
        await start_all(w)
        w.deploy("web", 1)
        await w.until(lambda: len(w.claim_history) == 2, within=400, what="a second claim")
        first = w.claim_history[0]
        [event] = w.events("LaunchTimeout", first.name)
        assert "UnauthorizedOperation" in event.message
        assert w.rel(event_time(w, first.name)) - w.rel(first.created_at) <= 300
        # 100 ms doubling to 10 s: about 36 attempts in 5 minutes, not thousands.
        assert 20 <= sum(r.node_claim == first.name for r in cloud.requests) <= 50

    sim.run(body)


def event_time(w: World, claim_name: str) -> float:
    return next(e.time for e in w.events("LaunchTimeout", claim_name))
