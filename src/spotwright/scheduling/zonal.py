"""Pods whose only rules are zonal: choose the zone now, pack the pod with the free ones.

A zonal topology spread or zonal pod affinity decides one thing, the zone, and the
counts it reads change only with that choice. Placing such pods one by one onto claims
(as hostname rules require) ties the choice of node to the moment the pod comes up in
the queue, which is what leaves claims lopsided. So, in queue order, each such pod that
existing capacity cannot take gets its zone exactly as it would on a claim (the allowed
zone the spread finds least loaded, or the one the affinity already uses), the zone
counts are bumped at once, and the pod joins the packing pass (``fill.py``) as a pod
that requires that zone. Its hostname counters (other pods' hostname spread may select
it) are bumped where it finally lands, as for pods without rules, which the packing pass
places after every pod with hostname rules.

A pod the packing pass cannot place has its zone counts taken back and goes through the
ordinary path, relaxations included.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spotwright.model import labels as wk
from spotwright.model.objects import Pod
from spotwright.scheduling.fill import Entry
from spotwright.scheduling.queue import Variant
from spotwright.scheduling.requirements import KeyRequirement
from spotwright.scheduling.state import Profile, node_room
from spotwright.scheduling.topology import Counter, PodTopology

if TYPE_CHECKING:
    from spotwright.scheduling.packing import _Scheduler
    from spotwright.scheduling.queue import Group

__all__ = ["defer_zonal", "release", "zonal_key"]


def zonal_key(prof: Profile) -> str | None:
    """The one zone-like key all of a profile's rules and counts use, or None.

    Only spread and affinity rules qualify (anti-affinity closes domains other pods may
    be counted into later), no pod may repel this one, and every counter the pod bumps
    is either hostname or that key.
    """
    if not prof.constraints or prof.inverse:
        return None
    keys = {c.key for c in prof.constraints}
    if len(keys) != 1:
        return None
    key = next(iter(keys))
    if key == wk.HOSTNAME or any(c.kind == "anti" for c in prof.constraints):
        return None
    for counter in (*prof.records, *prof.owners):
        if counter.key not in (key, wk.HOSTNAME):
            return None
    return key


def _counted(prof: Profile, key: str) -> list[Counter]:
    return [c for c in (*prof.records, *prof.owners) if c.key == key]


def defer_zonal(
    sched: _Scheduler, group: Group, v: Variant, prof: Profile, key: str, pods: list[Pod]
) -> tuple[list[Entry], list[Pod]]:
    """Place on existing capacity or choose a zone for each pod; (entries, pods left over).

    Pods left over (no zone open to them, no NodePool offering it) take the ordinary path.
    """
    assert sched.topology is not None
    possible = _possible(sched, group, v, key)
    zonal = _counted(prof, key)
    later = Profile(
        [c for c in prof.records if c.key == wk.HOSTNAME],
        [c for c in prof.owners if c.key == wk.HOSTNAME],
        [],
        [],
    )
    by_zone: dict[str, list[Pod]] = {}
    left: list[Pod] = []
    req = group.req
    for pod in pods:
        pt = PodTopology(sched.topology, prof.constraints, prof.inverse, v.reqs)
        if pt.impossible:
            left.append(pod)
            continue
        if sched.nodes and _to_existing(sched, group, v, prof, pt, pod, req):
            continue
        options = pt.allowed.get(key, possible) & possible
        if not options:
            left.append(pod)
            continue
        order = pt.order.get(key)
        zone = min(options, key=order) if order else min(options)
        for counter in zonal:
            counter.add(zone, 1)
        by_zone.setdefault(zone, []).append(pod)
    entries = []
    for zone, members in sorted(by_zone.items()):
        pinned = v.reqs.with_key(key, KeyRequirement(frozenset((zone,)), False, False))
        variant = Variant(pinned, v.spreads, v.affinity, v.anti, v.tolerate_prefer_no_schedule)
        entries.append(Entry(group, variant, later, members, zonal=(zonal, zone)))
    return entries, left


def release(entry: Entry) -> None:
    """Take back the zone counts of ``entry``'s pods the packing pass did not place."""
    if entry.zonal is not None:
        counters, zone = entry.zonal
        for counter in counters:
            counter.add(zone, -entry.left)


def _possible(sched: _Scheduler, group: Group, v: Variant, key: str) -> frozenset[str]:
    """Values ``key`` can take on a claim of the first NodePool that takes the variant."""
    for pool in sched.pools:
        if not sched.taints_ok(id(pool), pool.template.taints, group, v):
            continue
        reqs = sched.meet(pool.reqs, v.reqs)
        if reqs is None:
            continue
        cands = pool.catalog.candidates(reqs)
        if cands.types:
            return cands.possible_values(key)
    return frozenset()


def _to_existing(
    sched: _Scheduler,
    group: Group,
    v: Variant,
    prof: Profile,
    pt: PodTopology,
    pod: Pod,
    req: tuple[int, int, int, int, int],
) -> bool:
    for j, node in enumerate(sched.nodes):
        if (
            sched.node_static_ok(j, node, group, v)
            and node_room(node, req, group.ext) >= 1
            and pt.node_ok(node.host, node.cap.labels)
        ):
            sched.to_node(node, [pod], group, 1)
            sched.record(prof, 1, node.host, node)
            sched.placed(group, 1)
            return True
    return False
