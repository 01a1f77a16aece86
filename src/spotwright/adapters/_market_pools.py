"""Pools, prices, hazards and the allocation rule of the simulated spot market.

Kept apart from ``sim_market`` so the numbers that make the simulation believable (price
spread between zones, Spot Advisor bands turned into hazards, how EC2 picks a pool among a
fleet's overrides) can be read and tuned in one place, without the asyncio plumbing.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from spotwright.catalog._types import InstanceType

__all__ = [
    "BAND_MONTHLY_PROBABILITY",
    "CO_INTERRUPTION_PROBABILITY",
    "MONTH_SECONDS",
    "ON_DEMAND",
    "PRICE_CAPACITY_TOLERANCE",
    "SPOT",
    "ZONE_PRICE_SPREAD",
    "Pool",
    "band_hazard",
    "build_pools",
    "choose_pool",
    "notice_spread",
    "offers_spot",
    "reclaim_probability",
]

SPOT = "spot"
ON_DEMAND = "on-demand"

#: Monthly interruption probability assumed for each Spot Advisor band. Bands 0..3 use the
#: midpoint of their published range (<5 %, 5-10 %, 10-15 %, 15-20 %); the open-ended ">20 %"
#: band has no midpoint, so 25 % stands for it. A type with a savings figure but no band is
#: treated as band 4: an unknown pool should not look safer than a known hot one.
BAND_MONTHLY_PROBABILITY: dict[int, float] = {0: 0.03, 1: 0.075, 2: 0.125, 3: 0.175, 4: 0.25}
#: Spot Advisor reads its bands as "fraction of instances reclaimed per month"; a month is
#: taken to be 30 days when turning that into a constant hazard.
MONTH_SECONDS = 30 * 24 * 3600.0
#: Chance that one running instance is hit when its pool is reclaimed. Interruptions come in
#: per-pool bursts (over 92 % of co-interruptions within 3 minutes, spot-data.md §4), so the
#: pool-level event rate is the per-instance hazard divided by this.
CO_INTERRUPTION_PROBABILITY = 0.5
#: Price-capacity-optimized, as modelled here: offerings priced within this fraction of the
#: cheapest available one form the shortlist, and the shortlist's safest band wins.
PRICE_CAPACITY_TOLERANCE = 0.15
#: Spot price of a pool relative to the region average implied by Spot Advisor's savings.
ZONE_PRICE_SPREAD = (0.85, 1.15)


@dataclass(slots=True)
class Pool:
    """One capacity pool: an instance type in a zone, bought as spot or on-demand.

    ``enabled`` is the scenario's switch (``set_capacity``); ``short_until`` is set by a
    reclaim, during which EC2 has no spare capacity to launch into the pool.
    """

    instance_type: InstanceType
    zone: str
    capacity_type: str
    price: float
    band: int
    enabled: bool = True
    short_until: float = -math.inf

    @property
    def key(self) -> tuple[str, str, str]:
        """Same key as ``Offering.key``: (capacity type, instance type, zone)."""
        return (self.capacity_type, self.instance_type.name, self.zone)

    def has_capacity(self, now: float) -> bool:
        return self.enabled and now >= self.short_until


def offers_spot(it: InstanceType) -> bool:
    """Spot is sold only where Spot Advisor lists a (positive) savings figure."""
    return it.spot_savings_pct is not None and it.spot_savings_pct > 0


def build_pools(
    types: Sequence[InstanceType], zones: Sequence[str], rng: random.Random
) -> dict[tuple[str, str, str], Pool]:
    """Every pool of the region, with its price.

    On-demand costs the list price in every zone. Each spot pool gets its own factor in
    ``ZONE_PRICE_SPREAD`` around the savings-implied price, so zones differ per type the way
    real per-AZ spot prices do. Factors are drawn in sorted (type, zone) order, so one seed
    always prices the same market whatever order the caller listed types or zones in.
    """
    pools: dict[tuple[str, str, str], Pool] = {}
    for it in sorted(types, key=lambda t: t.name):
        band = it.interruption_band if it.interruption_band is not None else 4
        for zone in sorted(zones):
            od = Pool(it, zone, ON_DEMAND, round(it.od_price, 6), band)
            pools[od.key] = od
            if not offers_spot(it):
                continue
            assert it.spot_savings_pct is not None
            base = it.od_price * (1 - it.spot_savings_pct / 100)
            factor = rng.uniform(*ZONE_PRICE_SPREAD)
            # Spot never costs more than on-demand: that is the default max price.
            price = round(min(base * factor, it.od_price), 6)
            spot = Pool(it, zone, SPOT, price, band)
            pools[spot.key] = spot
    return pools


def band_hazard(band: int) -> float:
    """Per-instance interruption rate (per second) for a Spot Advisor band.

    A monthly probability p is read as a constant hazard λ with 1 - exp(-λ·month) = p.
    """
    p = BAND_MONTHLY_PROBABILITY.get(band, BAND_MONTHLY_PROBABILITY[4])
    return -math.log(1 - p) / MONTH_SECONDS


@functools.cache
def reclaim_probability(band: int, seconds: float) -> float:
    """Chance that a pool of this band is reclaimed within ``seconds``.

    Reclaims happen at μ = λ/q per pool, so that with each running instance hit with
    probability q, every instance still sees the band's hazard λ.
    """
    rate = band_hazard(band) / CO_INTERRUPTION_PROBABILITY
    return -math.expm1(-rate * seconds)


def choose_pool(candidates: Sequence[tuple[int, Pool]], capacity_type: str) -> Pool:
    """Pick the pool a fleet request lands in, from (preference index, pool) pairs.

    On-demand is lowest-price. Spot is price-capacity-optimized: EC2 keeps the pools that
    are both cheap and deep. The market has no depth figure to show, so the Spot Advisor band
    stands in for depth: among offerings priced within ``PRICE_CAPACITY_TOLERANCE`` of the
    cheapest, the lowest band wins, then the lower price, then the caller's order.
    """
    if not candidates:
        raise ValueError("no candidate pools")
    if capacity_type != SPOT:
        return min(candidates, key=lambda c: (c[1].price, c[0]))[1]
    cheapest = min(pool.price for _, pool in candidates)
    ceiling = cheapest * (1 + PRICE_CAPACITY_TOLERANCE) + 1e-12
    shortlist = [c for c in candidates if c[1].price <= ceiling]
    return min(shortlist, key=lambda c: (c[1].band, c[1].price, c[0]))[1]


def notice_spread(rng: random.Random) -> float:
    """Delay of one instance's notice after its pool is reclaimed.

    95 % land within 3 minutes and the rest within 10, matching the measured ">92 % of
    co-interruptions within three minutes" rather than an exact, too-tidy 100 %.
    """
    if rng.random() < 0.95:
        return rng.uniform(0.0, 180.0)
    return rng.uniform(180.0, 600.0)
