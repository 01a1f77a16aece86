"""The scheduling queue: pods grouped by identical constraints, with their relaxations.

Ten thousand replicas of one Deployment ask the same question ten thousand times, so
pods with the same requests and constraints (and, when any topology term is in play, the
same labels) form one ``Group`` that is placed in bulk. Groups are ordered as Karpenter
orders pods (cpu desc, memory desc, creation, uid), each group taking the place of its
first member.

A group's ``variants`` are its constraints from strictest to loosest, following
Karpenter's relaxation order: each OR-ed required node affinity term in turn; then
without preferred pod affinity, preferred pod anti-affinity, preferred node affinity
(heaviest term first), ScheduleAnyway spread, one at a time; finally tolerating
PreferNoSchedule taints.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from spotwright.model.objects import (
    LabelSelector,
    Pod,
    PodAffinityTerm,
    TopologySpreadConstraint,
)
from spotwright.scheduling.candidates import Vec, vec
from spotwright.scheduling.fit import pod_requests, pod_requirements
from spotwright.scheduling.requirements import Requirements

__all__ = ["Group", "Variant", "build_groups", "has_topology"]

_ids = itertools.count()

Spread = tuple[str, LabelSelector, int, int | None]


@dataclass(eq=False, slots=True)
class Variant:
    """One set of constraints to try: hard ones plus the preferences not yet relaxed."""

    reqs: Requirements
    spreads: tuple[Spread, ...] = ()
    affinity: tuple[PodAffinityTerm, ...] = ()
    anti: tuple[PodAffinityTerm, ...] = ()
    tolerate_prefer_no_schedule: bool = False
    id: int = field(default_factory=lambda: next(_ids))

    @property
    def has_terms(self) -> bool:
        return bool(self.spreads or self.affinity or self.anti)

    def signature(self) -> Hashable:
        return (self.reqs, self.spreads, self.affinity, self.anti, self.tolerate_prefer_no_schedule)


@dataclass(eq=False, slots=True)
class Group:
    pods: list[Pod]
    req: Vec
    variants: list[Variant]
    klass: Hashable


def has_topology(pod: Pod) -> bool:
    return bool(
        pod.topology_spread
        or pod.pod_affinity
        or pod.pod_anti_affinity
        or pod.preferred_pod_affinity
        or pod.preferred_pod_anti_affinity
    )


def _group_key(pod: Pod, with_labels: bool) -> Hashable:
    return (
        pod.requests,
        pod.overhead,
        tuple(sorted(pod.node_selector.items())),
        pod.required_affinity,
        pod.tolerations,
        pod.topology_spread,
        pod.pod_affinity,
        pod.pod_anti_affinity,
        pod.preferred_affinity,
        pod.preferred_pod_affinity,
        pod.preferred_pod_anti_affinity,
        (pod.namespace, tuple(sorted(pod.labels.items()))) if with_labels else None,
    )


def _spread(c: TopologySpreadConstraint) -> Spread:
    return (c.topology_key, c.selector, max(1, c.max_skew), c.min_domains)


def variants(pod: Pod) -> list[Variant]:
    terms = pod_requirements(pod)
    pref_aff = sorted(pod.preferred_pod_affinity, key=lambda w: w.weight, reverse=True)
    pref_anti = sorted(pod.preferred_pod_anti_affinity, key=lambda w: w.weight, reverse=True)
    pref_node = sorted(pod.preferred_affinity, key=lambda w: w.weight, reverse=True)
    hard = tuple(
        _spread(c) for c in pod.topology_spread if c.when_unsatisfiable != "ScheduleAnyway"
    )
    soft = [_spread(c) for c in pod.topology_spread if c.when_unsatisfiable == "ScheduleAnyway"]
    levels: list[tuple[int, int, int, int, bool]] = []
    n_aff, n_anti, n_node, n_soft = len(pref_aff), len(pref_anti), 0, len(soft)
    levels.append((n_aff, n_anti, n_node, n_soft, False))
    while n_aff:
        n_aff -= 1  # drop the lightest remaining preference first
        levels.append((n_aff, n_anti, n_node, n_soft, False))
    while n_anti:
        n_anti -= 1
        levels.append((n_aff, n_anti, n_node, n_soft, False))
    while n_node < len(pref_node):
        n_node += 1  # the heaviest preferred node term acts as a requirement, then the next
        levels.append((n_aff, n_anti, n_node, n_soft, False))
    while n_soft:
        n_soft -= 1
        levels.append((n_aff, n_anti, n_node, n_soft, False))
    levels.append((n_aff, n_anti, n_node, n_soft, True))
    out: list[Variant] = []
    seen: set[Hashable] = set()
    for a, b, node_skip, s, pns in levels:
        preferred = (
            Requirements.from_terms(pref_node[node_skip].requirements)
            if node_skip < len(pref_node)
            else None
        )
        for term in terms:
            reqs = term.intersect(preferred) if preferred is not None else term
            variant = Variant(
                reqs=reqs,
                spreads=hard + tuple(soft[:s]),
                affinity=(*pod.pod_affinity, *(w.term for w in pref_aff[:a])),
                anti=(*pod.pod_anti_affinity, *(w.term for w in pref_anti[:b])),
                tolerate_prefer_no_schedule=pns,
            )
            sig = variant.signature()
            if sig not in seen:
                seen.add(sig)
                out.append(variant)
    return out


def build_groups(pods: Sequence[Pod], with_labels: bool) -> list[Group]:
    """Group identical pods and order the groups as Karpenter's queue orders pods."""
    buckets: dict[Hashable, list[Pod]] = {}
    for pod in pods:
        buckets.setdefault(_group_key(pod, with_labels), []).append(pod)
    groups: list[tuple[tuple[int, int, float, str], Group]] = []
    for members in buckets.values():
        members.sort(key=lambda p: (p.created_at, p.uid))
        first = members[0]
        need = pod_requests(first)
        vs = variants(first)
        klass = (vs[0].reqs, need.gpu > 0)
        order = (-first.requests.cpu, -first.requests.memory, first.created_at, first.uid)
        groups.append((order, Group(members, vec(need), vs, klass)))
    groups.sort(key=lambda item: item[0])
    return [g for _, g in groups]
