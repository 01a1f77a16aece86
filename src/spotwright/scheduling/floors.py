"""NodePool ``minValues`` while packing: a claim stops growing before it breaks its floor.

A claim's instance types are those that still hold its pods, so every pod added can only
shrink the set. With ``instance-family In [c5, m5, r5], minValues: 2``, a claim that grows
past the largest c5 keeps only m5 and r5 sizes, and past the largest of those, one family:
the floor is gone. Checking that as pods are added is cheap when each label value is
known by its undominated capacities (``Candidates.value_frontiers``): the claim keeps a
value exactly when one of them holds its requests.

``min_values.enforce_min_values`` still runs after the packer, for what this does not
see: a pod that breaks the floor on its own (it is let through here and reported there)
and the 60-type cut at launch.
"""

from __future__ import annotations

from spotwright.model.objects import NodeSelectorRequirement
from spotwright.scheduling.candidates import Candidates, Vec
from spotwright.scheduling.requirements import canonical_key
from spotwright.scheduling.state import plus

__all__ = ["Floors", "floors_of", "within_floors"]

#: (label key, least number of values) per ``minValues`` requirement of a pool.
Floors = tuple[tuple[str, int], ...]


def floors_of(requirements: tuple[NodeSelectorRequirement, ...]) -> Floors:
    return tuple((canonical_key(r.key), r.min_values) for r in requirements if r.min_values)


def floors_hold(floors: Floors, cands: Candidates, total: Vec) -> bool:
    """Whether a claim of ``total`` could still launch as enough values of every key.

    As in ``min_values_shortfall``, a key that no fitting type carries is not counted.
    """
    t0, t1, t2, t3, t4 = total
    for key, least in floors:
        found = 0
        for caps in cands.value_frontiers(key):
            for cap in caps:
                if cap[0] >= t0 and cap[1] >= t1 and cap[3] >= t3 and cap[2] >= t2 and cap[4] >= t4:
                    found += 1
                    break
            if found >= least:
                break
        if 0 < found < least:
            return False
    return True


def within_floors(floors: Floors, cands: Candidates, total: Vec, req: Vec, k: int) -> int:
    """The most pods of ``req`` (at most ``k``) a claim at ``total`` takes and keeps its floor.

    An empty claim takes its pods even when one alone breaks the floor, so the check after
    packing can say which pods and why instead of the packer opening a claim per pod.
    """
    if floors_hold(floors, cands, plus(total, req, k)):
        return k
    if not floors_hold(floors, cands, plus(total, req, 1)):
        return k if total[3] == 0 else 0
    low, high = 1, k  # floors hold at low, not at high
    while high - low > 1:
        mid = (low + high) // 2
        if floors_hold(floors, cands, plus(total, req, mid)):
            low = mid
        else:
            high = mid
    return low
