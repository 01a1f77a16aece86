"""Property tests: whatever the inputs, no placement breaks a hard constraint."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_fixtures import GIB, itype

from spotwright.model import labels as wk
from spotwright.model.objects import (
    LabelSelector,
    NodeSelectorRequirement,
    Pod,
    PodAffinityTerm,
    Taint,
    Toleration,
)
from spotwright.model.resources import Resources
from spotwright.ports.cloud import Offering
from spotwright.scheduling import (
    ClaimPlan,
    ExistingCapacity,
    NodePoolTemplate,
    Requirements,
    choose_offerings,
    pod_requests,
    pod_requirements,
    schedule,
    tolerates,
)

TYPES = [
    itype("c.large", 2, 4, 0.08, category="c"),
    itype("c.xlarge", 4, 8, 0.16, category="c"),
    itype("m.xlarge", 4, 16, 0.19),
    itype("m.4xlarge", 16, 64, 0.77),
    itype("r.2xlarge", 8, 64, 0.50, category="r"),
    itype("a.xlarge", 4, 16, 0.15, arch="arm64"),
    itype("g.xlarge", 4, 16, 1.0, gpu=2, category="g"),
]
BY_NAME = {t.name: t for t in TYPES}
ZONES = ("z-a", "z-b", "z-c")
CTS = (wk.SPOT, wk.ON_DEMAND, wk.RESERVED)
TAINT = Taint("dedicated", "NoSchedule", "x")
OVERHEAD = Resources(cpu=100, memory=GIB // 8, pods=1)

offerings_st = st.lists(
    st.builds(
        Offering,
        st.sampled_from([t.name for t in TYPES]),
        st.sampled_from(ZONES),
        st.sampled_from(CTS),
        st.floats(0.01, 2.0),
        st.booleans(),
    ),
    min_size=1,
    max_size=40,
)

selector_st: st.SearchStrategy[dict[str, str]] = st.one_of(
    st.just({}),
    st.fixed_dictionaries({wk.ARCH: st.sampled_from(["amd64", "arm64"])}),
    st.fixed_dictionaries({wk.CAPACITY_TYPE: st.sampled_from(CTS)}),
    st.fixed_dictionaries({wk.ZONE: st.sampled_from(ZONES)}),
    st.fixed_dictionaries({"team": st.sampled_from(["a", "b"])}),
)


@st.composite
def pods_st(draw: st.DrawFn) -> list[Pod]:
    out = []
    for i in range(draw(st.integers(1, 25))):
        anti = draw(st.booleans()) and draw(st.booleans())
        out.append(
            Pod(
                name=f"p{i}",
                uid=f"{i:03d}",
                labels={"anti": "yes"} if anti else {"app": "x"},
                requests=Resources(
                    cpu=draw(st.sampled_from([100, 500, 1500, 3000, 9000])),
                    memory=draw(st.sampled_from([1, 2, 8, 30])) * GIB // 2,
                    gpu=draw(st.sampled_from([0, 0, 0, 1, 3])),
                ),
                node_selector=draw(selector_st),
                tolerations=(Toleration("dedicated", "Exists"),) if draw(st.booleans()) else (),
                pod_anti_affinity=(
                    (PodAffinityTerm(wk.HOSTNAME, LabelSelector.of({"anti": "yes"})),)
                    if anti
                    else ()
                ),
                created_at=float(draw(st.integers(0, 3))),
            )
        )
    return out


@st.composite
def pools_st(draw: st.DrawFn) -> list[NodePoolTemplate]:
    out = []
    for i in range(draw(st.integers(1, 3))):
        reqs = []
        if draw(st.booleans()):
            reqs.append(
                NodeSelectorRequirement(
                    wk.CAPACITY_TYPE, "In", tuple(draw(st.sets(st.sampled_from(CTS), min_size=1)))
                )
            )
        if draw(st.booleans()):
            reqs.append(NodeSelectorRequirement(wk.ARCH, "In", ("amd64",)))
        limited = draw(st.booleans())
        out.append(
            NodePoolTemplate(
                name=f"pool{i}",
                weight=draw(st.integers(0, 3)),
                requirements=tuple(reqs),
                labels={"team": draw(st.sampled_from(["a", "b"]))} if draw(st.booleans()) else {},
                taints=(TAINT,) if draw(st.booleans()) else (),
                remaining=(
                    Resources(draw(st.integers(0, 40)) * 1000, 2**62, 2**62, 2**62, 2**62)
                    if limited
                    else None
                ),
                nodes_remaining=draw(st.one_of(st.none(), st.integers(0, 4))),
            )
        )
    return out


def _offering_ok(claim: ClaimPlan, o: Offering) -> bool:
    reqs = Requirements.from_terms(claim.requirements)
    zone, ct = reqs.get(wk.ZONE), reqs.get(wk.CAPACITY_TYPE)
    return (
        o.available
        and (zone is None or zone.allows(o.zone))
        and (ct is None or ct.allows(o.capacity_type))
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pods=pods_st(), pools=pools_st(), offerings=offerings_st, free_cpu=st.integers(0, 4000))
def test_no_hard_constraint_is_violated(
    pods: list[Pod], pools: list[NodePoolTemplate], offerings: list[Offering], free_cpu: int
) -> None:
    existing = [
        ExistingCapacity(
            "node-1",
            {wk.ZONE: "z-a", wk.HOSTNAME: "node-1", wk.ARCH: "amd64", "team": "a"},
            taints=(TAINT,),
            free=Resources(free_cpu, 4 * GIB, pods=3),
        )
    ]
    plan = schedule(pods, existing, pools, TYPES, offerings, daemon_overhead=OVERHEAD)
    keys = [p.key for p in pods]
    placed = list(plan.existing) + [p.key for c in plan.new_claims for p in c.pods]
    assert len(placed) == len(set(placed))
    assert set(placed) | set(plan.unschedulable) == set(keys)
    assert not set(placed) & set(plan.unschedulable)
    assert all(plan.unschedulable.values())

    on_node = [p for p in pods if plan.existing.get(p.key) == "node-1"]
    used = sum((pod_requests(p) for p in on_node), Resources())
    assert used.fits_in(existing[0].free)
    for p in on_node:
        assert tolerates(p.tolerations, [TAINT]) is None
        assert any(t.matches(existing[0].labels) for t in pod_requirements(p))

    pool_by_name = {p.name: p for p in pools}
    count: dict[str, int] = {}
    cheapest_cpu: dict[str, int] = {}
    for claim in plan.new_claims:
        pool = pool_by_name[claim.nodepool]
        count[pool.name] = count.get(pool.name, 0) + 1
        assert claim.instance_types
        assert claim.requests == sum((pod_requests(p) for p in claim.pods), Resources())
        assert sum(p.labels.get("anti") == "yes" for p in claim.pods) <= 1
        for p in claim.pods:
            assert tolerates(p.tolerations, pool.taints) is None
        for name in claim.instance_types:
            itype = BY_NAME[name]
            assert (claim.requests + OVERHEAD).fits_in(itype.allocatable)
            usable = [o for o in offerings if o.instance_type == name and _offering_ok(claim, o)]
            assert usable, f"{name} has no available offering for the claim"
            if pool.remaining is not None:
                assert itype.allocatable.cpu <= pool.remaining.cpu
            for o in usable:
                labels = {
                    **pool.labels,
                    **itype.labels,
                    wk.ZONE: o.zone,
                    wk.CAPACITY_TYPE: o.capacity_type,
                    wk.NODEPOOL: pool.name,
                }
                assert Requirements.from_terms(pool.requirements).matches(labels)
                for p in claim.pods:
                    assert any(t.matches(labels) for t in pod_requirements(p)), (p, labels)
        first = BY_NAME[claim.instance_types[0]]
        cheapest_cpu[pool.name] = cheapest_cpu.get(pool.name, 0) + first.allocatable.cpu
    for pool in pools:
        if pool.nodes_remaining is not None:
            assert count.get(pool.name, 0) <= pool.nodes_remaining
        if pool.remaining is not None:
            assert cheapest_cpu.get(pool.name, 0) <= pool.remaining.cpu


@settings(max_examples=200, deadline=None)
@given(
    offerings=offerings_st,
    allowed=st.sets(st.sampled_from(CTS), min_size=1),
    max_types=st.integers(1, 4),
)
def test_choose_offerings_rules(
    offerings: list[Offering], allowed: set[str], max_types: int
) -> None:
    claim = ClaimPlan(
        "default",
        [],
        Resources(cpu=500),
        tuple(BY_NAME),
        (NodeSelectorRequirement(wk.CAPACITY_TYPE, "In", tuple(sorted(allowed))),),
    )
    result = choose_offerings(claim, BY_NAME, offerings, max_types=max_types)
    usable = [o for o in offerings if o.available and o.capacity_type in allowed]
    if not usable:
        assert result is None
        return
    on_demand = [o.price for o in usable if o.capacity_type == wk.ON_DEMAND]
    ceiling = min(on_demand) if on_demand else None
    eligible = [
        o
        for o in usable
        if not (o.capacity_type == wk.SPOT and ceiling is not None and o.price > ceiling)
    ]
    assert result is not None
    ct, chosen = result
    expected = next(
        c
        for c in (wk.RESERVED, wk.SPOT, wk.ON_DEMAND)
        if any(o.capacity_type == c for o in eligible)
    )
    assert ct == expected
    assert chosen and all(o.available and o.capacity_type == ct for o in chosen)
    assert [o.price for o in chosen] == sorted(o.price for o in chosen)
    assert len({o.instance_type for o in chosen}) <= max_types
    if ct == wk.SPOT and ceiling is not None:
        assert all(o.price <= ceiling for o in chosen)
