"""``spotwright bench``: figures for the speed goals (benchmarks print, tests assert)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from spotwright.benchmarks.incremental import scenario_bound
from spotwright.catalog import CatalogError, load_catalog
from spotwright.cli._errors import UserError
from spotwright.model.errors import ScenarioError
from spotwright.model.scenario import bundled_example, load_scenario
from spotwright.observability.logs import configure_logging
from spotwright.simulation import simulate

__all__ = ["bench"]


@click.group("bench")
def bench() -> None:
    """Measure scheduling and simulation speed."""


@bench.command("scheduling")
@click.option(
    "--pods",
    "pod_counts",
    type=int,
    multiple=True,
    default=(1000, 5000, 20000),
    show_default=True,
    help="Pods to schedule (repeat for several runs).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per run.")
@click.option(
    "--compare-karpenter",
    is_flag=True,
    help="Also build and run Karpenter's own benchmark (Go), both sides on one CPU.",
)
@click.option(
    "--karpenter-version",
    default=None,
    help="sigs.k8s.io/karpenter version to compare with (default: a tested release).",
)
def bench_scheduling(
    pod_counts: tuple[int, ...],
    seed: int,
    as_json: bool,
    compare_karpenter: bool,
    karpenter_version: str | None,
) -> None:
    """Karpenter's scheduling benchmark mix: pods/s, nodes, cost against a lower bound."""
    from spotwright.benchmarks.karpenter import (
        DEFAULT_VERSION,
        KarpenterBench,
        NotAvailable,
        pin_to_one_cpu,
    )
    from spotwright.benchmarks.scheduling import (
        GETTING_STARTED,
        run_catalog_mix_benchmark,
        run_identical_benchmark,
        run_scheduling_benchmark,
    )

    for count in pod_counts:
        if count <= 0:
            raise UserError(f"--pods must be positive, got {count}")
    karpenter: KarpenterBench | None = None
    cpu: int | None = None
    if compare_karpenter:
        karpenter = KarpenterBench(karpenter_version or DEFAULT_VERSION)
        cpu = pin_to_one_cpu()
        try:
            karpenter.build()
        except NotAvailable as exc:
            click.echo(f"karpenter: not compared: {exc}", err=True)
            karpenter = None
    for count in pod_counts:
        ours = run_scheduling_benchmark(count, seed=seed)
        _emit(ours, as_json)
        if karpenter is None:
            continue
        try:
            theirs = karpenter.run(count, cpu)
        except NotAvailable as exc:
            click.echo(f"karpenter: not compared at {count} pods: {exc}", err=True)
            continue
        _emit({"benchmark": "karpenter", **asdict(theirs)}, as_json)
        _emit(
            {
                "benchmark": "compare",
                "pods": count,
                "cpu": cpu,
                "speedup_wall": _ratio(ours["pods_per_second"], theirs.pods_per_second),
                "speedup_cpu": _ratio(ours["pods_per_cpu_second"], theirs.pods_per_cpu_second),
                "nodes_spotwright": ours["nodes"],
                "nodes_karpenter": theirs.nodes,
            },
            as_json,
        )
    _emit(run_identical_benchmark(), as_json)
    _emit(run_catalog_mix_benchmark(seed=seed), as_json)
    _emit(
        run_catalog_mix_benchmark(
            seed=seed, requirements=GETTING_STARTED, name="catalog-mix-getting-started"
        ),
        as_json,
    )


def _ratio(ours: float | None, theirs: float) -> float | None:
    return round(ours / theirs, 1) if ours and theirs else None


@bench.command("simulate")
@click.argument("scenario", required=False, type=click.Path(path_type=Path, dir_okay=False))
@click.option("--seed", type=int, default=None)
@click.option("--json", "as_json", is_flag=True)
def bench_simulate(scenario: Path | None, seed: int | None, as_json: bool) -> None:
    """Wall time and cost (against a lower bound) to simulate SCENARIO (default: 24 h of
    a 100-node cluster)."""
    try:
        catalog = load_catalog()
        parsed = load_scenario(scenario or bundled_example("day-100-nodes"), catalog)
    except (ScenarioError, CatalogError) as exc:
        raise UserError(str(exc)) from exc
    configure_logging(sink=lambda _line: None)
    started = time.perf_counter()
    summary = simulate(parsed, catalog, seed=seed)
    wall = time.perf_counter() - started
    # what the scenario's demand costs at least (benchmarks.incremental), outside the timing
    bound = scenario_bound(parsed, list(catalog.types))
    result = {
        "benchmark": "simulate",
        "scenario": parsed.name,
        "simulated_seconds": summary["simulated_seconds"],
        "wall_seconds": round(wall, 3),
        "speedup": round(summary["simulated_seconds"] / wall, 1) if wall else None,
        "peak_nodes": summary["nodes"]["peak"],
        "nodes_launched": summary["nodes"]["launched"],
        "notices": summary["interruptions"]["notices"],
        "cost_usd": summary["cost"]["total_usd"],
        "lower_bound_usd": round(bound, 4),
        "cost_vs_bound": round(summary["cost"]["total_usd"] / bound, 4) if bound else None,
    }
    _emit(result, as_json)


def _emit(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(result))
        return
    click.echo("  ".join(f"{k}={v}" for k, v in result.items()))
