"""Completing claims and choosing zones ahead: cheaper packings, no hard rule broken."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_fixtures import GIB, itype, offers, pod

from spotwright.model import labels as wk
from spotwright.model.objects import LabelSelector, PodAffinityTerm, TopologySpreadConstraint
from spotwright.model.resources import Resources
from spotwright.scheduling import ExistingCapacity, NodePoolTemplate, Plan, schedule

#: Karpenter's synthetic shape: size i has i vCPU and 2i GiB, price linear in size.
LINEAR = [itype(f"l.{i}", i, 2 * i, 0.05 * i, pods=10 * i) for i in range(1, 17)]
LINEAR_OFFERS = offers(LINEAR, spot=False)
DEFAULT = NodePoolTemplate("default")
NGINX = {"app": "nginx"}
ANTI = (PodAffinityTerm(wk.HOSTNAME, LabelSelector.of(NGINX)),)


def _zones(plan: Plan) -> dict[str, str]:
    out = {}
    for claim in plan.new_claims:
        reqs = {r.key: r for r in claim.requirements}
        zone = reqs[wk.ZONE].values if wk.ZONE in reqs else ()
        for p in claim.pods:
            out[p.key] = zone[0] if len(zone) == 1 else "?"
    return out


def test_a_lone_memory_heavy_pod_node_grows_to_hold_cpu_heavy_pods() -> None:
    # Each anti-affinity pod fills the memory of the smallest type; one size up, its
    # node holds a 1750m/2GiB pod exactly. Without completing, those four pods would
    # need a 7-vCPU node of their own (11 units instead of 8).
    lone = [
        pod(f"a{i}", cpu=250, mem_gib=2, labels=dict(NGINX), pod_anti_affinity=ANTI)
        for i in range(4)
    ]
    heavy = [pod(f"c{i}", cpu=1750, mem_gib=2) for i in range(4)]
    plan = schedule(lone + heavy, [], [DEFAULT], LINEAR, LINEAR_OFFERS)
    assert not plan.unschedulable
    assert len(plan.new_claims) == 4
    assert abs(plan.cost_per_hour - 4 * 0.10) < 1e-9
    assert all(sum(p.labels.get("app") == "nginx" for p in c.pods) == 1 for c in plan.new_claims)


pods_st = st.lists(
    st.tuples(
        st.sampled_from(["free", "spread", "affinity", "anti"]),
        st.sampled_from([100, 250, 500, 1000, 1500]),
        st.sampled_from([0.1, 0.25, 0.5, 1, 2, 4]),
        st.sampled_from(["a", "b", "c"]),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=pods_st, zones=st.integers(1, 3), free_cpu=st.sampled_from([0, 600, 3000]))
def test_zones_chosen_ahead_keep_spread_and_affinity(
    specs: list[tuple[str, int, float, str]], zones: int, free_cpu: int
) -> None:
    pods = []
    for i, (kind, cpu, mem, value) in enumerate(specs):
        if kind == "spread":
            labels = {"spread": value}
            rule = TopologySpreadConstraint(wk.ZONE, 1, selector=LabelSelector.of(labels))
            pods.append(pod(f"s{i}", cpu, mem, labels=labels, topology_spread=(rule,)))
        elif kind == "affinity":
            labels = {"together": value}
            term = PodAffinityTerm(wk.ZONE, LabelSelector.of(labels))
            pods.append(pod(f"f{i}", cpu, mem, labels=labels, pod_affinity=(term,)))
        elif kind == "anti":
            pods.append(pod(f"n{i}", cpu, mem, labels=dict(NGINX), pod_anti_affinity=ANTI))
        else:
            pods.append(pod(f"g{i}", cpu, mem, labels={"spread": value, "together": value}))
    offerings = offers(LINEAR, zones=("z-a", "z-b", "z-c")[:zones], spot=False)
    node = ExistingCapacity(
        "n1", {wk.ZONE: "z-a", wk.HOSTNAME: "n1"}, free=Resources(free_cpu, 4 * GIB, pods=5)
    )
    plan = schedule(pods, [node], [DEFAULT], LINEAR, offerings)
    assert not plan.unschedulable
    on_node = [p for p in pods if plan.existing.get(p.key) == "n1"]
    assert sum(p.requests.cpu for p in on_node) <= free_cpu and len(on_node) <= 5
    assert sum(p.requests.memory for p in on_node) <= 4 * GIB
    placed = [p.key for c in plan.new_claims for p in c.pods] + [p.key for p in on_node]
    assert sorted(placed) == sorted(p.key for p in pods)
    for claim in plan.new_claims:
        used = (sum(p.requests.cpu for p in claim.pods), sum(p.requests.memory for p in claim.pods))
        cap = next(t for t in LINEAR if t.name == claim.instance_types[0]).allocatable
        assert used[0] <= cap.cpu and used[1] <= cap.memory
        assert sum(p.labels.get("app") == "nginx" for p in claim.pods) <= 1
    assert sum(p.labels.get("app") == "nginx" for p in on_node) <= 1
    zone = _zones(plan)
    zone.update({p.key: "z-a" for p in on_node})
    for value in "abc":
        spread = [p for p in pods if p.name.startswith("s") and p.labels["spread"] == value]
        if spread:
            counts = Counter(zone[p.key] for p in spread)
            assert "?" not in counts
            # The selector also matches the free pods of the same value. Those on the
            # existing node may be placed before the spread pods (which then balance
            # around them) or after (unconstrained): either way the zones end at most one
            # pod further apart than those free pods alone leave them.
            early = sum(
                1 for p in on_node if p.name.startswith("g") and p.labels["spread"] == value
            )
            counts["z-a"] += early
            per_zone = [counts.get(z, 0) for z in ("z-a", "z-b", "z-c")[:zones]]
            assert max(per_zone) - min(per_zone) <= 1 + (early if zones > 1 else 0)
        together = {
            zone[p.key] for p in pods if p.name.startswith("f") and p.labels["together"] == value
        }
        assert len(together) <= 1 and "?" not in together


def test_memory_heavy_and_cpu_heavy_pods_share_big_nodes_evenly() -> None:
    # Half the pods are all memory, half all CPU: every node should use both.
    mem_heavy = [pod(f"m{i}", cpu=100, mem_gib=4) for i in range(40)]
    cpu_heavy = [pod(f"c{i}", cpu=1900, mem_gib=0.25) for i in range(40)]
    lone = [
        pod(f"a{i}", cpu=500, mem_gib=1, labels=dict(NGINX), pod_anti_affinity=ANTI)
        for i in range(3)
    ]
    plan = schedule(mem_heavy + cpu_heavy + lone, [], [DEFAULT], LINEAR, LINEAR_OFFERS)
    cpu = sum(p.requests.cpu for p in mem_heavy + cpu_heavy + lone) / 1000
    mem = sum(p.requests.memory for p in mem_heavy + cpu_heavy + lone) / GIB
    bound = max(cpu * 0.05, mem / 2 * 0.05)
    assert plan.cost_per_hour <= bound * 1.1
