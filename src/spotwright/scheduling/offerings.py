"""Which offerings a claim is launched with: capacity type first, then the cheapest types.

This is the launch-time half of the spot strategy. The capacity type is the most
preferred one (reserved, then spot, then on-demand) that the claim allows and that still
has an available offering; unavailable offerings (ICE'd, or a closed capacity type) are
simply absent, which is how fallback to on-demand happens. Spot offerings dearer than the
cheapest on-demand one are dropped (Karpenter's SpotOfferingFilter), and only the cheapest
``max_types`` types are passed on, as CreateFleet accepts a bounded override list. A
requirement with ``minValues`` (say three instance families) survives that cut: when
the cheapest types alone would offer too few values, the cheapest type of each missing
value takes the place of the dearest types kept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from spotwright.catalog._types import InstanceType
from spotwright.model import labels as wk
from spotwright.ports.cloud import Offering
from spotwright.scheduling.plan import ClaimPlan
from spotwright.scheduling.requirements import Requirements, canonical_key

__all__ = ["choose_offerings"]


def choose_offerings(
    claim: ClaimPlan,
    instance_types: Mapping[str, InstanceType],
    offerings: Sequence[Offering],
    *,
    max_types: int = 60,
) -> tuple[str, tuple[Offering, ...]] | None:
    """(capacity type, offerings of it for the ``max_types`` cheapest types) or None."""
    reqs = Requirements.from_terms(claim.requirements)
    floors = [(canonical_key(r.key), r.min_values) for r in claim.requirements if r.min_values]
    zone_req = reqs.get(wk.ZONE)
    ct_req = reqs.get(wk.CAPACITY_TYPE)
    wanted: set[str] = set()
    for name in claim.instance_types:
        itype = instance_types.get(name)
        if itype is None or not claim.requests.fits_in(itype.allocatable):
            continue
        wanted.add(name)
    by_capacity: dict[str, list[Offering]] = {}
    for offer in offerings:
        if not offer.available or offer.instance_type not in wanted:
            continue
        if zone_req is not None and not zone_req.allows(offer.zone):
            continue
        if ct_req is not None and not ct_req.allows(offer.capacity_type):
            continue
        by_capacity.setdefault(offer.capacity_type, []).append(offer)
    on_demand = by_capacity.get(wk.ON_DEMAND, [])
    ceiling = min((o.price for o in on_demand), default=None)
    for capacity_type in wk.CAPACITY_TYPES:
        candidates = by_capacity.get(capacity_type, [])
        if capacity_type == wk.SPOT and ceiling is not None:
            candidates = [o for o in candidates if o.price <= ceiling]
        if not candidates:
            continue
        cheapest: dict[str, float] = {}
        for offer in candidates:
            if offer.price < cheapest.get(offer.instance_type, float("inf")):
                cheapest[offer.instance_type] = offer.price
        ordered = sorted(cheapest, key=lambda n: (cheapest[n], n))
        kept = _keep(ordered, max(1, max_types), floors, instance_types)
        chosen = sorted(
            (o for o in candidates if o.instance_type in kept),
            key=lambda o: (o.price, o.instance_type, o.zone),
        )
        return capacity_type, tuple(chosen)
    return None


def _keep(
    ordered: Sequence[str],
    limit: int,
    floors: Sequence[tuple[str, int]],
    instance_types: Mapping[str, InstanceType],
) -> set[str]:
    """The ``limit`` cheapest of ``ordered``, swapped where ``minValues`` needs it."""
    kept = list(ordered[:limit])
    if not floors or len(kept) == len(ordered):
        return set(kept)
    needed: list[str] = []
    for key, floor in floors:
        values = {instance_types[n].labels.get(key) for n in kept + needed} - {None}
        for name in ordered[limit:]:
            if len(values) >= floor:
                break
            value = instance_types[name].labels.get(key)
            if value is not None and value not in values:
                values.add(value)
                needed.append(name)
    if not needed:
        return set(kept)
    # Make room by dropping the dearest kept types whose value is not the last of its kind.
    drop = len(kept) + len(needed) - limit
    for name in reversed(list(kept)):
        if drop <= 0:
            break
        if all(_still_covered(name, key, kept, instance_types) for key, _ in floors):
            kept.remove(name)
            drop -= 1
    return set(kept) | set(needed)


def _still_covered(
    name: str, key: str, kept: Sequence[str], instance_types: Mapping[str, InstanceType]
) -> bool:
    value = instance_types[name].labels.get(key)
    return value is None or any(
        other != name and instance_types[other].labels.get(key) == value for other in kept
    )
