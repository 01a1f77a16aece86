"""Opening and growing new claims: price caps, NodePool limits and the claim records.

The packer (``packing``) decides which pod goes where; this module answers whether a claim
can take pods and what that does to it: which instance types still fit, what the claim's
cheapest type becomes, whether the NodePool's limits allow it, and when a claim is full.
It also holds the per-round caches those answers share (requirement meets, tolerations)
and turns finished claims into ``ClaimPlan`` records.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from spotwright.catalog._types import InstanceType
from spotwright.model import labels as wk
from spotwright.model.objects import NodeSelectorRequirement, Taint
from spotwright.model.resources import Resources
from spotwright.ports.cloud import Offering
from spotwright.scheduling.candidates import Candidates, CatalogView, Vec, vec
from spotwright.scheduling.floors import floors_of, within_floors
from spotwright.scheduling.output import describe_claim
from spotwright.scheduling.plan import ClaimPlan, NodePoolTemplate, Plan
from spotwright.scheduling.queue import Group, Variant
from spotwright.scheduling.requirements import KeyRequirement, Requirements
from spotwright.scheduling.room import FreeRoom
from spotwright.scheduling.state import ClaimState, Pool, plus, room
from spotwright.scheduling.taints import tolerates, untolerated_prefer_no_schedule
from spotwright.scheduling.topology import PodTopology

__all__ = ["ClaimBook", "Take"]

#: A probe's answer: pods to add, the new cheapest type's index, requirements, candidates.
Take = tuple[int, int, Requirements, Candidates]

_NO_OVERHEAD = Resources()


class ClaimBook:
    """The NodePools of one round and the claims opened from them."""

    def __init__(
        self,
        templates: Sequence[NodePoolTemplate],
        instance_types: Sequence[InstanceType],
        offerings: Sequence[Offering],
        daemon_overhead: Resources | Mapping[str, Resources],
    ) -> None:
        # Pools whose nodes run the same DaemonSets share one view of the catalog.
        views: dict[Resources, CatalogView] = {}
        self.pools: list[Pool] = []
        for t in sorted(templates, key=lambda t: (-t.weight, t.name)):
            reqs = (
                Requirements.from_terms(t.requirements)
                .intersect(Requirements.from_labels(t.labels))
                .intersect(Requirements.from_labels({wk.NODEPOOL: t.name}))
            )
            budget = None if t.remaining is None else list(vec(t.remaining))
            if isinstance(daemon_overhead, Resources):
                overhead = daemon_overhead
            else:
                overhead = daemon_overhead.get(t.name, _NO_OVERHEAD)
            view = views.get(overhead)
            if view is None:
                view = views[overhead] = CatalogView(instance_types, offerings, overhead)
            pool = Pool(t, reqs, view, view.candidates(reqs), budget, t.nodes_remaining)
            pool.floors = floors_of(t.requirements)
            self.pools.append(pool)
        self.claims: list[ClaimState] = []
        self.open: list[ClaimState] = []
        #: Open claims that may still grow under their price cap (a superset; pruned lazily).
        self.growable: list[ClaimState] = []
        self.retired = 0
        self.generation = 0
        self.plan = Plan()
        self.agg: dict[Hashable, list[int]] = {}
        self.waste: dict[Hashable, tuple[float, float]] = {}
        self.min_need: Vec = (0, 0, 0, 1, 0)
        self.room = FreeRoom(self.min_need)
        self._meet: dict[tuple[Requirements, Requirements], Requirements | None] = {}
        self._tolerated: dict[tuple[int, int], bool] = {}
        self.monotone = True
        self._finished: dict[
            object,
            tuple[tuple[str, ...], tuple[NodeSelectorRequirement, ...], dict[str, str], float],
        ] = {}

    # -- cached static checks ------------------------------------------------------------
    def meet(self, node: Requirements, pod: Requirements) -> Requirements | None:
        key = (node, pod)
        try:
            return self._meet[key]
        except KeyError:
            result = node.intersect(pod) if node.compatible(pod) else None
            self._meet[key] = result
            return result

    def taints_ok(self, owner: int, taints: Sequence[Taint], group: Group, v: Variant) -> bool:
        key = (owner, v.id)
        found = self._tolerated.get(key)
        if found is None:
            tolerations = group.pods[0].tolerations
            found = tolerates(tolerations, taints) is None and (
                v.tolerate_prefer_no_schedule
                or untolerated_prefer_no_schedule(tolerations, taints) is None
            )
            self._tolerated[key] = found
        return found

    def _compact(self) -> None:
        if self.retired > 64 and self.retired * 2 > len(self.open):
            self.open = [c for c in self.open if not c.retired]
            self.retired = 0
            self.generation += 1

    # -- claims ----------------------------------------------------------------------------
    def claim_take(
        self,
        claim: ClaimState,
        group: Group,
        v: Variant,
        pt: PodTopology | None,
        want: int,
        cap: float | None = None,
    ) -> int:
        """Add up to ``want`` pods of ``group`` to ``claim``; how many were added.

        The claim may grow to any candidate type priced at most ``cap`` (its own price
        cap by default; the packing pass passes the current price to fill for free).
        """
        found = self.probe(claim, group, v, pt, want, cap)
        if found is None:
            return 0
        self.commit(claim, group, found)
        return found[0]

    def probe(
        self,
        claim: ClaimState,
        group: Group,
        v: Variant,
        pt: PodTopology | None,
        want: int,
        cap: float | None = None,
    ) -> Take | None:
        """How ``claim_take`` would add pods: (count, type index, requirements, candidates).

        Changes nothing but ``self.monotone`` (False when a topology rule that may yet
        change turned the pods away) and, when the claim cannot grow at all, retires it.
        """
        if group.ext:  # see open_claim
            return None
        pool = claim.pool
        price_cap = claim.cap_price if cap is None else cap
        if pt is not None and not pt.host_ok(claim.host):
            self.monotone = pt.monotone
            return None
        seen = claim.meets.get(v.id)
        if seen is not None and seen[0] is claim.reqs:
            reqs = seen[1]
        else:
            if self.taints_ok(id(pool), pool.template.taints, group, v):
                reqs = self.meet(claim.reqs, v.reqs)
                if reqs is not None and reqs == claim.reqs:
                    reqs = claim.reqs
            else:
                reqs = None
            claim.meets[v.id] = (claim.reqs, reqs)
        if reqs is None:
            return None
        if pt is not None:
            cands_now = pool.catalog.candidates(reqs) if reqs is not claim.reqs else claim.cands
            choice = pt.choose(claim.host, cands_now.possible_values)
            if choice is None:
                self.monotone = pt.monotone and not pt.allowed
                return None
            for key, value in choice.items():
                allowed = reqs.allowed(key)
                if allowed is None or allowed != {value}:
                    reqs = reqs.with_key(key, KeyRequirement(frozenset((value,)), False, False))
        cands = claim.cands if reqs is claim.reqs else pool.catalog.candidates(reqs)
        total, req = claim.total, group.req
        k = 0
        tops = cands.frontier(price_cap) if claim.target is None else (claim.target,)
        for top in tops:
            spare = room(top, total, req)
            if spare > k:
                k = spare
        if k > want:
            k = want
        if k <= 0:
            if cands is claim.cands and cap is None:
                self._maybe_retire(claim)
            return None
        if pool.floors:
            k = within_floors(pool.floors, cands, total, req, k)
            if k <= 0:
                return None
        start = claim.idx if cands is claim.cands else 0
        idx = cands.first_fit(plus(total, req, k), start, price_cap)
        if idx < 0:  # the target type is not among narrowed candidates
            return None
        if pool.budget is not None:
            k, idx = self._within_limits(claim, cands, start, k, req, price_cap)
            if k <= 0:
                return None
        return k, idx, reqs, cands

    def commit(self, claim: ClaimState, group: Group, take: Take) -> None:
        """Apply a ``probe`` result (pods are appended by the caller)."""
        k, idx, reqs, cands = take
        pool = claim.pool
        claim.reqs, claim.cands, claim.idx = reqs, cands, idx
        claim.total = plus(claim.total, group.req, k)
        self.room.update(claim)
        if pool.budget is not None:
            alloc = cands.types[idx].alloc
            for d in range(5):
                pool.used[d] += alloc[d] - claim.contrib[d]
            claim.contrib = alloc

    def _within_limits(
        self, claim: ClaimState, cands: Candidates, start: int, k: int, req: Vec, price_cap: float
    ) -> tuple[int, int]:
        """The most pods (at most ``k``) whose cheapest type keeps the pool within limits."""
        pool = claim.pool
        assert pool.budget is not None
        budget, used, old = pool.budget, pool.used, claim.contrib

        def fits(count: int) -> int:
            idx = cands.first_fit(plus(claim.total, req, count), start, price_cap)
            if idx < 0:
                return -1
            alloc = cands.types[idx].alloc
            for d in range(5):
                if used[d] - old[d] + alloc[d] > budget[d]:
                    return -1
            return idx

        idx = fits(k)
        if idx >= 0:
            return k, idx
        low, high = 0, k  # fits(low) holds (or low == 0), fits(high) fails
        while high - low > 1:
            mid = (low + high) // 2
            if fits(mid) >= 0:
                low = mid
            else:
                high = mid
        return (low, fits(low)) if low > 0 else (0, -1)

    def _maybe_retire(self, claim: ClaimState) -> None:
        need = plus(claim.total, self.min_need, 1)
        for cap in claim.cands.frontier(claim.cap_price):
            if all(cap[d] >= need[d] for d in range(5)):
                return
        claim.retired = True
        self.retired += 1
        self.room.remove(claim)

    def open_claim(
        self,
        group: Group,
        v: Variant,
        pt: PodTopology | None,
        want: int,
        cap: float | None = None,
        target: Vec | None = None,
    ) -> tuple[ClaimState | None, int]:
        """Open a claim in the first NodePool (by weight) that can take ``group``'s pods.

        Its price cap is ``cap`` if given, else the anchor price of the pods ahead; never
        below the cheapest type that holds one pod. With ``target``, the claim only ever
        holds what a type of that capacity holds (its type is still the cheapest fitting).
        """
        if group.ext:  # no instance type lists extended resources: existing nodes only
            return None, 0
        for pool in self.pools:
            if pool.nodes_left is not None and pool.nodes_left <= 0:
                continue
            if not self.taints_ok(id(pool), pool.template.taints, group, v):
                continue
            reqs = self.meet(pool.reqs, v.reqs)
            if reqs is None:
                continue
            cands = pool.catalog.candidates(reqs)
            if not cands.types:
                continue
            if pool.budget is not None:
                cands = self._limited(pool, cands)
            first = cands.first_fit(group.req)
            if first < 0:
                continue
            if cap is None:
                agg = self.agg[group.klass]
                price = cands.anchor_price(
                    group.klass,
                    (agg[0], agg[1], agg[2], agg[3]),
                    self.waste[group.klass],
                    group.req,
                )
            else:
                price = max(cap, cands.prices[first])
            if group.solo:
                # a pod that must be alone among its like: its claim stays the smallest
                # type that holds it, and other pods fill the room that type has left
                price = cands.prices[first]
            claim = ClaimState(
                pool, cands.reqs, cands, price, f"claim-{len(self.claims) + 1}", first
            )
            claim.target = target
            k = self.claim_take(claim, group, v, pt, want)
            if k <= 0:
                continue
            self.claims.append(claim)
            self.open.append(claim)
            if claim.cap_price > claim.cands.prices[claim.idx]:
                self.growable.append(claim)
            if pool.nodes_left is not None:
                pool.nodes_left -= 1
            return claim, k
        return None, 0

    def _limited(self, pool: Pool, cands: Candidates) -> Candidates:
        assert pool.budget is not None
        left = [pool.budget[d] - pool.used[d] for d in range(5)]
        if all(cands.max_alloc[d] <= left[d] for d in range(5)):
            return cands
        pairs = [
            (p, t)
            for t, p in zip(cands.types, cands.prices, strict=True)
            if all(t.alloc[d] <= left[d] for d in range(5))
        ]
        if len(pairs) == len(cands.types):
            return cands
        return Candidates(cands.reqs, pairs)

    # -- output ----------------------------------------------------------------------------
    def finish(self, claim: ClaimState) -> ClaimPlan:
        pool, cands, total, idx = claim.pool, claim.cands, claim.total, claim.idx
        budget = pool.budget
        if budget is not None:
            left = tuple(budget[d] - pool.used[d] + claim.contrib[d] for d in range(5))
            if all(cands.max_alloc[d] <= left[d] for d in range(5)):
                budget = None
        key = (id(cands), idx, total) if budget is None else None
        done = self._finished.get(key) if key is not None else None
        if done is None:
            done = describe_claim(claim, left if budget is not None else None)
            if key is not None:
                self._finished[key] = done
        names, terms, labels, price = done
        return ClaimPlan(
            nodepool=pool.template.name,
            pods=claim.pods,
            requests=Resources(*total),
            instance_types=names,
            requirements=terms,
            labels=dict(labels),
            taints=pool.template.taints,
            startup_taints=pool.template.startup_taints,
            price=price,
        )
