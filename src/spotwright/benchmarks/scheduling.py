"""Scheduling benchmarks: Karpenter's diverse mix, one big Deployment, a real catalog.

``run_scheduling_benchmark`` rebuilds the workload of Karpenter's own benchmark
(``scheduling_benchmark_test.go`` in ``sigs.k8s.io/karpenter``): 400 synthetic instance
types (type ``i`` has ``i+1`` vCPU, ``2(i+1)`` GiB and ``10(i+1)`` pods; spot in two zones
and on-demand in three, one price per type) and five pod kinds in equal shares, built the
way that file builds them: generic pods labelled ``my-label``; zonal and hostname
topology spread (maxSkew 1, DoNotSchedule) whose selector is drawn independently of the
pod's own label, so spread pods count the generic pods too; zonal pod affinity to the
pod's own ``my-affininity`` label (sic); hostname anti-affinity among all ``app: nginx``
pods. CPU is drawn from {100,250,500,1000,1500}m and memory from {100,...,4096}Mi. The
draws are seeded but not Go's, so pods differ from Karpenter's one by one, not in
distribution. Karpenter reports about 1,000 to 1,350 pods/s on it (PR core#2486);
``spotwright bench scheduling --compare-karpenter`` runs it side by side.

Cost is compared with a lower bound that no packing can beat: the larger of the simple
bound (total vCPU and GiB at the cheapest price per vCPU and per GiB) and the
configuration-LP bound of ``benchmarks.bounds``, which counts whole pods on whole nodes
and is the tight one on real catalogs. Speed is reported per wall-clock second and per
CPU second of this process (the fair figure on a shared machine).
"""

from __future__ import annotations

import random
import resource
import sys
import time
from collections.abc import Sequence
from typing import Any

from spotwright.benchmarks.bounds import Shape, configuration_bound
from spotwright.catalog._types import InstanceType
from spotwright.model import labels as wk
from spotwright.model.objects import (
    LabelSelector,
    NodeSelectorRequirement,
    Pod,
    PodAffinityTerm,
    TopologySpreadConstraint,
)
from spotwright.model.resources import Resources
from spotwright.ports.cloud import Offering
from spotwright.scheduling import NodePoolTemplate, Plan, pod_requests, schedule
from spotwright.scheduling.candidates import CatalogView, Vec, vec
from spotwright.scheduling.requirements import Requirements, canonical_key
from spotwright.scheduling.topology import selector_matches

__all__ = [
    "GETTING_STARTED",
    "lower_bound",
    "packing_bound",
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
    """Karpenter's ``makeDiversePods``: a fifth of each kind, the rest generic."""
    rng = random.Random(seed)
    share = count // 5
    pods: list[Pod] = []

    def value() -> str:
        return rng.choice("abcdefg")

    def add(kind: str, labels: dict[str, str], **terms: Any) -> None:
        index = len(pods)
        requests = Resources(
            cpu=rng.choice(_CPU_CHOICES), memory=rng.choice(_MEMORY_CHOICES) * _MIB
        )
        pods.append(
            Pod(
                name=f"{kind}-{index}",
                uid=f"{index:07d}",
                labels=labels,
                requests=requests,
                created_at=0.0,
                **terms,
            )
        )

    for _ in range(share):
        add("generic", {"my-label": value()})
    for key, kind in ((wk.ZONE, "zone-spread"), (wk.HOSTNAME, "host-spread")):
        for _ in range(share):
            labels = {"my-label": value()}
            selector = LabelSelector.of({"my-label": value()})
            spread = TopologySpreadConstraint(key, 1, selector=selector)
            add(kind, labels, topology_spread=(spread,))
    for _ in range(share):
        labels = {"my-affininity": value()}
        add(
            "zone-affinity",
            labels,
            pod_affinity=(PodAffinityTerm(wk.ZONE, LabelSelector.of(labels)),),
        )
    nginx = {"app": "nginx"}
    for _ in range(share):
        term = PodAffinityTerm(wk.HOSTNAME, LabelSelector.of(nginx))
        add("host-anti", dict(nginx), pod_anti_affinity=(term,))
    for _ in range(count - 5 * share):
        add("generic", {"my-label": value()})
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


def packing_bound(
    pods: Sequence[Pod],
    instance_types: Sequence[InstanceType],
    offerings: Sequence[Offering],
    template: NodePoolTemplate,
    daemon_overhead: Resources | None = None,
) -> float:
    """The configuration-LP lower bound (``benchmarks.bounds``) for ``pods`` on the
    instance types ``template`` allows, each at its cheapest available offering."""
    reqs = Requirements.from_terms(template.requirements).intersect(
        Requirements.from_labels(template.labels)
    )
    overhead = Resources() if daemon_overhead is None else daemon_overhead
    cands = CatalogView(instance_types, offerings, overhead).candidates(reqs)
    types = [(price, slot.cap) for slot, price in zip(cands.types, cands.prices, strict=True)]
    counts: dict[tuple[Vec, str], int] = {}
    for pod in pods:
        key = (vec(pod_requests(pod)), _solo_key(pod))
        counts[key] = counts.get(key, 0) + 1
    shapes = [Shape(req, n, solo) for (req, solo), n in counts.items()]
    return configuration_bound(shapes, types).value


def _solo_key(pod: Pod) -> str:
    """Pods with the same key may not share a node (anti-affinity among themselves)."""
    for term in pod.pod_anti_affinity:
        if canonical_key(term.topology_key) != wk.HOSTNAME:
            continue
        if not selector_matches(term.selector, pod.labels):
            continue
        if term.namespaces and pod.namespace not in term.namespaces:
            continue
        return repr((pod.namespace, term))
    return ""


def _peak_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (2**20 if sys.platform == "darwin" else 1024), 1)


