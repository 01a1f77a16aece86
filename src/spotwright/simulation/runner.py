"""``simulate()``: replay a scenario through the real controllers on a virtual clock.

The run builds the world, starts the same controller objects ``spotwright controller`` runs
live, applies the scenario's workloads and timeline, lets virtual time pass to the end and
returns the summary a user reads: cost, savings, nodes, launch failures, interruptions,
pods evicted and lost, pending and recovery times, availability.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

from prometheus_client import Counter

from spotwright.adapters.sim_autoscaling import SimAutoScaling
from spotwright.adapters.virtual_loop import run_virtual
from spotwright.catalog import Catalog
from spotwright.controllers import (
    Context,
    GarbageCollector,
    InterruptionHandler,
    NodeClaimLifecycle,
    Provisioner,
    Settings,
    Terminator,
)
from spotwright.controllers.nodegroups import NodeGroupController, group_target
from spotwright.model.scenario import (
    CapacityEvent,
    InterruptEvent,
    QuotaEvent,
    ScaleEvent,
    Scenario,
)
from spotwright.observability.logs import get_logger
from spotwright.observability.metrics import Metrics
from spotwright.ports.clock import LoopClock
from spotwright.simulation.ledger import Ledger, percentile
from spotwright.simulation.world import SimWorld

__all__ = ["EPOCH", "Progress", "simulate"]

#: Simulated time starts here, so that logs and results are identical run after run.
EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z

Progress = Callable[[float, float], None]

log = get_logger("simulator")


def simulate(
    scenario: Scenario,
    catalog: Catalog,
    *,
    seed: int | None = None,
    until: float | None = None,
    settings: Settings | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run ``scenario`` and return its summary (the ``--json`` document)."""
    run_seed = scenario.seed if seed is None else seed
    end = scenario.duration if until is None else min(until, scenario.duration)
    return run_virtual(_run(scenario, catalog, run_seed, end, settings or Settings(), progress))


async def _run(
    scenario: Scenario,
    catalog: Catalog,
    seed: int,
    end: float,
    settings: Settings,
    progress: Progress | None,
) -> dict[str, Any]:
    clock = LoopClock(epoch=EPOCH)
    types = {t.name: t for t in catalog.types}
    world = SimWorld(
        instance_types=types,
        region=scenario.region,
        zones=list(scenario.zones),
        clock=clock,
        rng=random.Random(seed),
        interruptions=scenario.market.interruptions,
        rebalance_lead_seconds=scenario.market.rebalance_lead_seconds,
        boot_seconds=scenario.market.boot_seconds,
    )
    metrics = Metrics()
    ctx = Context(
        cluster=world.cluster,
        cloud=world.market,
        clock=clock,
        metrics=metrics,
        nodepools=scenario.nodepools,
        instance_types=types,
        settings=settings,
    )
    controllers = [
        Provisioner(ctx).run(),
        NodeClaimLifecycle(ctx).run(),
        Terminator(ctx).run(),
        InterruptionHandler(ctx, world.queue, SimAutoScaling(clock)).run(),
        GarbageCollector(ctx).run(),
        world.market.run(),
    ]
    if scenario.nodegroups:
        world.track_groups(
            {
                group.name: {
                    "on-demand": group_target(group).on_demand,
                    "spot": group_target(group).spot,
                }
                for group in scenario.nodegroups
            }
        )
        controllers.append(NodeGroupController(ctx, scenario.nodegroups).run())
    tasks = [asyncio.create_task(c) for c in controllers]
    await asyncio.sleep(0)
    log.info(
        "simulation started",
        scenario=scenario.name,
        seed=seed,
        nodepools=len(scenario.nodepools),
        duration=f"{end:.0f}s",
    )
    for pdb in scenario.pdbs():
        world.ledger.track_pdb(pdb, clock.now())
        world.cluster.apply_pdb(pdb)
    for deployment in scenario.deployments():
        world.cluster.apply_deployment(deployment)
    timeline = asyncio.create_task(_timeline(scenario, world, clock, end))
    try:
        await _pass_time(clock, end, progress, tasks)
    finally:
        timeline.cancel()
    summary = _summary(scenario, seed, world, metrics, clock.now(), end, start=EPOCH)
    for task in tasks:
        task.cancel()
    return summary


async def _pass_time(
    clock: LoopClock,
    end: float,
    progress: Progress | None,
    tasks: list[asyncio.Task[None]],
) -> None:
    start = clock.now()
    steps = 100 if progress else 1
    for i in range(1, steps + 1):
        await clock.sleep(start + end * i / steps - clock.now())
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        if progress:
            progress(i / steps, end * i / steps)


async def _timeline(scenario: Scenario, world: SimWorld, clock: LoopClock, end: float) -> None:
    start = clock.now()
    for event in scenario.events:
        if event.at > end:
            return
        await clock.sleep(start + event.at - clock.now())
        _apply(event, world, clock)


def _apply(event: object, world: SimWorld, clock: LoopClock) -> None:
    loop = asyncio.get_running_loop()
    if isinstance(event, ScaleEvent):
        log.info("scaling deployment", deployment=event.workload, replicas=event.replicas)
        world.cluster.scale(event.workload, event.replicas)
    elif isinstance(event, InterruptEvent):
        hit = world.market.interrupt(
            event.count,
            capacity_type=event.capacity_type,
            instance_type=event.instance_type,
            zone=event.zone,
            rebalance_lead_seconds=event.rebalance_lead_seconds,
        )
        log.info(
            "market interrupting instances",
            requested=event.count,
            instances=", ".join(i.id for i in hit) or "<none running>",
        )
    elif isinstance(event, CapacityEvent):
        world.market.set_capacity(
            event.capacity_type,
            instance_types=event.instance_types,
            zones=event.zones,
            available=event.available,
        )
        log.info(
            "market capacity changed",
            capacity_type=event.capacity_type,
            available=event.available,
            instance_types=event.instance_types or "all",
            zones=event.zones or "all",
        )
        if event.for_seconds is not None:
            loop.call_later(
                event.for_seconds,
                lambda: world.market.set_capacity(
                    event.capacity_type,
                    instance_types=event.instance_types,
                    zones=event.zones,
                    available=not event.available,
                ),
            )
    elif isinstance(event, QuotaEvent):
        world.market.set_quota(event.capacity_type, event.max_instances)
        log.info(
            "market quota changed",
            capacity_type=event.capacity_type,
            max_instances=event.max_instances,
        )
        if event.for_seconds is not None:
            loop.call_later(
                event.for_seconds, lambda: world.market.set_quota(event.capacity_type, None)
            )


