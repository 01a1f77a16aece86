"""The benchmark's lower bound: never above the best packing, and tight where it can be."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_fixtures import GIB, catalog, offers, pod

from spotwright.benchmarks.bounds import Shape, configuration_bound
from spotwright.benchmarks.scheduling import lower_bound, packing_bound
from spotwright.scheduling import NodePoolTemplate, schedule

Vec = tuple[int, ...]


def partitions(items: list[int]) -> Iterator[list[list[int]]]:
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for smaller in partitions(rest):
        for i in range(len(smaller)):
            yield [*smaller[:i], [first, *smaller[i]], *smaller[i + 1 :]]
        yield [[first], *smaller]


def optimum(reqs: list[Vec], solo: list[str], types: list[tuple[float, Vec]]) -> float:
    """The cheapest packing, by trying every way to split the pods into nodes."""
    best = math.inf
    for blocks in partitions(list(range(len(reqs)))):
        cost = 0.0
        for block in blocks:
            groups = [solo[i] for i in block if solo[i]]
            if len(groups) != len(set(groups)):
                cost = math.inf
                break
            total = [sum(reqs[i][d] for i in block) for d in range(len(reqs[0]))]
            fitting = [
                p for p, cap in types if all(t <= c for t, c in zip(total, cap, strict=True))
            ]
            if not fitting:
                cost = math.inf
                break
            cost += min(fitting)
        best = min(best, cost)
    return best


@settings(max_examples=80, deadline=None)
@given(
    reqs=st.lists(
        st.tuples(st.integers(1, 8), st.integers(1, 8), st.just(1)), min_size=1, max_size=6
    ),
    solo=st.lists(st.sampled_from(["", "", "a"]), min_size=6, max_size=6),
    types=st.lists(
        st.tuples(
            st.floats(0.5, 10.0),
            st.tuples(st.integers(4, 16), st.integers(4, 16), st.integers(1, 6)),
        ),
        min_size=1,
        max_size=3,
    ),
)
def test_bound_never_exceeds_the_best_packing(
    reqs: list[Vec], solo: list[str], types: list[tuple[float, Vec]]
) -> None:
    solo = solo[: len(reqs)]
    best = optimum(reqs, solo, types)
    counts: dict[tuple[Vec, str], int] = {}
    for req, group in zip(reqs, solo, strict=True):
        counts[req, group] = counts.get((req, group), 0) + 1
    shapes = [Shape(req, n, group) for (req, group), n in counts.items()]
    bound = configuration_bound(shapes, types).value
    if math.isinf(best):
        return  # some pod fits no type: it is left out of the bound
    assert bound <= best * (1 + 1e-6)


def test_bound_is_exact_for_one_shape() -> None:
    # 10 pods of (3, 1): three fit a (10, 10) node, one fits a (4, 4) node at half the
    # price; the LP buys 10/3 big nodes, the fractional form of the best packing (4 big)
    result = configuration_bound([Shape((3, 1, 1), 10)], [(1.0, (10, 10, 10)), (0.5, (4, 4, 4))])
    assert result.value == pytest.approx(10 / 3)
    assert result.lp is not None
    solo = configuration_bound([Shape((1, 1, 1), 5, "x")], [(1.0, (10, 10, 10))])
    assert solo.value == pytest.approx(5.0)  # five pods that must not share: five nodes


def test_bound_beats_the_simple_one_and_stays_below_the_packer() -> None:
    types = catalog()
    offerings = offers(types)
    pods = [
        pod(f"p{i}", cpu=(1700, 300, 900)[i % 3], mem_gib=(1, 6, 0.5)[i % 3]) for i in range(90)
    ]
    template = NodePoolTemplate("default")
    plan = schedule(pods, [], [template], types, offerings)
    tight = packing_bound(pods, types, offerings, template)
    simple = lower_bound(pods, types, offerings)
    assert simple <= tight * (1 + 1e-9)
    assert tight <= plan.cost_per_hour * (1 + 1e-9)
    assert plan.cost_per_hour <= tight * 1.15
    assert all(c.requests.memory <= 64 * GIB for c in plan.new_claims)
