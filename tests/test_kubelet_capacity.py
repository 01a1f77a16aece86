"""An EC2NodeClass's kubelet block decides what its nodes hold, for the scheduler too.

``maxPods``, ``podsPerCore``, ``kubeReserved``, ``systemReserved`` and the eviction
thresholds change what the kubelet lets pods use. The scheduler must count with the
same figures (``model.kubelet.allocatable``), or it plans more pods onto a node than
the kubelet admits; and the simulated node must offer what the scheduler assumed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from spotwright.catalog import load_catalog
from spotwright.controllers import NodeClaimLifecycle, Provisioner
from spotwright.model import labels as wk
from spotwright.model.errors import ScenarioError
from spotwright.model.kubelet import KubeletConfiguration, allocatable
from spotwright.model.nodeclass import parse_nodeclass
from spotwright.model.nodepool import NodePool
from spotwright.ports.cloud import NodeClassState
from test_nodeclass_provisioning import ClassedCloud

if TYPE_CHECKING:
    from conftest import Simulator, World

MIB = 1 << 20
CATALOG = {t.name: t for t in load_catalog()}


def kubelet(**fields: object) -> KubeletConfiguration:
    return KubeletConfiguration.model_validate(fields)


# -- the figures ---------------------------------------------------------------------------


def test_without_a_block_or_with_karpenters_defaults_the_catalog_stands() -> None:
    m5 = CATALOG["m5.large"]
    assert allocatable(m5, None) == m5.allocatable
    defaults = kubelet(
        kubeReserved={"cpu": "70m", "memory": "574Mi", "ephemeral-storage": "1Gi"},
        evictionHard={"memory.available": "100Mi", "nodefs.available": "10%"},
    )
    assert allocatable(m5, defaults) == m5.allocatable


def test_reservations_and_eviction_thresholds_come_off_the_node() -> None:
    m5 = CATALOG["m5.large"]  # 2 vCPU, 8 GiB; catalog: 1930m, 6903Mi, 29 pods
    reserved = allocatable(
        m5, kubelet(systemReserved={"cpu": "500m"}, kubeReserved={"memory": "1Gi"})
    )
    assert reserved.cpu == 1930 - 500
    assert reserved.memory == (6903 - (1024 - 574)) * MIB
    assert reserved.pods == 29
    # 10% of the memory capacity (8192Mi less 7.5% VM overhead) instead of 100Mi
    evicting = allocatable(m5, kubelet(evictionHard={"memory.available": "10%"}))
    assert evicting.memory == (6903 + 100) * MIB - int(7577 * MIB * 0.10)
    # a soft threshold above the hard one is what counts, as in Karpenter
    soft = allocatable(
        m5,
        kubelet(
            evictionSoft={"memory.available": "1Gi"},
            evictionSoftGracePeriod={"memory.available": "1m"},
        ),
    )
    assert soft.memory == (6903 + 100 - 1024) * MIB


def test_max_pods_and_pods_per_core_set_the_pod_slots() -> None:
    m5 = CATALOG["m5.large"]
    ten = allocatable(m5, kubelet(maxPods=10))
    assert ten.pods == 10
    # kube-reserved memory follows the pod count (11Mi per pod), so fewer pods free memory
    assert ten.memory == m5.allocatable.memory + 11 * (29 - 10) * MIB
    assert allocatable(m5, kubelet(podsPerCore=2)).pods == 4
    assert allocatable(m5, kubelet(maxPods=110, podsPerCore=0)).pods == 110
    # never below zero, however much is reserved
    assert allocatable(m5, kubelet(systemReserved={"cpu": "64"})).cpu == 0


@pytest.mark.parametrize(
    ("block", "path", "expected"),
    [
        ({"maxPods": -1}, "spec.kubelet.maxPods", "≥ 0"),
        ({"kubeReserved": {"memory": "lots"}}, "spec.kubelet.kubeReserved", "quantity"),
        ({"evictionSoft": {"memory.available": "1Gi"}}, "spec.kubelet", "GracePeriod"),
        (
            {"imageGCHighThresholdPercent": 50, "imageGCLowThresholdPercent": 50},
            "spec.kubelet",
            "above imageGCLowThresholdPercent",
        ),
    ],
)
def test_a_bad_kubelet_block_is_named_by_its_path(
    block: dict[str, object], path: str, expected: str
) -> None:
    nodeclass = {
        "metadata": {"name": "c"},
        "spec": {
            "role": "r",
            "amiSelectorTerms": [{"alias": "al2023@latest"}],
            "subnetSelectorTerms": [{"tags": {"a": "b"}}],
            "securityGroupSelectorTerms": [{"tags": {"a": "b"}}],
            "kubelet": block,
        },
    }
    with pytest.raises(ScenarioError) as caught:
        parse_nodeclass(nodeclass, source="class.yaml")
    assert f"{path}:" in str(caught.value) and expected in str(caught.value)


# -- the provisioner -----------------------------------------------------------------------


async def start(
    w: World, block: KubeletConfiguration, pool: str = "default", weight: int | None = None
) -> None:
    w.ctx.cloud = ClassedCloud(w.market, {"small": NodeClassState("small", kubelet=block)})
    spec: dict[str, object] = {"template": {"spec": {"nodeClassRef": {"name": "small"}}}}
    if weight is not None:
        spec["weight"] = weight
    w.nodepools.append(NodePool.model_validate({"metadata": {"name": pool}, "spec": spec}))
    await w.start(Provisioner(w.ctx).run(), NodeClaimLifecycle(w.ctx).run())


def test_max_pods_10_puts_at_most_10_pods_on_a_node_daemonsets_included(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        w.add_node("existing", cpu="2", memory="4Gi", max_pods=1)
        w.deploy("agent", 1, cpu="10m", memory="16Mi", daemon=True)
        await start(w, kubelet(maxPods=10))
        w.deploy("web", 40, cpu="10m", memory="16Mi")
        await w.until(lambda: w.all_ready("web"), within=600, what="web ready")
        new_nodes = [n for n in w.cluster.nodes() if n.name != "existing"]
        assert len(new_nodes) >= 4  # 40 tiny pods would fit one node without the cap
        for node in new_nodes:
            assert node.allocatable.pods == 10
            assert len(w.cluster.pods_on(node.name)) <= 10
        for claim in w.claims():
            # the provisioner planned at most 9 pods per node: the 10th slot is the agent's
            planned = [e for e in w.events("Nominated") if e.message.endswith(f"/{claim.name}")]
            assert 1 <= len(planned) <= 9

    sim.run(body)


def test_system_reserved_shrinks_what_a_node_offers_and_pods_fit_accordingly(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        block = kubelet(systemReserved={"cpu": "1", "memory": "1Gi"})
        await start(w, block)
        w.deploy("web", 1, cpu="1", memory="1Gi")
        await w.until(lambda: w.all_ready("web"), within=300, what="web ready")
        [claim] = w.claims()
        # a 2-vCPU type offers 1930m, less 1 cpu reserved: too little for a 1-cpu pod
        assert all(w.ctx.instance_types[t].vcpu > 2 for t in claim.instance_types)
        [node] = w.cluster.nodes()
        itype = w.ctx.instance_types[node.labels[wk.INSTANCE_TYPE]]
        assert node.allocatable == allocatable(itype, block)
        assert node.allocatable.cpu == itype.allocatable.cpu - 1000

    sim.run(body)


def test_pools_whose_classes_differ_are_each_sized_by_their_own_class(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        w.add_nodepool("plain")
        await start(w, kubelet(maxPods=5), pool="capped", weight=10)  # preferred
        w.deploy("web", 12, cpu="10m", memory="16Mi")
        await w.until(lambda: w.all_ready("web"), within=600, what="web ready")
        capped = [c for c in w.claims() if c.nodepool == "capped"]
        assert capped and not [c for c in w.claims() if c.nodepool == "plain"]
        assert len(capped) >= 3
        for claim in capped:
            planned = [e for e in w.events("Nominated") if e.message.endswith(f"/{claim.name}")]
            assert len(planned) <= 5
            assert len(w.cluster.pods_on(claim.node_name)) <= 5

    sim.run(body)


def test_pods_the_preferred_class_cannot_hold_go_to_the_next_pool(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_nodepool("plain")
        # the preferred pool's class reserves more CPU than any 2..8 vCPU type has
        await start(w, kubelet(systemReserved={"cpu": "8"}), pool="reserved", weight=10)
        w.deploy("web", 3, cpu="1", memory="1Gi")
        await w.until(lambda: w.all_ready("web"), within=300, what="web ready")
        pools = {c.nodepool for c in w.claims()}
        assert "plain" in pools
        for claim in w.claims():
            if claim.nodepool == "reserved":
                assert w.ctx.instance_types[claim.instance_type].vcpu > 9

    sim.run(body)
