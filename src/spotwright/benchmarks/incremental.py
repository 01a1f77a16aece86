"""What a scenario's demand must cost at least over its run: the simulation cost check.

``bench scheduling`` compares one batch with the configuration-LP bound; a cluster that
grows a few pods at a time is a different test of the packer (each batch lands beside
the room earlier ones left), and one where a regression once doubled the node count
while the one-batch figures improved. So ``bench simulate`` prints the run's cost next
to a lower bound computed here from the scenario alone:

* demand is piecewise constant: each Deployment's replicas, changed by the scenario's
  ``scale`` events;
* for each stretch, the pods are split among NodePools the way the scheduler would send
  them (one ``schedule`` call on an empty cluster), and each pool's share costs at least
  its configuration-LP bound (``packing_bound``) on the types that pool allows;
* every spot price is taken at the bottom of the market's per-zone spread, every type
  in every zone, so the bound holds whatever zone prices the market's seed drew.

It leaves out boot time, pods pending while nodes start, replacements after
interruptions and the lag before consolidation, all of which only add to the real cost;
so the ratio of cost to bound is above 1 by how much those and the packing lose.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from spotwright.adapters._market_pools import ZONE_PRICE_SPREAD, offers_spot
from spotwright.benchmarks.scheduling import packing_bound
from spotwright.catalog._types import InstanceType
from spotwright.model import labels as wk
from spotwright.model.objects import Pod
from spotwright.model.scenario import ScaleEvent, Scenario
from spotwright.ports.cloud import Offering
from spotwright.scheduling import schedule
from spotwright.scheduling.plan import NodePoolTemplate

__all__ = ["demand_segments", "lowest_offerings", "scenario_bound"]

_HOUR = 3600.0


def demand_segments(scenario: Scenario) -> list[tuple[float, float, dict[str, int]]]:
    """(start, end, replicas per Deployment) for each stretch of constant demand."""
    replicas = {d.name: d.replicas for d in scenario.deployments()}
    out: list[tuple[float, float, dict[str, int]]] = []
    start = 0.0
    for event in scenario.events:
        if not isinstance(event, ScaleEvent) or event.workload not in replicas:
            continue
        at = min(event.at, scenario.duration)
        if at > start:
            out.append((start, at, dict(replicas)))
            start = at
        replicas[event.workload] = event.replicas
    if scenario.duration > start:
        out.append((start, scenario.duration, dict(replicas)))
    return out


def lowest_offerings(types: Sequence[InstanceType], zones: Sequence[str]) -> list[Offering]:
    """Every type in every zone at the lowest price the simulated market can ask."""
    out: list[Offering] = []
    for it in types:
        for zone in zones:
            out.append(Offering(it.name, zone, wk.ON_DEMAND, it.od_price))
            if offers_spot(it) and it.spot_savings_pct is not None:
                base = it.od_price * (1 - it.spot_savings_pct / 100)
                price = min(base * ZONE_PRICE_SPREAD[0], it.od_price)
                out.append(Offering(it.name, zone, wk.SPOT, price))
    return out


def scenario_bound(scenario: Scenario, types: Sequence[InstanceType]) -> float:
    """A lower bound in USD on running ``scenario``'s demand for its whole duration."""
    offerings = lowest_offerings(types, scenario.zones)
    templates = [
        NodePoolTemplate(
            name=pool.name,
            weight=pool.weight,
            requirements=pool.requirements(),
            labels=pool.labels(),
            taints=pool.taints(),
        )
        for pool in sorted(scenario.nodepools, key=lambda p: -p.weight)
    ]
    deployments = {d.name: d for d in scenario.deployments()}
    total = 0.0
    cache: dict[tuple[tuple[str, int], ...], float] = {}
    for start, end, replicas in demand_segments(scenario):
        key = tuple(sorted(replicas.items()))
        hourly = cache.get(key)
        if hourly is None:
            pods = [
                dataclasses.replace(
                    deployments[name].template,
                    name=f"{name}-{i}",
                    uid=f"{name}-{i}",
                    owner=name,
                )
                for name, count in key
                for i in range(count)
            ]
            hourly = cache[key] = _hourly_bound(pods, templates, types, offerings)
        total += hourly * (end - start) / _HOUR
    return total


def _hourly_bound(
    pods: list[Pod],
    templates: list[NodePoolTemplate],
    types: Sequence[InstanceType],
    offerings: list[Offering],
) -> float:
    if not pods:
        return 0.0
    plan = schedule(pods, [], templates, types, offerings)
    by_pool: dict[str, list[Pod]] = {}
    for claim in plan.new_claims:
        by_pool.setdefault(claim.nodepool, []).extend(claim.pods)
    named = {t.name: t for t in templates}
    return sum(
        packing_bound(members, types, offerings, named[name]) for name, members in by_pool.items()
    )
