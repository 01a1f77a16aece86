"""NodePool ``minValues``: no claim is made less flexible than its pool demands.

A requirement such as ``instance-family In [c5, m5, r5], minValues: 2`` says every node
of the pool must be launchable as at least two families, so one family running short of
spot capacity cannot strand it. A claim's candidate types shrink as pods are packed onto
it (big claims only fit big types), so a claim can end up below the floor even though
its pods, on smaller claims, would not. The packer already stops growing a claim before
it breaks its floor (``floors``); ``enforce_min_values`` checks every planned claim after
it and, for one that still breaks its floor (its first pods broke it alone), packs its
pods again onto claims that keep it, adding pods to a claim only while the floor holds.
Pods that break the floor even alone stay pending with the reason, as with Karpenter's
``Strict`` policy.

Repacking is only done where it cannot break another rule: not for pools with limits
(the extra claims would have to be counted against them) and not for pods with topology
spread or pod (anti-)affinity (which depend on where their peers went).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from spotwright.catalog._types import InstanceType
from spotwright.model.objects import NodeSelectorRequirement, Pod
from spotwright.model.resources import Resources
from spotwright.ports.cloud import Offering
from spotwright.scheduling.packing import schedule
from spotwright.scheduling.plan import ClaimPlan, NodePoolTemplate, Plan
from spotwright.scheduling.requirements import min_values_shortfall

__all__ = ["enforce_min_values"]

_NO_OVERHEAD = Resources()


def enforce_min_values(
    plan: Plan,
    templates: Sequence[NodePoolTemplate],
    instance_types: Sequence[InstanceType],
    offerings: Sequence[Offering],
    *,
    daemon_overhead: Resources | Mapping[str, Resources] = _NO_OVERHEAD,
) -> Plan:
    """``plan`` with every new claim meeting its NodePool's ``minValues`` (see module doc)."""
    floors = {
        t.name: terms
        for t in templates
        if (terms := tuple(r for r in t.requirements if r.min_values))
    }
    if not floors or not plan.new_claims:
        return plan
    check = _Checker(floors, {t.name: t for t in instance_types})
    pools = {t.name: t for t in templates}
    kept: list[ClaimPlan] = []
    for claim in plan.new_claims:
        reason = check(claim)
        if reason is None:
            kept.append(claim)
            continue
        pool = pools[claim.nodepool]
        if len(claim.pods) == 1 or not _repackable(pool, claim.pods):
            plan.unschedulable.update((p.key, reason) for p in claim.pods)
            continue

        def again(pods: list[Pod], pool: NodePoolTemplate = pool) -> Plan:
            return schedule(
                pods, [], [pool], instance_types, offerings, daemon_overhead=daemon_overhead
            )

        repacked, left = _repack(claim.pods, again, check)
        kept.extend(repacked)
        plan.unschedulable.update((p.key, why or reason) for p, why in left)
    plan.new_claims = kept
    return plan


def _repackable(pool: NodePoolTemplate, pods: Sequence[Pod]) -> bool:
    if pool.remaining is not None or pool.nodes_remaining is not None:
        return False
    return not any(p.topology_spread or p.pod_affinity or p.pod_anti_affinity for p in pods)


def _repack(
    pods: Sequence[Pod], again: Callable[[list[Pod]], Plan], check: _Checker
) -> tuple[list[ClaimPlan], list[tuple[Pod, str | None]]]:
    """Claims for ``pods`` that each keep the floor, filled greedily in the given order
    (the packer's, largest first); and the pods that break it even alone, with why."""
    claims: list[ClaimPlan] = []
    left: list[tuple[Pod, str | None]] = []
    group: list[Pod] = []
    current: ClaimPlan | None = None
    for pod in pods:
        if current is not None:
            grown = _one_claim(again([*group, pod]), check)
            if isinstance(grown, ClaimPlan):
                group.append(pod)
                current = grown
                continue
            claims.append(current)
        alone = _one_claim(again([pod]), check)
        if isinstance(alone, ClaimPlan):
            group, current = [pod], alone
        else:
            group, current = [], None
            left.append((pod, alone))
    if current is not None:
        claims.append(current)
    return claims, left


def _one_claim(plan: Plan, check: _Checker) -> ClaimPlan | str | None:
    """The single claim ``plan`` makes if it keeps the floor; else why not (or None)."""
    if plan.unschedulable:
        return next(iter(plan.unschedulable.values()))
    if len(plan.new_claims) != 1:
        return None
    claim = plan.new_claims[0]
    reason = check(claim)
    return claim if reason is None else reason


class _Checker:
    def __init__(
        self,
        floors: Mapping[str, tuple[NodeSelectorRequirement, ...]],
        types: Mapping[str, InstanceType],
    ) -> None:
        self.floors = floors
        self.types = types

    def __call__(self, claim: ClaimPlan) -> str | None:
        terms = self.floors.get(claim.nodepool)
        if not terms:
            return None
        labels = [self.types[n].labels for n in claim.instance_types if n in self.types]
        short = min_values_shortfall(terms, labels)
        return None if short is None else f'incompatible with NodePool "{claim.nodepool}": {short}'
