"""One scenario per source document, replayed end to end; outcomes from the JSON summary."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest

from spotwright.catalog import load_catalog
from spotwright.model.scenario import default_scenario_path, load_scenario
from spotwright.observability.logs import configure_logging
from spotwright.simulation import simulate

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

pytestmark = pytest.mark.scenario


@cache
def run(name: str, seed: int | None = None) -> dict[str, Any]:
    configure_logging(sink=lambda _line: None)
    path = default_scenario_path() if name == "default" else EXAMPLES / f"{name}.yaml"
    catalog = load_catalog()
    return simulate(load_scenario(path, catalog), catalog, seed=seed)


def test_default_story_falls_back_to_on_demand_and_survives_an_interruption() -> None:
    s = run("default")
    assert s["launch_failures"].get("InsufficientInstanceCapacity", 0) > 0
    assert s["nodes"]["launched"]["on-demand"] >= 1
    assert s["nodes"]["launched"]["spot"] >= 1
    assert s["interruptions"]["notices"] >= 1
    assert s["interruptions"]["lost_before_drained"] == 0
    assert s["pods"]["lost"] == 0
    assert 0 < s["cost"]["total_usd"] < s["cost"]["on_demand_equivalent_usd"]
    assert s["availability_pct"] > 90


def test_spot_short_in_every_zone_falls_back_to_on_demand() -> None:
    s = run("spot-shortage")
    assert s["launch_failures"].get("InsufficientInstanceCapacity", 0) > 0
    assert s["nodes"]["launched"]["on-demand"] >= 1
    # Fallback is a scheduling round away, not minutes.
    assert s["pods"]["max_pending_seconds"] < 120


def test_spot_quota_exceeded_falls_back_at_once() -> None:
    s = run("spot-quota")
    assert s["launch_failures"].get("MaxSpotInstanceCountExceeded", 0) >= 1
    assert s["nodes"]["launched"]["on-demand"] >= 1
    # The whole capacity type is closed by one error: no walk through every spot offering.
    assert s["launch_failures"].get("MaxSpotInstanceCountExceeded", 0) <= 2
    assert s["pods"]["max_pending_seconds"] < 120


def test_on_demand_shortage_keeps_retrying_until_capacity_returns() -> None:
    s = run("on-demand-shortage")
    failures = s["launch_failures"].get("InsufficientInstanceCapacity", 0)
    assert failures >= 3, "the provisioner should have retried several times"
    assert s["nodes"]["launched"]["on-demand"] >= 1
    assert s["nodes"]["launched"]["spot"] == 0
    # Pods waited for the shortage to end, then ran.
    assert s["pods"]["max_pending_seconds"] > 300
    assert s["availability_pct"] < 100


def test_interrupted_spot_node_is_drained_and_replaced_with_no_pod_lost() -> None:
    s = run("spot-interruption")
    assert s["nodes"]["launched"]["on-demand"] == 0
    assert s["nodes"]["launched"]["spot"] >= 2, "a replacement node must have been launched"
    assert s["interruptions"]["notices"] == 1
    assert s["interruptions"]["drained_before_deadline"] == 1
    assert s["interruptions"]["lost_before_drained"] == 0
    assert s["pods"]["lost"] == 0
    assert s["pods"]["evicted"] >= 1
    assert 0 < s["pods"]["recovery_p99_seconds"] < 120
    assert 0 < s["pods"]["notice_recovery_p99_seconds"] < 120
    # The PDB (minAvailable 1 of 2) held: one pod left at a time.
    assert s["disruption_budgets"]["drops"] == 0
    [node] = s["interruptions"]["per_node"]
    assert node["pods_moved"] == 2 and node["notice_at"] == node["first_eviction_at"] == 600
    assert s["cost"]["savings_pct"] > 30


def test_same_seed_same_result_other_seed_may_differ() -> None:
    assert run("spot-interruption", 7) == run("spot-interruption", 7)


@pytest.mark.parametrize("lead", [90, 300])
def test_a_rebalance_recommendation_ahead_of_the_notice_replaces_before_the_drain(
    lead: int,
) -> None:
    """With 90 s of warning or more the replacement is ready before the first eviction."""
    import yaml

    from spotwright.model.scenario import parse_scenario

    document = yaml.safe_load((EXAMPLES / "spot-interruption.yaml").read_text())
    for event in document["spec"]["events"]:
        if "interrupt" in event:
            event["interrupt"]["rebalanceLeadSeconds"] = lead
    configure_logging(sink=lambda _line: None)
    catalog = load_catalog()
    scenario = parse_scenario(document, source="rebalance.yaml", catalog=catalog)
    s = simulate(scenario, catalog)
    assert s["interruptions"]["rebalance_recommendations"] == 1
    assert s["pods"]["lost"] == 0
    assert s["interruptions"]["lost_before_drained"] == 0
    plain = run("spot-interruption")
    # Moving early pays: nobody waits for a node to boot after the notice.
    assert s["availability_pct"] >= plain["availability_pct"]
    [node] = s["interruptions"]["per_node"]
    assert node["replacement_ready_at"] <= node["first_eviction_at"]
    assert s["interruptions"]["replaced_before_first_eviction"] == 1
    assert s["pods"]["waited_for_node"] == 0 < s["pods"]["moved"]
    assert s["disruption_budgets"]["drops"] == 0
