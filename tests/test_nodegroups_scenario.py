"""The bundled mixed node group story, replayed end to end: the on-demand base and the
percentage hold through spot interruptions, a pool shortage and a rebalance
recommendation, and the pods stay available. Outcomes come from the JSON summary."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest

from spotwright.catalog import load_catalog
from spotwright.model.scenario import bundled_example, load_scenario
from spotwright.observability.logs import configure_logging
from spotwright.simulation import simulate

pytestmark = pytest.mark.scenario


@cache
def run(until: float | None = None) -> dict[str, Any]:
    configure_logging(sink=lambda _line: None)
    catalog = load_catalog()
    scenario = load_scenario(bundled_example("mixed-node-group"), catalog)
    return simulate(scenario, catalog, until=until)


def test_the_split_holds_through_interruptions_and_pods_stay_available() -> None:
    s = run()
    group = s["node_groups"]["ng-1"]
    # 10 nodes: base 2 + ceil(25 % of 8) = 4 on-demand, 6 spot.
    assert group["target"] == {"on-demand": 4, "spot": 6}
    assert group["nodes"] == group["target"]
    # Three spot nodes were replaced by spot; on-demand was never needed beyond its share.
    assert s["interruptions"]["notices"] == 3
    assert group["launched"] == {"on-demand": 4, "spot": 9}
    assert s["nodes"]["launched"] == {"on-demand": 4, "spot": 9}
    # The m5a.large shortage cost one failed launch, and the group moved to another pool.
    assert s["launch_failures"] == {"InsufficientInstanceCapacity": 1}
    # Short of target only while the first nodes booted and while a replacement booted.
    assert group["at_target_pct"] > 95
    assert s["interruptions"]["lost_before_drained"] == 0
    assert s["pods"]["lost"] == 0
    assert s["availability_pct"] > 97
    assert 0 < s["cost"]["total_usd"] < s["cost"]["on_demand_equivalent_usd"]


@pytest.mark.parametrize("minutes", [11, 27])
def test_the_split_is_back_soon_after_each_interruption(minutes: int) -> None:
    group = run(until=minutes * 60.0)["node_groups"]["ng-1"]
    assert group["nodes"] == {"on-demand": 4, "spot": 6}


def test_the_story_replays_identically() -> None:
    first = run()
    run.cache_clear()
    assert run() == first
