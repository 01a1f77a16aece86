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

from spotwright.model import labels as wk
from spotwright.model.objects import (
    LabelSelector,
    Pod,
    PodAffinityTerm,
    TopologySpreadConstraint,
)
from spotwright.model.resources import Extended
from spotwright.scheduling.candidates import Vec, vec
from spotwright.scheduling.fit import pod_requests, pod_requirements
from spotwright.scheduling.requirements import Requirements, canonical_key
from spotwright.scheduling.topology import selector_matches

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
    order_key: tuple[object, ...] = ()
    #: Required hostname anti-affinity keeps these pods apart: one per node.
    solo: bool = False
    #: Extended resources each pod requests (device counts and the like), by name.
    ext: Extended = ()


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


def _one_per_node(pod: Pod) -> bool:
    """Does a required hostname anti-affinity term keep the pod's like off its node?"""
    for term in pod.pod_anti_affinity:
        if (
            canonical_key(term.topology_key) == wk.HOSTNAME
            and selector_matches(term.selector, pod.labels)
            and (not term.namespaces or pod.namespace in term.namespaces)
        ):
            return True
    return False


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
    total_cpu = sum(p.requests.cpu for p in pods) or 1
    total_mem = sum(p.requests.memory for p in pods) or 1
    groups: list[tuple[tuple[int, float, int, int, float, str], Group]] = []
    for members in buckets.values():
        members.sort(key=lambda p: (p.created_at, p.uid))
        first = members[0]
        need = pod_requests(first)
        vs = variants(first)
        klass = (vs[0].reqs, need.gpu > 0)
        share = max(first.requests.cpu / total_cpu, first.requests.memory / total_mem)
        order = (
            0 if _one_per_node(first) else 1,
            -share,
            -first.requests.cpu,
            -first.requests.memory,
            first.created_at,
            first.uid,
        )
        solo = _one_per_node(first)
        group = Group(members, vec(need), vs, klass, order, solo, need.extended)
        groups.append((order, group))
    groups.sort(key=lambda item: item[0])
    return _interleave([g for _, g in groups], total_cpu, total_mem)


def _interleave(groups: list[Group], total_cpu: int, total_mem: int) -> list[Group]:
    """Alternate CPU-heavy and memory-heavy groups, keeping each kind's order.

    Placed in plain size order, a run of memory-heavy pods lands on claims that then
    cannot use their CPU. Taking next whichever kind the pods placed so far are short
    of keeps the claims that grow at the same time balanced.
    """
    heads = ([], [])  # type: tuple[list[Group], list[Group]]
    first: list[Group] = []
    for g in groups:
        if g.solo:
            first.append(g)
        else:
            heads[0 if g.req[0] / total_cpu >= g.req[1] / total_mem else 1].append(g)
    out = first
    i = j = 0
    cpu = mem = 0.0
    cpus, mems = heads
    while i < len(cpus) or j < len(mems):
        take_cpu = j >= len(mems) or (i < len(cpus) and cpu <= mem)
        g = cpus[i] if take_cpu else mems[j]
        if take_cpu:
            i += 1
        else:
            j += 1
        out.append(g)
        cpu += len(g.pods) * g.req[0] / total_cpu
        mem += len(g.pods) * g.req[1] / total_mem
    return out
