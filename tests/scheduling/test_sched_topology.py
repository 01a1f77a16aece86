from collections import Counter

from sched_fixtures import catalog, offers, pod

from spotwright.model import labels as wk
from spotwright.model.objects import (
    LabelSelector,
    NodeSelectorRequirement,
    PodAffinityTerm,
    PreferredSchedulingTerm,
    TopologySpreadConstraint,
    WeightedPodAffinityTerm,
)
from spotwright.model.resources import Resources
from spotwright.scheduling import ExistingCapacity, NodePoolTemplate, Plan, schedule

TYPES = catalog()
OFFERS = offers(TYPES)
DEFAULT = NodePoolTemplate("default")
APP = {"app": "web"}
SEL = LabelSelector.of(APP)


def zone_of(plan: Plan) -> dict[str, str]:
    out = {}
    for c in plan.new_claims:
        zone = {r.key: r for r in c.requirements}[wk.ZONE].values
        assert len(zone) == 1
        for p in c.pods:
            out[p.key] = zone[0]
    return out


def test_zonal_spread_max_skew_one() -> None:
    spread = (TopologySpreadConstraint(wk.ZONE, 1, selector=SEL),)
    pods = [pod(f"p{i}", labels=dict(APP), topology_spread=spread) for i in range(7)]
    plan = schedule(pods, [], [DEFAULT], TYPES, OFFERS)
    counts = Counter(zone_of(plan).values())
    assert sum(counts.values()) == 7 and max(counts.values()) - min(counts.values()) <= 1
    assert len(counts) == 3


def test_zonal_spread_counts_existing_pods() -> None:
    spread = (TopologySpreadConstraint(wk.ZONE, 1, selector=SEL),)
    bound = tuple(pod(f"old{i}", labels=dict(APP)) for i in range(2))
    node = ExistingCapacity("n1", {wk.ZONE: "z-a", wk.HOSTNAME: "n1"}, free=Resources(), pods=bound)
    pods = [pod(f"p{i}", labels=dict(APP), topology_spread=spread) for i in range(4)]
    plan = schedule(pods, [node], [DEFAULT], TYPES, OFFERS)
    counts = Counter(zone_of(plan).values())
    assert counts["z-a"] == 0 and counts["z-b"] == 2 and counts["z-c"] == 2


def test_hostname_anti_affinity_one_per_node() -> None:
    anti = (PodAffinityTerm(wk.HOSTNAME, SEL),)
    pods = [pod(f"p{i}", cpu=100, labels=dict(APP), pod_anti_affinity=anti) for i in range(5)]
    plan = schedule(pods, [], [DEFAULT], TYPES, OFFERS)
    assert len(plan.new_claims) == 5 and all(len(c.pods) == 1 for c in plan.new_claims)


def test_inverse_anti_affinity_from_existing_pod() -> None:
    anti = (PodAffinityTerm(wk.HOSTNAME, SEL),)
    owner = pod("owner", labels={"app": "db"}, pod_anti_affinity=anti)
    node = ExistingCapacity(
        "n1", {wk.HOSTNAME: "n1"}, free=Resources(8000, 2**36, pods=50), pods=(owner,)
    )
    web = pod("web", labels=dict(APP))
    other = pod("other", labels={"app": "cache"})
    plan = schedule([web, other], [node], [DEFAULT], TYPES, OFFERS)
    assert web.key not in plan.existing and plan.existing[other.key] == "n1"


def test_hostname_spread_max_skew_two() -> None:
    spread = (TopologySpreadConstraint(wk.HOSTNAME, 2, selector=SEL),)
    pods = [pod(f"p{i}", cpu=100, labels=dict(APP), topology_spread=spread) for i in range(6)]
    plan = schedule(pods, [], [DEFAULT], TYPES, OFFERS)
    assert all(len(c.pods) <= 2 for c in plan.new_claims) and len(plan.new_claims) == 3


def test_zonal_self_affinity_keeps_one_zone() -> None:
    aff = (PodAffinityTerm(wk.ZONE, SEL),)
    pods = [pod(f"p{i}", cpu=4000, mem_gib=4, labels=dict(APP), pod_affinity=aff) for i in range(6)]
    plan = schedule(pods, [], [DEFAULT], TYPES, OFFERS)
    assert len(set(zone_of(plan).values())) == 1 and not plan.unschedulable


def test_affinity_to_missing_pods_is_unschedulable() -> None:
    aff = (PodAffinityTerm(wk.ZONE, LabelSelector.of({"app": "nowhere"})),)
    p = pod("p", labels=dict(APP), pod_affinity=aff)
    plan = schedule([p], [], [DEFAULT], TYPES, OFFERS)
    assert "pod affinity on topology.kubernetes.io/zone" in plan.unschedulable[p.key]


def test_preferences_relax() -> None:
    pref = (WeightedPodAffinityTerm(10, PodAffinityTerm(wk.HOSTNAME, SEL)),)
    one_node = NodePoolTemplate("default", nodes_remaining=1)
    pods = [
        pod(f"p{i}", cpu=100, labels=dict(APP), preferred_pod_anti_affinity=pref) for i in range(3)
    ]
    plan = schedule(pods, [], [one_node], TYPES, OFFERS)
    assert not plan.unschedulable and len(plan.new_claims) == 1
    node_pref = (PreferredSchedulingTerm(5, (NodeSelectorRequirement(wk.ARCH, "In", ("s390x",)),)),)
    plan = schedule([pod("q", preferred_affinity=node_pref)], [], [DEFAULT], TYPES, OFFERS)
    assert not plan.unschedulable
    arm = (PreferredSchedulingTerm(5, (NodeSelectorRequirement(wk.ARCH, "In", ("arm64",)),)),)
    plan = schedule([pod("r", cpu=1000, preferred_affinity=arm)], [], [DEFAULT], TYPES, OFFERS)
    assert plan.new_claims[0].instance_types == ("m6g.xlarge",)


def test_schedule_anyway_is_a_preference() -> None:
    spread = (TopologySpreadConstraint(wk.HOSTNAME, 1, "ScheduleAnyway", selector=SEL),)
    one_node = NodePoolTemplate("default", nodes_remaining=1)
    pods = [pod(f"p{i}", cpu=100, labels=dict(APP), topology_spread=spread) for i in range(3)]
    plan = schedule(pods, [], [one_node], TYPES, OFFERS)
    assert not plan.unschedulable and len(plan.new_claims) == 1
