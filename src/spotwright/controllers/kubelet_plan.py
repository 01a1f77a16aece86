"""Scheduling when NodePools' classes give their kubelets different settings.

The scheduler takes one catalog for all NodePools of a round, but a class's ``maxPods``,
``podsPerCore``, reservations and eviction thresholds change what each instance type
offers pods on that class's nodes (``model.kubelet.allocatable``). So the NodePools are
grouped by their kubelet block and each group is scheduled with the catalog as its nodes
see it. With one group, the common case (no class sets a kubelet block, or they agree),
this is one ``schedule`` call exactly as before.

With several groups, the group holding the heaviest NodePool goes first with every
pending pod and the existing capacity; each next group gets the pods still unplaced.
Existing nodes are offered only to the first group (a pod the first round could not put
on them will not fit there later either); later groups still see their pods for topology
spread and affinity, with no room left. A pod no group can place keeps the first group's
reason, the one about the NodePools it would have preferred.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from spotwright.catalog._types import InstanceType
from spotwright.model.kubelet import KubeletConfiguration, allocatable, for_kubelet
from spotwright.model.objects import NodeClaim, Pod
from spotwright.model.resources import Resources
from spotwright.ports.cloud import Offering
from spotwright.scheduling import ExistingCapacity, NodePoolTemplate, Plan, schedule
from spotwright.scheduling.min_values import enforce_min_values

__all__ = ["claim_allocatable", "plan_by_kubelet"]


def _key(kubelet: KubeletConfiguration | None) -> str:
    return "" if kubelet is None else kubelet.model_dump_json(exclude_defaults=True)


def _groups(
    templates: Sequence[NodePoolTemplate], kubelets: Mapping[str, KubeletConfiguration | None]
) -> list[tuple[KubeletConfiguration | None, list[NodePoolTemplate]]]:
    """NodePools sharing a kubelet block, heaviest group (by its heaviest pool) first."""
    groups: dict[str, tuple[KubeletConfiguration | None, list[NodePoolTemplate]]] = {}
    for template in templates:
        kubelet = kubelets.get(template.name)
        groups.setdefault(_key(kubelet), (kubelet, []))[1].append(template)
    return sorted(
        groups.values(),
        key=lambda g: (-max(t.weight for t in g[1]), min(t.name for t in g[1])),
    )


def _plan_group(
    pods: Sequence[Pod],
    existing: Sequence[ExistingCapacity],
    templates: Sequence[NodePoolTemplate],
    types: Sequence[InstanceType],
    offerings: Sequence[Offering],
    overhead: Mapping[str, Resources],
) -> Plan:
    plan = schedule(pods, existing, templates, types, offerings, daemon_overhead=overhead)
    return enforce_min_values(plan, templates, types, offerings, daemon_overhead=overhead)


def plan_by_kubelet(
    pods: Sequence[Pod],
    existing: Sequence[ExistingCapacity],
    templates: Sequence[NodePoolTemplate],
    catalog: Mapping[str, InstanceType],
    offerings: Sequence[Offering],
    overhead: Mapping[str, Resources],
    kubelets: Mapping[str, KubeletConfiguration | None],
) -> Plan:
    """Where ``pods`` go, each NodePool's claims sized by its class's kubelet block
    (``kubelets``: NodePool name -> block; a pool not named has none)."""
    groups = _groups(templates, kubelets)
    if len(groups) <= 1:
        kubelet = groups[0][0] if groups else None
        types = list(for_kubelet(catalog, kubelet).values())
        return _plan_group(pods, existing, templates, types, offerings, overhead)
    merged = Plan()
    left = list(pods)
    offered = list(existing)
    for kubelet, group in groups:
        types = list(for_kubelet(catalog, kubelet).values())
        plan = _plan_group(left, offered, group, types, offerings, overhead)
        merged.existing.update(plan.existing)
        merged.new_claims.extend(plan.new_claims)
        for key, reason in plan.unschedulable.items():
            merged.unschedulable.setdefault(key, reason)
        left = [p for p in left if p.key in plan.unschedulable]
        offered = [dataclasses.replace(e, free=Resources()) for e in offered]
        if not left:
            break
    placed = set(merged.existing) | {p.key for c in merged.new_claims for p in c.pods}
    merged.unschedulable = {k: r for k, r in merged.unschedulable.items() if k not in placed}
    return merged


def claim_allocatable(
    claim: NodeClaim, catalog: Mapping[str, InstanceType], kubelet: KubeletConfiguration | None
) -> Resources | None:
    """What a booting claim will offer pods, as the scheduler assumed when opening it: its
    instance type (before launch, its smallest candidate) as ``kubelet`` leaves it. The
    claim's own ``allocatable`` is the catalog's, so it is used only without a block."""
    itype = catalog.get(claim.instance_type) if claim.instance_type else None
    if kubelet is None or (claim.instance_type and itype is None):
        if claim.allocatable is not None:
            return claim.allocatable
        kubelet = None
    if itype is not None:
        return allocatable(itype, kubelet)
    sizes = [allocatable(catalog[n], kubelet) for n in claim.instance_types if n in catalog]
    return min(sizes, key=lambda r: (r.cpu, r.memory)) if sizes else None