def _run(
    name: str,
    pods: list[Pod],
    instance_types: list[InstanceType],
    offerings: list[Offering],
    template: NodePoolTemplate,
    *,
    packing: bool = True,
) -> dict[str, Any]:
    wall, cpu = time.perf_counter(), time.process_time()
    plan: Plan = schedule(pods, [], [template], instance_types, offerings)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    cost = plan.cost_per_hour
    placed = [p for c in plan.new_claims for p in c.pods]
    simple = lower_bound(placed, instance_types, offerings)
    tight = packing_bound(placed, instance_types, offerings, template) if packing else None
    bound = max(simple, tight or 0.0)
    return {
        "benchmark": name,
        "pods": len(pods),
        "scheduled": len(pods) - len(plan.unschedulable),
        "unschedulable": len(plan.unschedulable),
        "seconds": round(wall, 4),
        "pods_per_second": round(len(pods) / wall, 1) if wall > 0 else None,
        "cpu_seconds": round(cpu, 4),
        "pods_per_cpu_second": round(len(pods) / cpu, 1) if cpu > 0 else None,
        "nodes": len(plan.new_claims),
        "cost_per_hour": round(cost, 4),
        "lower_bound_per_hour": round(bound, 4),
        "cost_vs_bound": round(cost / bound, 4) if bound > 0 else None,
        "simple_bound_per_hour": round(simple, 4),
        "packing_bound_per_hour": None if tight is None else round(tight, 4),
        "peak_memory_mb": _peak_mb(),
    }


def run_scheduling_benchmark(pods: int, seed: int = 0) -> dict[str, Any]:
    """Karpenter's diverse benchmark mix on 400 synthetic instance types."""
    instance_types, offerings = synthetic_instance_types(400)
    template = NodePoolTemplate(
        name="default",
        remaining=Resources(10_000_000 * 1000, 2**62, 2**62, 2**62, 2**62),
    )
    # Every synthetic type has the same price per vCPU and per GiB and the same shape, so
    # the simple bound is already the fractional optimum; the configuration LP would
    # add only the integrality of nodes holding dozens of pods, at a cost of seconds.
    pods_ = _diverse_pods(pods, seed)
    return _run("scheduling", pods_, instance_types, offerings, template, packing=False)


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


#: The NodePool of Karpenter's getting-started guide: c, m or r types newer than gen 2.
GETTING_STARTED = (
    NodeSelectorRequirement(wk.INSTANCE_CATEGORY, "In", ("c", "m", "r")),
    NodeSelectorRequirement(wk.INSTANCE_GENERATION, "Gt", ("2",)),
)


def run_catalog_mix_benchmark(
    pods: int = 2000,
    seed: int = 0,
    requirements: tuple[NodeSelectorRequirement, ...] = (),
    name: str = "catalog-mix",
) -> dict[str, Any]:
    """Mixed pod shapes without topology on the bundled catalog: the cost check.

    With no ``requirements`` every type may be used, burstable ``t3.micro`` included
    (it is the cheapest CPU there is); ``GETTING_STARTED`` is the usual restriction.
    """
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
    template = NodePoolTemplate(name="default", requirements=requirements)
    result = _run(name, batch, types, offerings, template)
    result["catalog"] = source
    return result
