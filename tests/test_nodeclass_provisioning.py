"""A NodePool's EC2NodeClass decides where its nodes can launch, and whether they can.

The cloud resolves each class (on EC2: its subnets, security groups, AMIs and role) and
reports it as data, ``NodeClassState``: the zones of its subnets, the architectures of its
images, or why it cannot launch. Here a cloud that wraps the simulated market reports
given states, so what the provisioner and the node-claim lifecycle do with them is seen
end to end: claims only in the class's zones and architectures, launches that name the
class, and pods that stay pending with the class's problem as their reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from spotwright.catalog import load_catalog
from spotwright.controllers import NodeClaimLifecycle, Provisioner
from spotwright.model import labels as wk
from spotwright.model.nodepool import NodePool
from spotwright.ports.cloud import Instance, LaunchRequest, NodeClassState, Offering

if TYPE_CHECKING:
    from conftest import Simulator, World


class ClassedCloud:
    """The simulated market, plus node classes resolved to fixed states."""

    def __init__(self, market: Any, states: dict[str, NodeClassState]) -> None:
        self.market = market
        self.region = market.region
        self.states = states
        self.requests: list[LaunchRequest] = []

    def instance_types(self) -> Sequence[Any]:
        return self.market.instance_types()  # type: ignore[no-any-return]

    def offerings(self) -> Sequence[Offering]:
        return self.market.offerings()  # type: ignore[no-any-return]

    async def node_class(self, name: str | None) -> NodeClassState:
        if name is None:
            return NodeClassState(None)
        return self.states.get(name, NodeClassState(name, problem=f"EC2NodeClass {name} not found"))

    async def launch(self, request: LaunchRequest) -> Instance:
        self.requests.append(request)
        return await self.market.launch(request)  # type: ignore[no-any-return]

    async def terminate(self, instance_id: str) -> None:
        await self.market.terminate(instance_id)

    async def describe(self, instance_ids: Sequence[str]) -> list[Instance]:
        return await self.market.describe(instance_ids)  # type: ignore[no-any-return]

    async def list_owned(self) -> list[Instance]:
        return await self.market.list_owned()  # type: ignore[no-any-return]


def with_class(w: World, cloud: ClassedCloud, pool: str, nodeclass: str) -> None:
    w.ctx.cloud = cloud
    w.nodepools.append(
        NodePool.model_validate(
            {
                "metadata": {"name": pool},
                "spec": {"template": {"spec": {"nodeClassRef": {"name": nodeclass}}}},
            }
        )
    )


def cheapest_spot_zone(w: World) -> str:
    spot = [o for o in w.market.offerings() if o.capacity_type == wk.SPOT and o.available]
    return min(spot, key=lambda o: o.price).zone


def test_claims_launch_only_in_the_zones_of_the_class_subnets(sim: Simulator) -> None:
    async def body(w: World) -> None:
        # The class's subnets are all in a zone the cheapest offering is not in.
        zones = sorted({o.zone for o in w.market.offerings()})
        other = next(z for z in zones if z != cheapest_spot_zone(w))
        cloud = ClassedCloud(w.market, {"private": NodeClassState("private", frozenset({other}))})
        with_class(w, cloud, "default", "private")
        await w.start(Provisioner(w.ctx).run(), NodeClaimLifecycle(w.ctx).run())
        for i in range(4):
            w.deploy(f"app{i}", 1, cpu="3")
        await w.until(
            lambda: w.all_ready(*(f"app{i}" for i in range(4))), within=300, what="pods ready"
        )
        claims = w.claims()
        assert claims and {c.zone for c in claims} == {other}
        assert {c.node_class for c in claims} == {"private"}
        assert cloud.requests and {r.node_class for r in cloud.requests} == {"private"}
        assert all(o.zone == other for r in cloud.requests for o in r.offerings)

    sim.run(body)


def test_a_class_with_images_for_one_architecture_gets_only_those_types(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        state = NodeClassState("arm", architectures=frozenset({"arm64"}))
        cloud = ClassedCloud(w.market, {"arm": state})
        with_class(w, cloud, "default", "arm")
        await w.start(Provisioner(w.ctx).run(), NodeClaimLifecycle(w.ctx).run())
        w.deploy("web", 2)
        await w.until(lambda: w.all_ready("web"), within=300, what="web ready")
        assert w.claims()
        for claim in w.claims():
            assert w.ctx.instance_types[claim.instance_type].arch == "arm64"

    # amd64 types are the cheapest here: only the class keeps them out.
    catalog = load_catalog()
    types = {n: catalog.get(n) for n in ("c5.large", "m5.large", "m6g.xlarge", "r6g.large")}
    sim.run(body, types=types)


def test_a_class_that_cannot_launch_keeps_its_pods_pending_with_the_reason(
    sim: Simulator,
) -> None:
    problem = 'EC2NodeClass private: no available subnet matches [{"tags": {"tier": "private"}}]'

    async def body(w: World) -> None:
        cloud = ClassedCloud(w.market, {"private": NodeClassState("private", problem=problem)})
        with_class(w, cloud, "default", "private")
        await w.start(Provisioner(w.ctx).run(), NodeClaimLifecycle(w.ctx).run())
        w.deploy("web", 1)
        await w.advance(30)
        assert w.claims() == [] and cloud.requests == []
        failed = w.events("FailedScheduling")
        assert failed and all(f"NodePool default left out: {problem}" in e.message for e in failed)
        [event] = w.events("NodeClassNotReady")
        assert (event.kind, event.name, event.message, event.warning) == (
            "EC2NodeClass",
            "private",
            problem,
            True,
        )
        assert any("leaving NodePool out" in line for line in w.log)
        # The subnets get tagged: the class resolves, the pods get their node.
        cloud.states["private"] = NodeClassState("private")
        await w.until(lambda: w.all_ready("web"), within=300, what="web ready")
        assert [c.node_class for c in w.claims()] == ["private"]

    sim.run(body)


def test_a_pool_without_a_class_is_not_held_up_by_a_broken_one(sim: Simulator) -> None:
    async def body(w: World) -> None:
        broken = NodeClassState("gone", problem="EC2NodeClass gone not found")
        cloud = ClassedCloud(w.market, {"gone": broken})
        with_class(w, cloud, "broken", "gone")
        w.add_nodepool("plain")
        await w.start(Provisioner(w.ctx).run(), NodeClaimLifecycle(w.ctx).run())
        w.deploy("web", 2)
        await w.until(lambda: w.all_ready("web"), within=300, what="web ready")
        assert {(c.nodepool, c.node_class) for c in w.claims()} == {("plain", "")}
        assert {r.node_class for r in cloud.requests} == {None}

    sim.run(body)
