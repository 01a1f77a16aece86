"""Scheduling benchmarks: Karpenter's diverse mix, and one big identical Deployment.

``run_scheduling_benchmark`` rebuilds the workload of Karpenter's
``scheduling_benchmark_test.go`` from its description: 400 synthetic instance types (type
``i`` has ``i+1`` vCPU, ``2(i+1)`` GiB and ``10(i+1)`` pods; spot in two zones and
on-demand in three, one price per type) and five pod kinds in equal shares (no
constraint, zonal spread, hostname spread, zonal self-affinity, hostname
self-anti-affinity) with seeded cpu and memory draws. Karpenter reports about 1,000 to
1,350 pods/s on it (PR core#2486), so the figures here are directly comparable.

Cost is reported against a lower bound: the cheapest available price per allocatable
vCPU and per GiB, applied to the total requests (the larger of the two). No packing can
beat it; anti-affinity (one node per pod) is the main reason to sit above it.
"""

from __future__ import annotations

import random
import resource
import sys
import time
from collections.abc import Sequence
from typing import Any

from spotwright.catalog._types import InstanceType
from spotwright.model import labels as wk
from spotwright.model.objects import (
    LabelSelector,
    Pod,
    PodAffinityTerm,
    TopologySpreadConstraint,
)
from spotwright.model.resources import Resources
from spotwright.ports.cloud import Offering
from spotwright.scheduling import NodePoolTemplate, Plan, schedule

__all__ = [
    "lower_bound",
    "pod_bound",
    "run_catalog_mix_benchmark",
    "run_identical_benchmark",
    "run_scheduling_benchmark",
    "synthetic_instance_types",
]

_GIB = 2**30
_MIB = 2**20
_CPU_CHOICES = (100, 250, 500, 1000, 1500)
_MEMORY_CHOICES = (100, 256, 512, 1024, 2048, 4096)
_ZONES = ("test-zone-1", "test-zone-2", "test-zone-3")


def synthetic_instance_types(count: int = 400) -> tuple[list[InstanceType], list[Offering]]:
    """Karpenter's ``fake.InstanceTypes(n)`` shape, priced linearly in vCPU and memory."""
    types: list[InstanceType] = []
    offerings: list[Offering] = []
    for i in range(count):
        size = i + 1
        price = round(0.025 * size + 0.0125 * 2 * size, 6)
        itype = InstanceType(
            name=f"fake-it-{i}",
            family="fake",
            category="f",
            generation=1,
            size=str(size),
            vcpu=size,
            memory_mib=2 * size * 1024,
            arch="amd64",
            gpu_count=0,
            gpu_name="",
            allocatable=Resources(
                cpu=1000 * size, memory=2 * size * _GIB, pods=10 * size, ephemeral=100 * _GIB
            ),
            od_price=price,
            spot_savings_pct=0.0,
            interruption_band=0,
        )
        types.append(itype)
        for zone in _ZONES[:2]:
            offerings.append(Offering(itype.name, zone, wk.SPOT, price))
        for zone in _ZONES:
            offerings.append(Offering(itype.name, zone, wk.ON_DEMAND, price))
    return types, offerings


def _diverse_pods(count: int, seed: int) -> list[Pod]:
    rng = random.Random(seed)
    pods: list[Pod] = []
    share = max(1, count // 5)
    kinds = ("generic", "zone-spread", "host-spread", "zone-affinity", "host-anti")
    for kind_index, kind in enumerate(kinds):
        n = share if kind_index < 4 else count - 4 * share
        for j in range(n):
            value = rng.choice("abcdefg")
            labels = {"kind": kind, "value": value}
            selector = LabelSelector.of(labels)
            pod = Pod(
                name=f"{kind}-{j}",
                uid=f"{kind_index:02d}-{j:07d}",
                labels=labels,
                requests=Resources(
                    cpu=rng.choice(_CPU_CHOICES), memory=rng.choice(_MEMORY_CHOICES) * _MIB
                ),
                created_at=float(len(pods)),
            )
            if kind == "zone-spread":
                pod.topology_spread = (TopologySpreadConstraint(wk.ZONE, 1, selector=selector),)
            elif kind == "host-spread":
                pod.topology_spread = (TopologySpreadConstraint(wk.HOSTNAME, 1, selector=selector),)
            elif kind == "zone-affinity":
                pod.pod_affinity = (PodAffinityTerm(wk.ZONE, selector),)
            elif kind == "host-anti":
                anti = LabelSelector.of({"kind": kind})
                pod.labels = {"kind": kind}
                pod.pod_anti_affinity = (PodAffinityTerm(wk.HOSTNAME, anti),)
            pods.append(pod)
    return pods


def lower_bound(
    pods: Sequence[Pod], instance_types: Sequence[InstanceType], offerings: Sequence[Offering]
) -> float:
    """max(total vCPU x cheapest $/vCPU, total GiB x cheapest $/GiB), allocatable-based."""
    by_name = {t.name: t for t in instance_types}
    per_cpu = per_gib = float("inf")
    for offer in offerings:
        itype = by_name.get(offer.instance_type)
        if not offer.available or itype is None or itype.gpu_count:
            continue
        alloc = itype.allocatable
        if alloc.cpu > 0:
            per_cpu = min(per_cpu, offer.price / (alloc.cpu / 1000))
        if alloc.memory > 0:
            per_gib = min(per_gib, offer.price / (alloc.memory / _GIB))
    cpu = sum(p.requests.cpu for p in pods) / 1000
    memory = sum(p.requests.memory for p in pods) / _GIB
    return max(cpu * per_cpu, memory * per_gib)


def pod_bound(
    pods: Sequence[Pod],
    instance_types: Sequence[InstanceType],
    offerings: Sequence[Offering],
    steps: int = 10,
) -> float:
    """A tighter valid lower bound that keeps every pod whole.

    For weights ``w`` on (cpu, memory, pod slots) summing to one, the pods on a node of
    type ``t`` use at most one unit of ``sum_d w_d * req_d / alloc_t,d``, so a pod costs at
    least ``min_t price_t * sum_d w_d * req_d / alloc_t,d``. Summing that per pod and
    taking the best ``w`` on a grid gives a bound no packing can beat. Unlike the simple
    bound it is not fooled by a type that is cheap per vCPU but has almost no memory.
    """
    by_name = {t.name: t for t in instance_types}
    cheapest: dict[str, float] = {}
    for offer in offerings:
        itype = by_name.get(offer.instance_type)
        if offer.available and itype is not None and not itype.gpu_count:
            cheapest[offer.instance_type] = min(
                cheapest.get(offer.instance_type, offer.price), offer.price
            )
    caps = [
        (
            by_name[n].allocatable.cpu,
            by_name[n].allocatable.memory,
            by_name[n].allocatable.pods,
            price,
        )
        for n, price in cheapest.items()
    ]
    shapes: dict[tuple[int, int], int] = {}
    for pod in pods:
        key = (pod.requests.cpu, pod.requests.memory)
        shapes[key] = shapes.get(key, 0) + 1
    best = 0.0
    for a in range(steps + 1):
        for b in range(steps + 1 - a):
            wa, wb, wc = a / steps, b / steps, (steps - a - b) / steps
            total = 0.0
            for (cpu, mem), count in shapes.items():
                per_pod = min(
                    (
                        price * (wa * cpu / ccpu + wb * mem / cmem + wc / cpods)
                        for ccpu, cmem, cpods, price in caps
                        if ccpu >= cpu and cmem >= mem and cpods >= 1
                    ),
                    default=0.0,
                )
                total += count * per_pod
            best = max(best, total)
    return best


def _peak_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (2**20 if sys.platform == "darwin" else 1024), 1)