def _summary(
    scenario: Scenario,
    seed: int,
    world: SimWorld,
    metrics: Metrics,
    now: float,
    end: float,
    *,
    start: float,
) -> dict[str, Any]:
    world.finish()
    ledger = world.ledger
    ledger.still_pending(now)
    billing = world.market.billing(now)
    total = billing.total_usd
    od = billing.on_demand_equivalent_usd
    launched = {"spot": 0, "on-demand": 0}
    launched.update(_totals(metrics.nodes_launched, "capacity_type"))
    failures = _totals(metrics.launch_failures, "reason")
    return {
        "scenario": scenario.name,
        "seed": seed,
        "simulated_seconds": round(end, 3),
        "cost": {
            "total_usd": round(total, 4),
            "on_demand_equivalent_usd": round(od, 4),
            "savings_pct": round(100.0 * (1 - total / od), 2) if od > 0 else 0.0,
        },
        "nodes": {"launched": launched, "peak": world.peak_nodes},
        "launch_failures": dict(sorted(failures.items())),
        "interruptions": {
            "notices": world.notices,
            "rebalance_recommendations": world.rebalances,
            "drained_before_deadline": world.drained_before_deadline,
            "lost_before_drained": world.lost_before_drained,
        }
        | _moves(ledger, start),
        "pods": {
            "evicted": ledger.evicted,
            "lost": ledger.lost,
            "max_pending_seconds": round(ledger.max_pending, 3),
            "recovery_p50_seconds": round(percentile(ledger.recovery, 50), 3),
            "recovery_p99_seconds": round(percentile(ledger.recovery, 99), 3),
        }
        | _pods_moved(ledger),
        "availability_pct": round(ledger.availability_pct(now), 3),
        "disruption_budgets": ledger.budgets.summary(),
    } | _groups(scenario, ledger)


def _moves(ledger: Ledger, start: float) -> dict[str, Any]:
    """Per interrupted node: when it was signalled, when its first pod left, when the
    capacity its pods moved to was ready, and when the last of them was ready there."""

    def at(moment: float | None) -> float | None:
        return None if moment is None else round(moment - start, 3)

    books = sorted(ledger.interrupted.nodes.values(), key=lambda b: (b.signal_at, b.node))
    moved = [b for b in books if b.moved > 0 or b.stranded]
    per_node = []
    for b in moved:
        recovery = b.recovery_seconds()
        per_node.append(
            {
                "node": b.node,
                "rebalance_at": at(b.rebalance_at),
                "notice_at": at(b.notice_at),
                "first_eviction_at": at(b.first_out_at),
                "replacement_ready_at": at(b.replacement_ready_at),
                "all_ready_at": at(b.last_ready_at) if b.recovered else None,
                "pods_moved": b.moved,
                "pods_waited_for_node": b.waited,
                "replaced_before_first_eviction": b.replaced_first,
                "recovery_seconds": None if recovery is None else round(recovery, 3),
            }
        )
    return {
        "nodes_with_pods_moved": len(moved),
        "replaced_before_first_eviction": sum(1 for b in moved if b.replaced_first),
        "not_recovered": sum(1 for b in moved if not b.recovered),
        "per_node": per_node,
    }


def _pods_moved(ledger: Ledger) -> dict[str, Any]:
    """How the pods that left interrupted nodes fared, and recovery counted per notice."""
    nodes = list(ledger.interrupted.nodes.values())
    per_notice = [r for b in nodes if (r := b.recovery_seconds()) is not None]
    longest = max((b.longest_wait for b in nodes), default=0.0)
    return {
        "moved": sum(b.moved for b in nodes),
        "waited_for_node": sum(b.waited for b in nodes),
        "longest_wait_for_node_seconds": round(longest, 3),
        "notice_recovery_p50_seconds": round(percentile(per_notice, 50), 3),
        "notice_recovery_p99_seconds": round(percentile(per_notice, 99), 3),
    }


def _groups(scenario: Scenario, ledger: Ledger) -> dict[str, Any]:
    """The ``node_groups`` part of the summary; absent when the scenario has none."""
    if not scenario.nodegroups:
        return {}
    out: dict[str, Any] = {}
    for group in scenario.nodegroups:
        books = ledger.groups[group.name]
        out[group.name] = {
            "desired": group.desired,
            "target": dict(books.target),
            "nodes": {ct: books.nodes.get(ct, 0) for ct in ("on-demand", "spot")},
            "launched": {ct: books.launched.get(ct, 0) for ct in ("on-demand", "spot")},
            "at_target_pct": round(books.at_target_pct(), 3),
        }
    return {"node_groups": out}


def _totals(counter: Counter, label: str) -> dict[str, int]:
    """Sum a labelled counter by one of its labels, read back from the registry."""
    out: dict[str, int] = {}
    for metric in counter.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                key = sample.labels[label]
                out[key] = out.get(key, 0) + int(sample.value)
    return out
