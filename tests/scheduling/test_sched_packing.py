from sched_fixtures import GIB, catalog, itype, offers, pod

from spotwright.model import labels as wk
from spotwright.model.objects import NodeSelectorRequirement as R
from spotwright.model.objects import Taint, Toleration
from spotwright.model.resources import Resources
from spotwright.scheduling import ExistingCapacity, NodePoolTemplate, schedule

TYPES = catalog()
OFFERS = offers(TYPES)
DEFAULT = NodePoolTemplate("default")


def test_existing_capacity_first_initialized_before_in_flight() -> None:
    existing = [
        ExistingCapacity("b-inflight", {}, free=Resources(4000, 8 * GIB, pods=10), in_flight=True),
        ExistingCapacity("a-ready", {}, free=Resources(1000, 2 * GIB, pods=10)),
    ]
    pods = [pod(f"p{i}", cpu=500, mem_gib=1) for i in range(4)]
    plan = schedule(pods, existing, [DEFAULT], TYPES, OFFERS)
    assert [plan.existing[p.key] for p in pods] == ["a-ready"] * 2 + ["b-inflight"] * 2
    assert not plan.new_claims


def test_claims_are_shared_and_cheapest_first() -> None:
    pods = [pod(f"p{i}", cpu=500, mem_gib=1) for i in range(6)]
    plan = schedule(pods, [], [DEFAULT], TYPES, OFFERS)
    assert sum(len(c.pods) for c in plan.new_claims) == 6
    claim = plan.new_claims[0]
    assert claim.requests.cpu == 500 * len(claim.pods)
    prices = [
        min(o.price for o in OFFERS if o.instance_type == n and o.available)
        for n in claim.instance_types
    ]
    assert prices == sorted(prices)
    reqs = {r.key: r for r in claim.requirements}
    assert reqs[wk.INSTANCE_TYPE].values == claim.instance_types
    assert set(reqs[wk.CAPACITY_TYPE].values) == {wk.SPOT, wk.ON_DEMAND}


def test_cost_cap_avoids_one_giant_node() -> None:
    # a 96-vCPU type twice as dear per vCPU must not absorb everything
    types = [*TYPES, itype("x.huge", 96, 384, 10.0)]
    pods = [pod(f"p{i}", cpu=1000, mem_gib=2) for i in range(60)]
    plan = schedule(pods, [], [DEFAULT], types, offers(types))
    assert all(c.instance_types[0] != "x.huge" for c in plan.new_claims)
    assert plan.cost_per_hour < 60 * 0.085 / 2 * 0.4 * 1.2


def test_weights_and_requirements() -> None:
    spot_only = NodePoolTemplate(
        "spot", weight=10, requirements=(R(wk.CAPACITY_TYPE, "In", (wk.SPOT,)),)
    )
    p = pod("od", node_selector={wk.CAPACITY_TYPE: wk.ON_DEMAND})
    q = pod("any")
    plan = schedule([p, q], [], [DEFAULT, spot_only], TYPES, OFFERS)
    by_pod = {x.key: c for c in plan.new_claims for x in c.pods}
    assert by_pod[q.key].nodepool == "spot"
    assert by_pod[p.key].nodepool == "default"
    reqs = {r.key: r for r in by_pod[p.key].requirements}
    assert reqs[wk.CAPACITY_TYPE].values == (wk.ON_DEMAND,)


def test_reasons_name_constraint_and_pool() -> None:
    spot_only = NodePoolTemplate("default", requirements=(R(wk.CAPACITY_TYPE, "In", (wk.SPOT,)),))
    p = pod("od", node_selector={wk.CAPACITY_TYPE: wk.ON_DEMAND})
    plan = schedule([p], [], [spot_only], TYPES, OFFERS)
    assert plan.unschedulable[p.key] == (
        'incompatible with NodePool "default": requirement karpenter.sh/capacity-type In [spot]'
        " vs pod nodeSelector karpenter.sh/capacity-type=on-demand"
    )
    gpu = pod("gpu", gpu=16)
    plan = schedule([gpu], [], [NodePoolTemplate("gpu")], TYPES, OFFERS)
    assert plan.unschedulable[gpu.key] == (
        'no instance type in NodePool "gpu" has 16 nvidia.com/gpu allocatable'
    )
    tainted = NodePoolTemplate("gpu", taints=(Taint("nvidia.com/gpu", "NoSchedule"),))
    plan = schedule([pod("x")], [], [tainted], TYPES, OFFERS)
    assert "does not tolerate" in plan.unschedulable["default/x"]
    tolerant = pod("y", tolerations=(Toleration("nvidia.com/gpu", "Exists"),))
    assert not schedule([tolerant], [], [tainted], TYPES, OFFERS).unschedulable


