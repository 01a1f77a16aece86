"""``--cloud sim`` on a cluster: instances a previous controller launched are adopted.

The market lives in one process's memory; the fake Nodes live in the API server. A new
leader must see a previous leader's instances as its own (to terminate them and to leave
them alone when garbage-collecting), which only works if an adopted instance's providerID
is exactly its Node's.
"""

from __future__ import annotations

import asyncio
from typing import Any

from spotwright.adapters.kube.kwok import SIMULATED_LABEL, KwokCloud
from spotwright.catalog import load_catalog
from spotwright.model.objects import Node, NodeClaim
from spotwright.ports.clock import LoopClock


class StubCluster:
    """The two reads KwokCloud makes of the cluster cache."""

    def __init__(self, nodes: list[Node], claims: list[NodeClaim]) -> None:
        self._nodes, self._claims = nodes, claims

    def nodes(self) -> list[Node]:
        return self._nodes

    def node_claims(self) -> list[NodeClaim]:
        return self._claims

    def node_claim(self, name: str) -> NodeClaim | None:
        return next((c for c in self._claims if c.name == name), None)


def cloud(cluster: StubCluster) -> KwokCloud:
    api: Any = None  # no API call is made by what these tests exercise
    return KwokCloud(
        cluster,  # type: ignore[arg-type]
        api,
        load_catalog().types,
        region="us-east-1",
        zones=["us-east-1a", "us-east-1b"],
        clock=LoopClock(),
    )


def test_a_previous_leaders_node_is_an_owned_instance_with_the_same_provider_id() -> None:
    node = Node(
        name="ip-10-0-0-1.ec2.internal",
        provider_id="aws:///us-east-1b/i-0abc",
        labels={SIMULATED_LABEL: "true", "node.kubernetes.io/instance-type": "m5.large"},
        annotations={"spotwright.io/price": "0.040000"},
    )
    someone_elses = Node(name="real", provider_id="aws:///us-east-1a/i-0def")

    async def run() -> None:
        sim = cloud(StubCluster([node, someone_elses], []))
        owned = await sim.list_owned()
        assert [(i.id, i.provider_id, i.price) for i in owned] == [
            ("i-0abc", "aws:///us-east-1b/i-0abc", 0.04)
        ]
        assert [i.id for i in await sim.describe(["i-0abc", "i-0def"])] == ["i-0abc"]

    asyncio.run(run())


def test_a_claimed_instance_whose_node_never_came_is_booted_again() -> None:
    launched = NodeClaim(
        name="spot-00001",
        nodepool="spot",
        provider_id="aws:///us-east-1a/i-0abc",
        instance_type="m5.large",
        zone="us-east-1a",
        capacity_type="spot",
        launched_at=1.0,
    )
    unlaunched = NodeClaim(name="spot-00002", nodepool="spot")
    created: list[str] = []

    async def run() -> int:
        sim = cloud(StubCluster([], [launched, unlaunched]))

        async def create(instance: Any) -> None:
            created.append(instance.id)

        sim._create_node = create  # type: ignore[method-assign]
        return await sim.adopt()

    assert asyncio.run(run()) == 1
    assert created == ["i-0abc"]