def _run(
    name: str,
    pods: list[Pod],
    instance_types: list[InstanceType],
    offerings: list[Offering],
    template: NodePoolTemplate,
) -> dict[str, Any]:
    started = time.perf_counter()
    plan: Plan = schedule(pods, [], [template], instance_types, offerings)
    seconds = time.perf_counter() - started
    cost = plan.cost_per_hour
    bound = lower_bound(pods, instance_types, offerings)
    tight = pod_bound(pods, instance_types, offerings)
    return {
        "benchmark": name,
        "pods": len(pods),
        "scheduled": len(pods) - len(plan.unschedulable),
        "unschedulable": len(plan.unschedulable),
        "seconds": round(seconds, 4),
        "pods_per_second": round(len(pods) / seconds, 1) if seconds > 0 else None,
        "nodes": len(plan.new_claims),
        "cost_per_hour": round(cost, 4),
        "lower_bound_per_hour": round(bound, 4),
        "cost_vs_bound": round(cost / bound, 4) if bound > 0 else None,
        "pod_bound_per_hour": round(tight, 4),
        "cost_vs_pod_bound": round(cost / tight, 4) if tight > 0 else None,
        "peak_memory_mb": _peak_mb(),
    }


def run_scheduling_benchmark(pods: int, seed: int = 0) -> dict[str, Any]:
    """Karpenter's diverse benchmark mix on 400 synthetic instance types."""
    instance_types, offerings = synthetic_instance_types(400)
    template = NodePoolTemplate(
        name="default",
        remaining=Resources(cpu=10_000_000 * 1000, memory=2**62, gpu=2**62),
    )
    return _run("scheduling", _diverse_pods(pods, seed), instance_types, offerings, template)


def _catalog() -> tuple[list[InstanceType], list[Offering], str]:
    try:
        from spotwright.catalog import default_zones, load_catalog

        catalog = load_catalog()
    except Exception:  # the bundled catalog is optional here: fall back to synthetic
        types, offerings = synthetic_instance_types(400)
        return types, offerings, "synthetic"
    zones = default_zones(catalog.region)
    types = list(catalog.types)
    offerings = []
    for itype in types:
        for zone in zones:
            offerings.append(Offering(itype.name, zone, wk.ON_DEMAND, itype.od_price))
            spot = itype.spot_price
            if spot is not None:
                offerings.append(Offering(itype.name, zone, wk.SPOT, spot))
    return types, offerings, "catalog"


def run_identical_benchmark(pods: int = 10_000) -> dict[str, Any]:
    """One Deployment of identical pods (500m, 1Gi), on the bundled catalog if present."""
    types, offerings, source = _catalog()
    batch = [
        Pod(
            name=f"web-{i}",
            uid=f"{i:07d}",
            labels={"app": "web"},
            owner="web",
            requests=Resources(cpu=500, memory=_GIB),
            created_at=0.0,
        )
        for i in range(pods)
    ]
    result = _run("identical", batch, types, offerings, NodePoolTemplate(name="default"))
    result["catalog"] = source
    return result


def run_catalog_mix_benchmark(pods: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Mixed pod shapes without topology on the bundled catalog: the cost check."""
    types, offerings, source = _catalog()
    rng = random.Random(seed)
    batch = [
        Pod(
            name=f"mix-{i}",
            uid=f"{i:07d}",
            requests=Resources(
                cpu=rng.choice(_CPU_CHOICES), memory=rng.choice(_MEMORY_CHOICES) * _MIB
            ),
            created_at=float(i),
        )
        for i in range(pods)
    ]
    result = _run("catalog-mix", batch, types, offerings, NodePoolTemplate(name="default"))
    result["catalog"] = source
    return result
