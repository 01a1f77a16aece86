"""The mixed-instances split and pool choice: eksctl/ASG semantics, checked by example and
by property (the split always adds up, the base is honoured, rounding favours on-demand,
more percentage never means fewer on-demand instances)."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotwright.model.nodegroup import SpotAllocationStrategy
from spotwright.scheduling.distribution import (
    Member,
    PoolOffer,
    Split,
    choose_on_demand_pool,
    choose_removals,
    choose_spot_pool,
    on_demand_count,
    plan_scale,
    split,
)

OD, SPOT = "on-demand", "spot"

desired = st.integers(min_value=0, max_value=500)
base = st.integers(min_value=0, max_value=500)
pct = st.integers(min_value=0, max_value=100)


# ---------------------------------------------------------------------------------------
# The split


@pytest.mark.parametrize(
    ("d", "b", "p", "want"),
    [
        (4, 2, 0, Split(2, 2)),  # the seed walkthrough: base 2, 0 % above, minSize 4
        (10, 2, 25, Split(4, 6)),  # 2 + ceil(0.25 x 8) = 2 + 2
        (5, 2, 50, Split(4, 1)),  # 2 + ceil(1.5): the half goes to on-demand
        (3, 5, 0, Split(3, 0)),  # below the base everything is on-demand
        (7, 0, 100, Split(7, 0)),  # the default: all on-demand
        (7, 0, 0, Split(0, 7)),
        (1, 0, 1, Split(1, 0)),  # 1 % of one instance still rounds up
        (0, 3, 50, Split(0, 0)),
    ],
)
def test_split_examples(d: int, b: int, p: int, want: Split) -> None:
    assert split(d, b, p) == want


@given(desired, base, pct)
def test_split_sums_to_desired_and_honours_the_base(d: int, b: int, p: int) -> None:
    s = split(d, b, p)
    assert s.on_demand + s.spot == d
    assert s.on_demand >= min(d, b)
    assert s.spot >= 0


@given(desired, base, pct)
def test_rounding_favours_on_demand(d: int, b: int, p: int) -> None:
    above = max(0, d - b)
    exact_on_demand_above = p / 100 * above
    on_demand_above = on_demand_count(d, b, p) - min(d, b)
    # Never fewer on-demand than the exact share, and less than one instance more.
    assert exact_on_demand_above <= on_demand_above < exact_on_demand_above + 1
    assert on_demand_above == math.ceil(p * above / 100)


@given(desired, base, pct, pct)
def test_more_percentage_never_means_fewer_on_demand(d: int, b: int, p: int, q: int) -> None:
    low, high = sorted((p, q))
    assert on_demand_count(d, b, low) <= on_demand_count(d, b, high)


@given(desired, base, pct)
def test_growing_the_group_never_removes_on_demand(d: int, b: int, p: int) -> None:
    assert on_demand_count(d, b, p) <= on_demand_count(d + 1, b, p)


def test_impossible_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="pct=101"):
        on_demand_count(3, 0, 101)
    with pytest.raises(ValueError):
        on_demand_count(-1, 0, 50)


# ---------------------------------------------------------------------------------------
# Scaling


def members(od: int, spot: int, *, zones: tuple[str, ...] = ("a", "b", "c")) -> list[Member]:
    out = []
    for i in range(od):
        out.append(Member(f"od-{i}", OD, "m5.large", zones[i % len(zones)], True, float(i)))
    for i in range(spot):
        out.append(Member(f"sp-{i}", SPOT, "m5.large", zones[i % len(zones)], True, float(i)))
    return out


@given(st.integers(0, 30), st.integers(0, 30), st.integers(0, 40), st.integers(0, 40), pct)
def test_a_scale_plan_reaches_the_split_of_the_new_size(
    have_od: int, have_spot: int, d: int, b: int, p: int
) -> None:
    group = members(have_od, have_spot)
    target = split(d, b, p)
    plan = plan_scale(group, target)
    removed = set(plan.remove)
    assert len(removed) == len(plan.remove), "a member removed twice"
    od_after = sum(1 for m in group if m.capacity_type == OD and m.name not in removed)
    spot_after = sum(1 for m in group if m.capacity_type == SPOT and m.name not in removed)
    assert od_after + plan.add_on_demand == target.on_demand
    assert spot_after + plan.add_spot == target.spot
    # Nothing is both added and removed for the same capacity type.
    assert not (plan.add_on_demand and od_after < have_od)
    assert not (plan.add_spot and spot_after < have_spot)


def test_scale_in_keeps_the_on_demand_base() -> None:
    # 10 = 4 on-demand + 6 spot at base 2 / 25 %; down to 4 = 2 + ceil(0.5) = 3 + 1.
    plan = plan_scale(members(4, 6), split(4, 2, 25))
    assert (plan.add_on_demand, plan.add_spot) == (0, 0)
    removed = Counter(name.split("-")[0] for name in plan.remove)
    assert removed == {"od": 1, "sp": 5}


def test_removals_take_launching_members_first_then_rebalance_zones() -> None:
    group = [
        Member("a1", SPOT, "m5.large", "a", True, 1.0),
        Member("a2", SPOT, "m5.large", "a", True, 2.0),
        Member("a3", SPOT, "m6i.large", "a", True, 3.0),
        Member("b1", SPOT, "m5.large", "b", True, 4.0),
        Member("c1", SPOT, "m5.large", "c", False, 5.0),
    ]
    assert choose_removals(group, 1) == ["c1"]  # not ready yet: nothing runs there
    # Then zone a (3 members) until it is level, its fullest pool (m5.large) first, newest first.
    assert choose_removals(group, 3) == ["c1", "a2", "a3"]
    assert choose_removals(group, 0) == []
    assert len(choose_removals(group, 99)) == 5


# ---------------------------------------------------------------------------------------
# Pools

OFFERS = [
    # zone a: m5 cheapest but risky, m6i a bit dearer and safe, c5 dear and safest
    PoolOffer("m5.large", "a", 0.030, 0, 3),
    PoolOffer("m6i.large", "a", 0.033, 1, 1),
    PoolOffer("c5.large", "a", 0.045, 2, 0),
    PoolOffer("m5.large", "b", 0.031, 0, 3),
    PoolOffer("m6i.large", "b", 0.032, 1, 1),
    PoolOffer("c5.large", "b", 0.046, 2, 0),
]


def place(count: int, strategy: SpotAllocationStrategy, pools: int = 2) -> Counter[tuple[str, str]]:
    placed: Counter[tuple[str, str]] = Counter()
    for _ in range(count):
        offer = choose_spot_pool(OFFERS, placed, strategy, spot_instance_pools=pools)
        assert offer is not None
        placed[offer.pool] += 1
    return placed


def test_lowest_price_spreads_evenly_over_the_cheapest_pools_of_each_zone() -> None:
    placed = place(8, "lowest-price", pools=2)
    assert placed == {
        ("m5.large", "a"): 2,
        ("m6i.large", "a"): 2,
        ("m5.large", "b"): 2,
        ("m6i.large", "b"): 2,
    }
    assert set(place(4, "lowest-price", pools=1)) == {("m5.large", "a"), ("m5.large", "b")}


def test_capacity_strategies_pick_the_safest_pool_and_price_capacity_weighs_both() -> None:
    assert set(place(4, "capacity-optimized")) == {("c5.large", "a"), ("c5.large", "b")}
    assert set(place(4, "capacity-optimized-prioritized")) == {("c5.large", "a"), ("c5.large", "b")}
    # c5 is over 15 % dearer than the cheapest: of the rest, m6i is the safer.
    assert set(place(4, "price-capacity-optimized")) == {("m6i.large", "a"), ("m6i.large", "b")}


def test_prioritized_breaks_capacity_ties_by_the_listed_order() -> None:
    tied = [PoolOffer("x.large", "a", 0.02, 1, 0), PoolOffer("y.large", "a", 0.05, 0, 0)]
    prioritized = choose_spot_pool(tied, {}, "capacity-optimized-prioritized")
    cheapest = choose_spot_pool(tied, {}, "capacity-optimized")
    assert prioritized is not None and prioritized.instance_type == "y.large"
    assert cheapest is not None and cheapest.instance_type == "x.large"


def test_zones_are_balanced_and_a_zone_without_offers_is_skipped() -> None:
    placed: Counter[tuple[str, str]] = Counter({("m5.large", "a"): 2})
    offer = choose_spot_pool(OFFERS, placed, "lowest-price")
    assert offer is not None and offer.zone == "b"
    only_a = [o for o in OFFERS if o.zone == "a"]
    offer = choose_spot_pool(only_a, placed, "lowest-price")
    assert offer is not None and offer.zone == "a"
    assert choose_spot_pool([], placed, "lowest-price") is None


def test_on_demand_takes_the_first_listed_type_in_the_emptiest_zone() -> None:
    placed: Counter[tuple[str, str]] = Counter()
    chosen = []
    for _ in range(3):
        offer = choose_on_demand_pool(OFFERS, placed)
        assert offer is not None
        placed[offer.pool] += 1
        chosen.append(offer.pool)
    assert chosen == [("m5.large", "a"), ("m5.large", "b"), ("m5.large", "a")]
    # With m5 gone (out of capacity), the next listed type.
    rest = [o for o in OFFERS if o.instance_type != "m5.large"]
    fallback = choose_on_demand_pool(rest, {})
    assert fallback is not None and fallback.pool == ("m6i.large", "a")
    assert choose_on_demand_pool([], {}) is None


strategies = st.sampled_from(
    [
        "lowest-price",
        "capacity-optimized",
        "capacity-optimized-prioritized",
        "price-capacity-optimized",
    ]
)
offers = st.lists(
    st.builds(
        PoolOffer,
        instance_type=st.sampled_from(["a.large", "b.large", "c.large"]),
        zone=st.sampled_from(["z1", "z2", "z3"]),
        price=st.floats(min_value=0.01, max_value=1.0),
        priority=st.integers(0, 2),
        band=st.one_of(st.none(), st.integers(0, 4)),
    ),
    min_size=1,
    max_size=9,
    unique_by=lambda o: o.pool,
)


@given(offers, strategies, st.integers(1, 30), st.integers(1, 4))
def test_spot_placement_stays_in_the_offers_and_keeps_zones_level(
    pools: list[PoolOffer], strategy: SpotAllocationStrategy, count: int, limit: int
) -> None:
    placed: Counter[tuple[str, str]] = Counter()
    for _ in range(count):
        offer = choose_spot_pool(pools, placed, strategy, spot_instance_pools=limit)
        assert offer is not None and offer in pools
        placed[offer.pool] += 1
    per_zone = Counter[str]()
    for (_, zone), n in placed.items():
        per_zone[zone] += n
    zones = {o.zone for o in pools}
    counts = [per_zone[z] for z in zones]
    assert max(counts) - min(counts) <= 1
    if strategy == "lowest-price":
        # Never more pools per zone than asked for.
        for zone in zones:
            assert sum(1 for (_, z) in placed if z == zone) <= limit
