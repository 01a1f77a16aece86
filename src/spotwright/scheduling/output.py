"""Turning a filled claim into the ``ClaimPlan`` the provisioner writes as a NodeClaim.

Done once per claim at the end of a round, and cached for claims that ended identical
(the usual case for a big Deployment), because listing every fitting instance type and
the zones and capacity types they are offered in is the one step that is linear in the
catalog size.
"""

from __future__ import annotations

import math

from spotwright.model import labels as wk
from spotwright.model.objects import NodeSelectorRequirement
from spotwright.scheduling.requirements import KeyRequirement
from spotwright.scheduling.state import ClaimState

__all__ = ["MAX_INSTANCE_TYPES", "describe_claim"]

#: Instance types kept per claim, cheapest first (Karpenter core's MaxInstanceTypes).
MAX_INSTANCE_TYPES = 600


def describe_claim(
    claim: ClaimState, left: tuple[int, ...] | None
) -> tuple[tuple[str, ...], tuple[NodeSelectorRequirement, ...], dict[str, str], float]:
    """Instance types, narrowed requirements, labels and price of a finished claim."""
    cands, (t0, t1, t2, t3, t4) = claim.cands, claim.total
    kept: list[int] = []
    types = cands.types
    for i in range(claim.idx, len(types)):
        cap = types[i].cap
        if cap[0] < t0 or cap[1] < t1 or cap[3] < t3 or cap[2] < t2 or cap[4] < t4:
            continue
        if left is not None:
            alloc = types[i].alloc
            if any(alloc[d] > left[d] for d in range(5)):
                continue
        kept.append(i)
        if len(kept) >= MAX_INSTANCE_TYPES:
            break
    reqs = claim.reqs
    all_zones = cands.possible_values(wk.ZONE)
    all_capacity = cands.possible_values(wk.CAPACITY_TYPE)
    zones: set[str] = set()
    capacity_types: set[str] = set()
    for i in kept:
        z, c = cands.zones_and_capacity(i)
        zones |= z
        capacity_types |= c
        if len(zones) == len(all_zones) and len(capacity_types) == len(all_capacity):
            break
    names = tuple(types[i].name for i in kept)
    narrowed = dict(reqs)
    narrowed[wk.CAPACITY_TYPE] = KeyRequirement(frozenset(capacity_types), False, False)
    if wk.ZONE in reqs:
        narrowed[wk.ZONE] = KeyRequirement(frozenset(zones), False, False)
    narrowed.pop(wk.INSTANCE_TYPE, None)
    terms: list[NodeSelectorRequirement] = [NodeSelectorRequirement(wk.INSTANCE_TYPE, "In", names)]
    for key in sorted(narrowed):
        terms.extend(narrowed[key].to_terms(key))
    labels = dict(claim.pool.template.labels)
    for key, req in narrowed.items():
        if key == wk.NODEPOOL or key in labels:
            continue
        if not req.complement and len(req.values) == 1:
            labels[key] = next(iter(req.values))
    price = cands.prices[kept[0]] if kept else math.inf
    return names, tuple(terms), labels, price
