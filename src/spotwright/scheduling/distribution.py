"""How a mixed node group divides its instances between on-demand and spot, and where.

An Auto Scaling group with a mixed instances policy (eksctl's ``instancesDistribution``)
keeps a base of on-demand instances and splits everything above it by a percentage,
rounding in favour of on-demand. Its spot part goes to pools picked by an allocation
strategy, spread over zones; on scale-in it removes instances so that the split, the zone
balance and the pool spread are kept. The node group controller asks these functions what
to do and only then writes node claims, so every rule here can be tested without a cluster
or a clock.

Capacity is not something EC2 shows, so the strategies that optimise for it read the
catalog's Spot Advisor interruption band instead (0 is the safest, unknown counts as the
worst): a pool that is reclaimed less often is taken to be a deeper one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from spotwright.model.nodegroup import SpotAllocationStrategy

__all__ = [
    "PRICE_CAPACITY_TOLERANCE",
    "Member",
    "PoolOffer",
    "ScalePlan",
    "Split",
    "SpotAllocationStrategy",
    "choose_on_demand_pool",
    "choose_removals",
    "choose_spot_pool",
    "on_demand_count",
    "plan_scale",
    "split",
]

ON_DEMAND = "on-demand"
SPOT = "spot"

#: price-capacity-optimized, as modelled here: pools priced within this fraction of the
#: cheapest eligible one are the shortlist, and the safest of those wins.
PRICE_CAPACITY_TOLERANCE = 0.15
#: The band assumed for a type Spot Advisor does not rate: never safer than a rated one.
UNKNOWN_BAND = 4


@dataclass(frozen=True, slots=True)
class Split:
    """How many instances of each capacity type a group of ``on_demand + spot`` should run."""

    on_demand: int
    spot: int

    @property
    def total(self) -> int:
        return self.on_demand + self.spot

    def of(self, capacity_type: str) -> int:
        return self.on_demand if capacity_type == ON_DEMAND else self.spot


def on_demand_count(desired: int, base: int, percentage: int) -> int:
    """min(D, base) + ceil(pct/100 x max(0, D - base)), in integers so nothing rounds wrong."""
    if desired < 0 or base < 0 or not 0 <= percentage <= 100:
        raise ValueError(f"bad distribution: desired={desired} base={base} pct={percentage}")
    above = max(0, desired - base)
    return min(desired, base) + (percentage * above + 99) // 100


def split(desired: int, base: int, percentage: int) -> Split:
    """The on-demand/spot split of ``desired`` instances; any rounding goes to on-demand."""
    on_demand = on_demand_count(desired, base, percentage)
    return Split(on_demand=on_demand, spot=desired - on_demand)


# ---------------------------------------------------------------------------------------
# Scaling: what to add, what to remove


@dataclass(frozen=True, slots=True)
class Member:
    """One instance of the group as the planner needs it: its capacity type and pool.

    ``ready`` is False while it is still launching or booting, which makes it the cheapest
    one to give up on scale-in: no pod runs there yet.
    """

    name: str
    capacity_type: str
    instance_type: str
    zone: str
    ready: bool = True
    created_at: float = 0.0


@dataclass(frozen=True, slots=True)
class ScalePlan:
    """Instances to add by capacity type, and the members to remove (by name)."""

    add_on_demand: int
    add_spot: int
    remove: tuple[str, ...]

    @property
    def empty(self) -> bool:
        return not (self.add_on_demand or self.add_spot or self.remove)


def plan_scale(members: Sequence[Member], target: Split) -> ScalePlan:
    """Bring ``members`` to ``target``: each capacity type is grown or shrunk on its own.

    A type over its target loses members chosen by ``choose_removals``; a type under it
    gets new ones. Both can happen at once (after a change of percentage), in which case
    the group briefly runs what it has while the newcomers boot.
    """
    on_demand = [m for m in members if m.capacity_type == ON_DEMAND]
    spot = [m for m in members if m.capacity_type != ON_DEMAND]
    remove = choose_removals(on_demand, len(on_demand) - target.on_demand)
    remove += choose_removals(spot, len(spot) - target.spot)
    return ScalePlan(
        add_on_demand=max(0, target.on_demand - len(on_demand)),
        add_spot=max(0, target.spot - len(spot)),
        remove=tuple(remove),
    )


def choose_removals(members: Sequence[Member], count: int) -> list[str]:
    """Which ``count`` members of one capacity type go first on scale-in.

    In the spirit of Auto Scaling's default termination policy: members still launching
    go first (nothing runs on them yet), then members of the zone with the most members
    (to keep zones balanced), then of the pool with the most members (to keep the spread
    over pools), and the newest before older ones. Each pick updates the counts, so that
    removing several keeps rebalancing as it goes.
    """
    left = sorted(members, key=lambda m: m.name)
    chosen: list[str] = []
    for _ in range(max(0, min(count, len(left)))):
        zones = Counter(m.zone for m in left)
        pools = Counter((m.instance_type, m.zone) for m in left)
        victim = min(
            left,
            key=lambda m: (
                m.ready,
                -zones[m.zone],
                -pools[(m.instance_type, m.zone)],
                -m.created_at,
                m.name,
            ),
        )
        left.remove(victim)
        chosen.append(victim.name)
    return chosen


# ---------------------------------------------------------------------------------------
# Where a new instance goes


@dataclass(frozen=True, slots=True)
class PoolOffer:
    """One pool a group may launch into: an instance type in a zone, with its price.

    ``priority`` is the type's position in the group's ``instanceTypes`` (0 first);
    ``band`` its Spot Advisor interruption band, None when unrated.
    """

    instance_type: str
    zone: str
    price: float
    priority: int
    band: int | None = None

    @property
    def pool(self) -> tuple[str, str]:
        return (self.instance_type, self.zone)

    @property
    def risk(self) -> int:
        return UNKNOWN_BAND if self.band is None else self.band


def _balanced_zone(offers: Sequence[PoolOffer], placed: Mapping[tuple[str, str], int]) -> str:
    """The zone with the fewest members among the zones that have an offer (then by name)."""
    per_zone: Counter[str] = Counter()
    for (_, zone), count in placed.items():
        per_zone[zone] += count
    return min({o.zone for o in offers}, key=lambda z: (per_zone[z], z))


def choose_on_demand_pool(
    offers: Iterable[PoolOffer], placed: Mapping[tuple[str, str], int]
) -> PoolOffer | None:
    """Where the next on-demand instance goes: the emptiest zone, the first listed type.

    This is Auto Scaling's ``prioritized`` on-demand strategy, its default for groups that
    list their instance types: the order of ``instanceTypes`` is the order of preference.
    ``placed`` counts the group's on-demand members per (type, zone).
    """
    candidates = list(offers)
    if not candidates:
        return None
    zone = _balanced_zone(candidates, placed)
    return min(
        (o for o in candidates if o.zone == zone),
        key=lambda o: (o.priority, o.price, o.instance_type),
    )


def choose_spot_pool(
    offers: Iterable[PoolOffer],
    placed: Mapping[tuple[str, str], int],
    strategy: SpotAllocationStrategy,
    *,
    spot_instance_pools: int = 2,
) -> PoolOffer | None:
    """Where the next spot instance goes, by the group's allocation strategy.

    Zones are kept balanced first (the zone with the fewest of the group's spot members
    that still has an eligible pool). Within it:

    - ``lowest-price``: the ``spot_instance_pools`` cheapest pools, filled evenly;
    - ``capacity-optimized``: the safest pool, the cheaper one on a tie;
    - ``capacity-optimized-prioritized``: the safest pool, the earlier listed type on a tie;
    - ``price-capacity-optimized``: the safest among the pools priced within
      ``PRICE_CAPACITY_TOLERANCE`` of the cheapest, then the cheaper.

    ``offers`` must already be the eligible ones (available, under the max price);
    ``placed`` counts the group's spot members per (type, zone).
    """
    candidates = list(offers)
    if not candidates:
        return None
    zone = _balanced_zone(candidates, placed)
    local = [o for o in candidates if o.zone == zone]
    if strategy == "lowest-price":
        cheapest = sorted(local, key=lambda o: (o.price, o.priority, o.instance_type))
        shortlist = cheapest[: max(1, spot_instance_pools)]
        return min(
            shortlist,
            key=lambda o: (placed.get(o.pool, 0), o.price, o.priority, o.instance_type),
        )
    if strategy == "capacity-optimized":
        return min(local, key=lambda o: (o.risk, o.price, o.priority, o.instance_type))
    if strategy == "capacity-optimized-prioritized":
        return min(local, key=lambda o: (o.risk, o.priority, o.price, o.instance_type))
    floor = min(o.price for o in local)
    ceiling = floor * (1 + PRICE_CAPACITY_TOLERANCE) + 1e-12
    shortlist = [o for o in local if o.price <= ceiling]
    return min(shortlist, key=lambda o: (o.risk, o.price, o.priority, o.instance_type))
