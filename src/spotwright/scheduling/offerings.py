"""Which offerings a claim is launched with: capacity type first, then the cheapest types.

This is the launch-time half of the spot strategy. The capacity type is the most
preferred one (reserved, then spot, then on-demand) that the claim allows and that still
has an available offering; unavailable offerings (ICE'd, or a closed capacity type) are
simply absent, which is how fallback to on-demand happens. Spot offerings dearer than the
cheapest on-demand one are dropped (Karpenter's SpotOfferingFilter), and only the cheapest
``max_types`` types are passed on, as CreateFleet accepts a bounded override list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from spotwright.catalog._types import InstanceType
from spotwright.model import labels as wk
from spotwright.ports.cloud import Offering
from spotwright.scheduling.plan import ClaimPlan
from spotwright.scheduling.requirements import Requirements

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
        kept = set(sorted(cheapest, key=lambda n: (cheapest[n], n))[: max(1, max_types)])
        chosen = sorted(
            (o for o in candidates if o.instance_type in kept),
            key=lambda o: (o.price, o.instance_type, o.zone),
        )
        return capacity_type, tuple(chosen)
    return None
