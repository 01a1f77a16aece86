"""A NodePool's ``minValues`` holds on every claim that is launched.

``minValues`` is how a platform team says "never put a node on fewer than N instance
families" (or types, or sizes), so one spot pool running dry cannot strand it. It must
survive both cuts a claim goes through: the candidate types narrowing as pods are
packed, and the launch keeping only the cheapest types. A claim that cannot keep the
floor is not made; its pods stay pending and say why.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from spotwright.catalog import InstanceType
from spotwright.model import labels as wk
from spotwright.model.nodepool import NodePool
from spotwright.model.objects import NodeSelectorRequirement as R
from spotwright.model.objects import Pod
from spotwright.model.resources import Resources
from spotwright.ports.cloud import Offering
from spotwright.scheduling import ClaimPlan, NodePoolTemplate, choose_offerings, schedule
from spotwright.scheduling.min_values import enforce_min_values
from spotwright.scheduling.requirements import min_values_shortfall

if TYPE_CHECKING:
    from conftest import Simulator, World

FAMILY = wk.INSTANCE_FAMILY


def _type(name: str, price: float) -> InstanceType:
    family, _, size = name.partition(".")
    return InstanceType(
        name=name,
        family=family,
        category=family[0],
        generation=5,
        size=size,
        vcpu=2,
        memory_mib=8192,
        arch="amd64",
        gpu_count=0,
        gpu_name="",
        allocatable=Resources(cpu=1900, memory=7 * 2**30, pods=29, ephemeral=20 * 2**30),
        od_price=price,
        spot_savings_pct=60.0,
        interruption_band=1,
    )


#: Three cheap types of one family, then one each of two dearer families.
TYPES = {
    t.name: t
    for t in (
        _type("c5.large", 0.080),
        _type("c5a.large", 0.081),
        _type("c5d.large", 0.082),
        _type("m5.large", 0.096),
        _type("r5.large", 0.126),
    )
}
# c5, c5a and c5d are families of their own; make the first three one family instead.
for _name in ("c5a.large", "c5d.large"):
    TYPES[_name].labels[FAMILY] = "c5"


def test_the_shortfall_names_the_key_the_floor_and_what_was_found() -> None:
    labels = [TYPES[n].labels for n in ("c5.large", "c5a.large", "m5.large")]
    assert min_values_shortfall([R(FAMILY, "Exists", (), 2)], labels) is None
    short = min_values_shortfall([R(FAMILY, "Exists", (), 3)], labels)
    assert short == f"minValues 3 for {FAMILY} not met: the instance types that fit offer 2 values"
    assert min_values_shortfall([R(FAMILY, "Exists")], labels) is None  # no floor at all


def test_the_launch_keeps_enough_families_when_it_keeps_only_the_cheapest_types() -> None:
    offers = [Offering(n, "z1", wk.ON_DEMAND, t.od_price) for n, t in TYPES.items()]
    names = tuple(TYPES)
    plain = ClaimPlan("default", [], Resources(cpu=1000), names, ())
    _, chosen = choose_offerings(plain, TYPES, offers, max_types=3)  # type: ignore[misc]
    assert {TYPES[o.instance_type].labels[FAMILY] for o in chosen} == {"c5"}
    floor = ClaimPlan("default", [], Resources(cpu=1000), names, (R(FAMILY, "Exists", (), 3),))
    _, chosen = choose_offerings(floor, TYPES, offers, max_types=3)  # type: ignore[misc]
    kept = [o.instance_type for o in chosen]
    assert len(kept) == 3
    assert {TYPES[n].labels[FAMILY] for n in kept} == {"c5", "m5", "r5"}
    assert kept[0] == "c5.large"  # still the cheapest of its family


def _pool_with_floor(w: World, families: list[str], floor: int) -> None:
    spec: dict[str, Any] = {
        "template": {
            "spec": {
                "requirements": [
                    {"key": FAMILY, "operator": "In", "values": families, "minValues": floor}
                ]
            }
        }
    }
    w.nodepools.append(NodePool.model_validate({"metadata": {"name": "flex"}, "spec": spec}))


def test_a_claim_spans_the_families_the_pool_demands(sim: Simulator) -> None:
    async def body(w: World) -> None:
        _pool_with_floor(w, ["c5", "m5"], 2)
        await w.start_controllers()
        w.deploy("web", 1, cpu="1")
        await w.until(lambda: w.all_ready("web"), within=120, what="web ready")
        [claim] = w.claims()
        assert {w.ctx.instance_types[n].family for n in claim.instance_types} >= {"c5", "m5"}
        assert any(r.min_values == 2 for r in claim.requirements)

    sim.run(body)


def test_pods_that_only_one_family_can_hold_stay_pending_and_say_why(sim: Simulator) -> None:
    async def body(w: World) -> None:
        _pool_with_floor(w, ["c5", "m5"], 2)
        await w.start_controllers()
        w.deploy("big", 1, cpu="3")  # only m5.xlarge and m5.2xlarge have 3 cpu
        await w.advance(30)
        assert w.claim_history == []
        [pod] = w.pods_of("big")
        [event, *_] = w.events("FailedScheduling", pod.key)
        assert 'NodePool "flex"' in event.message
        assert f"minValues 2 for {FAMILY}" in event.message

    sim.run(body)


def _sized(name: str, vcpu: int, price: float) -> InstanceType:
    alloc = Resources(cpu=vcpu * 1000, memory=8 * 2**30, pods=29)
    return replace(_type(name, price), vcpu=vcpu, allocatable=alloc, labels={})


def test_the_packer_stops_growing_a_claim_before_it_breaks_the_floor() -> None:
    # Only m5 comes in a size that holds three 1-cpu pods, and it is the cheapest way to:
    # packing for price alone would make one m5.2xlarge claim, one family only.
    types = [
        _sized("c5.large", 2, 0.085),
        _sized("m5.large", 2, 0.096),
        _sized("m5.2xlarge", 8, 0.1),
    ]
    offers = [Offering(t.name, "z1", wk.ON_DEMAND, t.od_price) for t in types]
    pool = NodePoolTemplate("flex", requirements=(R(FAMILY, "In", ("c5", "m5"), 2),))
    pods = [Pod(name=f"p{i}", uid=f"p{i}", requests=Resources(cpu=1000)) for i in range(3)]
    plan = schedule(pods, [], [pool], types, offers)
    assert not plan.unschedulable
    placed = [p.key for c in plan.new_claims for p in c.pods]
    assert sorted(placed) == sorted(p.key for p in pods)
    by_name = {t.name: t for t in types}
    for claim in plan.new_claims:
        assert {by_name[n].family for n in claim.instance_types} == {"c5", "m5"}
    before = [(c.instance_types, [p.key for p in c.pods]) for c in plan.new_claims]
    plan = enforce_min_values(plan, [pool], types, offers)
    assert [(c.instance_types, [p.key for p in c.pods]) for c in plan.new_claims] == before


def test_pods_that_break_the_floor_even_alone_all_stay_pending_with_the_reason() -> None:
    types = [_sized("c5.large", 2, 0.085), _sized("m5.2xlarge", 8, 0.1)]
    offers = [Offering(t.name, "z1", wk.ON_DEMAND, t.od_price) for t in types]
    pool = NodePoolTemplate("flex", requirements=(R(FAMILY, "In", ("c5", "m5"), 2),))
    pods = [Pod(name=f"p{i}", uid=f"p{i}", requests=Resources(cpu=3000)) for i in range(3)]
    plan = enforce_min_values(schedule(pods, [], [pool], types, offers), [pool], types, offers)
    assert not plan.new_claims
    assert sorted(plan.unschedulable) == sorted(p.key for p in pods)
    assert all(f"minValues 2 for {FAMILY}" in r for r in plan.unschedulable.values())