def test_limits() -> None:
    limited = NodePoolTemplate("default", remaining=Resources(4000, 2**62, 2**62, 2**62, 2**62))
    pods = [pod(f"p{i}", cpu=1500, mem_gib=1) for i in range(4)]
    plan = schedule(pods, [], [limited], TYPES, OFFERS)
    assert len(plan.unschedulable) >= 1
    assert all(r == 'NodePool "default" limits exceeded (cpu)' for r in plan.unschedulable.values())
    by_name = {t.name: t for t in TYPES}
    assert sum(by_name[c.instance_types[0]].allocatable.cpu for c in plan.new_claims) <= 4000
    for c in plan.new_claims:
        assert all(by_name[n].allocatable.cpu <= 4000 for n in c.instance_types)
    none_left = NodePoolTemplate("default", nodes_remaining=0)
    plan = schedule([pod("z")], [], [none_left], TYPES, OFFERS)
    assert plan.unschedulable["default/z"] == 'NodePool "default" node limit reached'


def test_unavailable_offerings_are_ignored() -> None:
    gone = [
        o
        if o.instance_type != "c5.large"
        else type(o)(o.instance_type, o.zone, o.capacity_type, o.price, available=False)
        for o in OFFERS
    ]
    plan = schedule([pod("p", cpu=500, mem_gib=1)], [], [DEFAULT], TYPES, gone)
    assert "c5.large" not in plan.new_claims[0].instance_types
    nothing = [type(o)(o.instance_type, o.zone, o.capacity_type, o.price, False) for o in OFFERS]
    plan = schedule([pod("q")], [], [DEFAULT], TYPES, nothing)
    assert "no available offering" in plan.unschedulable["default/q"]


def test_daemon_overhead_counts() -> None:
    small = [itype("t.small", 1, 2, 0.01), itype("t.big", 4, 8, 0.05)]
    plan = schedule(
        [pod("p", cpu=800, mem_gib=1)],
        [],
        [DEFAULT],
        small,
        offers(small),
        daemon_overhead=Resources(cpu=300, memory=GIB // 4, pods=1),
    )
    assert plan.new_claims[0].instance_types == ("t.big",)


def test_daemon_overhead_per_pool_counts_only_on_that_pools_nodes() -> None:
    small = [itype("t.small", 1, 2, 0.01), itype("t.big", 4, 8, 0.05)]
    heavy = NodePoolTemplate("heavy", weight=10, labels={"pool": "heavy"})
    light = NodePoolTemplate("light", labels={"pool": "light"})
    overhead = {"heavy": Resources(cpu=300, memory=GIB // 4, pods=1)}
    pods = [
        pod("h", cpu=800, mem_gib=1, node_selector={"pool": "heavy"}),
        pod("l", cpu=800, mem_gib=1, node_selector={"pool": "light"}),
    ]
    plan = schedule(pods, [], [heavy, light], small, offers(small), daemon_overhead=overhead)
    by_pool = {c.nodepool: c.instance_types for c in plan.new_claims}
    assert by_pool["heavy"] == ("t.big",)
    assert by_pool["light"][0] == "t.small"


def test_identical_pods_group_quickly() -> None:
    pods = [pod(f"p{i}", cpu=250, mem_gib=0.5, owner="web") for i in range(3000)]
    plan = schedule(pods, [], [DEFAULT], TYPES, OFFERS)
    assert sum(len(c.pods) for c in plan.new_claims) == 3000 and not plan.unschedulable


def test_required_affinity_terms_are_alternatives() -> None:
    p = pod(
        "p", required_affinity=((R(wk.ARCH, "In", ("s390x",)),), (R(wk.ARCH, "In", ("arm64",)),))
    )
    plan = schedule([p], [], [DEFAULT], TYPES, OFFERS)
    assert plan.new_claims[0].instance_types == ("m6g.xlarge",)
