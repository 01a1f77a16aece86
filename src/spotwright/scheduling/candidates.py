"""Instance types as the packer sees them: capacity vectors, offerings and cached filters.

A scheduling round asks the same questions thousands of times ("which types satisfy
these requirements, cheapest first?", "how far may this claim grow?"), and the answers
depend only on a requirement set that recurs. So each type is turned once into a
``TypeSlot`` (a capacity tuple after daemon overhead, its available offerings, its label
requirements) and each distinct requirement set is resolved once into ``Candidates``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from spotwright.catalog._types import InstanceType
from spotwright.model import labels as wk
from spotwright.model.resources import Resources
from spotwright.ports.cloud import Offering
from spotwright.scheduling.requirements import KeyRequirement, Requirements

__all__ = ["Candidates", "CatalogView", "TypeSlot", "Vec", "vec"]

#: cpu (m), memory (bytes), gpu, pods, ephemeral (bytes): the packer's resource tuple.
Vec = tuple[int, int, int, int, int]

BIG_COUNT = 2**62

_DEFINED_BY_OFFERING = frozenset({wk.ZONE, wk.CAPACITY_TYPE, wk.REGION, wk.NODEPOOL})
_ABSENT = KeyRequirement(frozenset(), False, True)


def vec(res: Resources) -> Vec:
    return (res.cpu, res.memory, res.gpu, res.pods, res.ephemeral)


class TypeSlot:
    """One instance type: what pods may use of it and where it can be bought now."""

    __slots__ = ("alloc", "cap", "itype", "name", "offerings", "reqs")

    def __init__(self, itype: InstanceType, cap: Vec, offerings: list[Offering]) -> None:
        self.itype = itype
        self.name = itype.name
        self.cap = cap
        self.alloc = vec(itype.allocatable)
        self.offerings = tuple(sorted(offerings, key=lambda o: o.price))
        keys = dict(Requirements.from_labels(itype.labels))
        for key in wk.WELL_KNOWN - _DEFINED_BY_OFFERING:
            keys.setdefault(key, _ABSENT)
        keys[wk.ZONE] = KeyRequirement(frozenset(o.zone for o in offerings), False, False)
        keys[wk.CAPACITY_TYPE] = KeyRequirement(
            frozenset(o.capacity_type for o in offerings), False, False
        )
        self.reqs = Requirements(keys)

    def price_under(self, reqs: Requirements) -> float | None:
        """The cheapest available offering allowed by ``reqs`` (zone, capacity type)."""
        zone = reqs.get(wk.ZONE)
        capacity = reqs.get(wk.CAPACITY_TYPE)
        for offer in self.offerings:
            if (zone is None or zone.allows(offer.zone)) and (
                capacity is None or capacity.allows(offer.capacity_type)
            ):
                return offer.price
        return None

    def values_under(self, key: str, reqs: Requirements) -> set[str]:
        """Values ``key`` can take on a node of this type launched under ``reqs``."""
        zone = reqs.get(wk.ZONE)
        capacity = reqs.get(wk.CAPACITY_TYPE)
        out: set[str] = set()
        for offer in self.offerings:
            if (zone is None or zone.allows(offer.zone)) and (
                capacity is None or capacity.allows(offer.capacity_type)
            ):
                out.add(offer.zone if key == wk.ZONE else offer.capacity_type)
        return out


class Candidates:
    """The types compatible with one requirement set, cheapest first (immutable)."""

    __slots__ = (
        "_anchor",
        "_by_value",
        "_frontier",
        "_per_pod",
        "_rates",
        "_values",
        "_zc",
        "max_alloc",
        "prices",
        "reqs",
        "types",
    )

    def __init__(self, reqs: Requirements, pairs: list[tuple[float, TypeSlot]]) -> None:
        pairs.sort(key=lambda p: (p[0], p[1].name))
        self.reqs = reqs
        self.types = tuple(t for _, t in pairs)
        self.prices = tuple(p for p, _ in pairs)
        self._frontier: dict[float, tuple[Vec, ...]] = {}
        self._by_value: dict[str, tuple[tuple[Vec, ...], ...]] = {}
        self._anchor: dict[object, tuple[int, float]] = {}
        self._values: dict[str, frozenset[str]] = {}
        self._zc: dict[int, tuple[set[str], set[str]]] = {}
        self._per_pod: dict[Vec, tuple[float, tuple[tuple[float, Vec], ...]]] = {}
        self._rates: tuple[float, float] | None = None
        self.max_alloc = tuple(max((t.alloc[d] for t in self.types), default=0) for d in range(5))

    def zones_and_capacity(self, i: int) -> tuple[set[str], set[str]]:
        """Zones and capacity types type ``i`` is offered in under these requirements."""
        found = self._zc.get(i)
        if found is None:
            slot = self.types[i]
            found = (
                slot.values_under(wk.ZONE, self.reqs),
                slot.values_under(wk.CAPACITY_TYPE, self.reqs),
            )
            self._zc[i] = found
        return found

    def __len__(self) -> int:
        return len(self.types)

    def first_fit(self, need: Vec, start: int = 0, max_price: float = math.inf) -> int:
        """Index of the cheapest type from ``start`` that holds ``need``; -1 if none."""
        c0, c1, c2, c3, c4 = need
        prices = self.prices
        for i in range(start, len(self.types)):
            if prices[i] > max_price:
                return -1
            cap = self.types[i].cap
            if cap[0] >= c0 and cap[1] >= c1 and cap[3] >= c3 and cap[2] >= c2 and cap[4] >= c4:
                return i
        return -1

    def per_pod(self, need: Vec) -> tuple[float, tuple[tuple[float, Vec], ...]]:
        """The lowest price per pod of shape ``need``, and the types that offer it.

        Per pod means the type's price over how many copies of the pod it holds. The
        types returned, as (price, capacity), are the smallest and the largest within
        0.5 % of that lowest price per pod: where many sizes are equally good (prices
        linear in size) a large node mixes shapes better, and where one is much cheaper
        it is the only one. ``(inf, ())`` if no type holds one pod.
        """
        found = self._per_pod.get(need)
        if found is not None:
            return found
        rated: list[tuple[float, int, float, Vec]] = []
        for slot, price in zip(self.types, self.prices, strict=True):
            cap = slot.cap
            count = BIG_COUNT
            for d in range(5):
                if need[d] > 0:
                    n = cap[d] // need[d]
                    if n < count:
                        count = n
            if count > 0:
                rated.append((price / count, count, price, cap))
        if not rated:
            found = (math.inf, ())
        else:
            lowest = min(r[0] for r in rated)
            near = [r for r in rated if r[0] <= lowest * 1.005]
            small = min(near, key=lambda r: (r[1], r[2]))
            large = max(near, key=lambda r: (r[1], -r[2]))
            types = (
                ((small[2], small[3]),)
                if small is large
                else (
                    (small[2], small[3]),
                    (large[2], large[3]),
                )
            )
            found = (lowest, types)
        self._per_pod[need] = found
        return found

    def unit_rates(self) -> tuple[float, float]:
        """Half the lowest price per millicore and per byte among these types.

        A node's price split evenly between its CPU and its memory, at the best rates on
        offer: a pod's CPU and memory at these rates is what it covers of a node's price
        where both resources are used.
        """
        if self._rates is None:
            pairs = list(zip(self.types, self.prices, strict=True))
            per_cpu = min((p / t.cap[0] for t, p in pairs), default=0.0)
            per_mem = min((p / t.cap[1] for t, p in pairs), default=0.0)
            self._rates = (per_cpu / 2, per_mem / 2)
        return self._rates

    def frontier(self, max_price: float) -> tuple[Vec, ...]:
        """Capacities of the undominated types priced at most ``max_price``.

        Only these can bound how many more pods a claim may take, so the packer checks
        a handful of vectors instead of every type under its price cap.
        """
        cached = self._frontier.get(max_price)
        if cached is not None:
            return cached
        caps = sorted(
            {t.cap for t, p in zip(self.types, self.prices, strict=True) if p <= max_price},
            reverse=True,
        )
        result = _undominated(caps)
        self._frontier[max_price] = result
        return result

    def value_frontiers(self, key: str) -> tuple[tuple[Vec, ...], ...]:
        """For each value the types carry for label ``key``, its undominated capacities.

        A claim of requests ``total`` can launch as ``n`` values of ``key`` where ``n`` is
        how many of these hold a capacity at least ``total``: what ``minValues`` counts.
        """
        cached = self._by_value.get(key)
        if cached is not None:
            return cached
        caps: dict[str, set[Vec]] = {}
        for slot in self.types:
            value = slot.itype.labels.get(key)
            if value is not None:
                caps.setdefault(value, set()).add(slot.cap)
        result = tuple(_undominated(sorted(c, reverse=True)) for _, c in sorted(caps.items()))
        self._by_value[key] = result
        return result

    def possible_values(self, key: str) -> frozenset[str]:
        """Every value ``key`` can take on a node launched from these candidates."""
        cached = self._values.get(key)
        if cached is not None:
            return cached
        out: set[str] = set()
        for slot in self.types:
            if key in (wk.ZONE, wk.CAPACITY_TYPE):
                out |= slot.values_under(key, self.reqs)
            else:
                value = slot.itype.labels.get(key)
                if value is not None:
                    out.add(value)
        req = self.reqs.get(key)
        if req is not None:
            out = {v for v in out if req.allows(v)}
            if not req.complement and key not in wk.WELL_KNOWN:
                out |= set(req.values)
        result = frozenset(out)
        self._values[key] = result
        return result

    def anchor_price(
        self,
        klass: object,
        agg: tuple[int, int, int, int],
        waste: tuple[float, float],
        need: Vec,
    ) -> float:
        """The price cap for a new claim: the most cost-efficient type for the pods ahead.

        ``agg`` sums the cpu, memory, gpu and count of the pods of the same class still to
        place; ``waste`` is what a node typically loses to fragmentation in cpu and memory
        (half the size-weighted mean request). For each type, covering the pods would take
        about ``ceil(max share)`` nodes of the capacity left after that waste; the type with
        the lowest total (preferring fewer, larger nodes within 1 %) bounds how far a claim
        may grow. So claims fill efficient types instead of drifting up to the largest
        (often exotic and dear) type that still fits, and small types are not chosen for
        pods that would fragment them. Recomputed when the pods ahead shrink by a tenth.
        """
        first = self.first_fit(need)
        floor = self.prices[first] if first >= 0 else math.inf
        cached = self._anchor.get(klass)
        if cached is not None and agg[3] * 10 >= cached[0] * 9:
            return max(cached[1], floor)
        cpu, mem, gpu, count = agg
        best_cost, best_nodes, best_price = math.inf, math.inf, math.inf
        for slot, price in zip(self.types, self.prices, strict=True):
            cap = slot.cap
            if gpu and not cap[2]:
                continue
            eff_cpu, eff_mem = cap[0] - waste[0], cap[1] - waste[1]
            if eff_cpu <= 0 or eff_mem <= 0:
                continue
            share = max(
                cpu / eff_cpu,
                mem / eff_mem,
                count / cap[3],
                gpu / cap[2] if gpu else 0.0,
            )
            nodes = max(1, math.ceil(share - 1e-9))
            cost = nodes * price
            if cost < best_cost * 0.99 or (cost <= best_cost * 1.01 and nodes < best_nodes):
                best_cost, best_nodes, best_price = cost, nodes, price
        self._anchor[klass] = (count, best_price)
        return max(best_price, floor) if best_price != math.inf else floor


def _undominated(caps: list[Vec]) -> tuple[Vec, ...]:
    """The capacities no other one covers on every dimension (``caps`` sorted descending)."""
    kept: list[Vec] = []
    for cap in caps:
        if not any(all(k[d] >= cap[d] for d in range(5)) for k in kept):
            kept.append(cap)
    return tuple(kept)


class CatalogView:
    """All instance types of one scheduling round, and the candidates cache."""

    def __init__(
        self,
        instance_types: Sequence[InstanceType],
        offerings: Sequence[Offering],
        daemon_overhead: Resources,
    ) -> None:
        by_type: dict[str, list[Offering]] = {}
        for offer in offerings:
            if offer.available:
                by_type.setdefault(offer.instance_type, []).append(offer)
        over = vec(daemon_overhead)
        self.slots: list[TypeSlot] = []
        self.unavailable: list[TypeSlot] = []
        for itype in instance_types:
            alloc = vec(itype.allocatable)
            cap = (
                alloc[0] - over[0],
                alloc[1] - over[1],
                alloc[2] - over[2],
                alloc[3] - over[3],
                alloc[4] - over[4],
            )
            if min(cap[0], cap[1], cap[3]) <= 0 or cap[2] < 0:
                continue
            offers = by_type.get(itype.name)
            if offers:
                self.slots.append(TypeSlot(itype, cap, offers))
            else:
                self.unavailable.append(TypeSlot(itype, cap, []))
        self._cache: dict[Requirements, Candidates] = {}

    def candidates(self, reqs: Requirements) -> Candidates:
        cached = self._cache.get(reqs)
        if cached is not None:
            return cached
        pairs: list[tuple[float, TypeSlot]] = []
        for slot in self.slots:
            if not slot.reqs.intersects(reqs):
                continue
            price = slot.price_under(reqs)
            if price is not None:
                pairs.append((price, slot))
        result = Candidates(reqs, pairs)
        self._cache[reqs] = result
        return result

    def label_compatible(self, reqs: Requirements) -> list[TypeSlot]:
        """Types whose labels fit ``reqs``, available or not (for explanations)."""
        out = []
        for slot in self.slots + self.unavailable:
            labels_only = Requirements(
                {k: v for k, v in slot.reqs.items() if k not in (wk.ZONE, wk.CAPACITY_TYPE)}
            )
            if labels_only.intersects(reqs):
                out.append(slot)
        return out
