"""``schedule``: place pending pods on existing capacity or on new claims, cost-aware.

The order is Karpenter's: each pod (here, each group of identical pods) goes first to
existing capacity (initialized nodes before in-flight claims, first fit), then to a claim
opened earlier in this round, then to a new claim from the highest-weight NodePool that
can take it. A claim keeps every instance type that still fits its pods.

Where it departs from Karpenter is growth. Karpenter adds pods to a claim while *any*
type still fits, so claims drift up to the largest type, which in a real catalog is often
an expensive special type. Here each claim gets a price cap when it opens: the price of
the type that would cover the pods still to place most cheaply (``anchor_price``). A pod
joins a claim only if some candidate at or under the cap still holds everything, so
claims fill cost-efficient types; the claim's cost is still its cheapest fitting type.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from spotwright.catalog._types import InstanceType
from spotwright.model import labels as wk
from spotwright.model.objects import NodeSelectorRequirement, Pod, Taint
from spotwright.model.resources import Resources
from spotwright.ports.cloud import Offering
from spotwright.scheduling.candidates import Candidates, CatalogView, Vec, vec
from spotwright.scheduling.explain import explain
from spotwright.scheduling.fill import Entry, fill_deferred
from spotwright.scheduling.output import describe_claim
from spotwright.scheduling.plan import ClaimPlan, ExistingCapacity, NodePoolTemplate, Plan
from spotwright.scheduling.queue import Group, Variant, build_groups, has_topology
from spotwright.scheduling.requirements import KeyRequirement, Requirements
from spotwright.scheduling.room import FreeRoom
from spotwright.scheduling.state import (
    BIG,
    ClaimState,
    NodeState,
    Pool,
    Profile,
    plus,
    room,
)
from spotwright.scheduling.taints import tolerates, untolerated_prefer_no_schedule
from spotwright.scheduling.topology import PodTopology, Topology
from spotwright.scheduling.zonal import defer_zonal, release, zonal_key

__all__ = ["schedule"]

_ZERO: Vec = (0, 0, 0, 0, 0)
_NO_OVERHEAD = Resources()


#: How many claims with room that costs nothing a pod compares before growing one.
_FREE_CHOICES = 8
#: How many claims that can grow to take a pod are compared before one is chosen.
_GROWTH_CHOICES = 8

#: A probe's answer: pods to add, the new cheapest type's index, requirements, candidates.
Take = tuple[int, int, Requirements, Candidates]


class _Ring:
    """The claims one group may grow, visited round-robin from the last one used.

    A claim that turns a pod away for a reason that cannot change for its identical
    successors is dropped, so each group walks past a full or forbidden claim once.
    """

    __slots__ = ("claims", "dead", "last", "ndead")

    def __init__(self, claims: list[ClaimState], cursor: ClaimState | None) -> None:
        self.claims = claims
        self.dead = [False] * len(claims)
        self.ndead = 0
        self.last = next((j for j, c in enumerate(claims) if c is cursor), len(claims) - 1)

    def add(self, claim: ClaimState) -> None:
        self.claims.append(claim)
        self.dead.append(False)
        self.last = len(self.claims) - 1

    def drop(self, j: int) -> None:
        if not self.dead[j]:
            self.dead[j] = True
            self.ndead += 1

    def compact(self) -> None:
        if self.ndead <= 32 or self.ndead * 2 <= len(self.claims):
            return
        keep = [j for j in range(len(self.claims)) if not self.dead[j]]
        last = sum(1 for j in keep if j <= self.last) - 1
        self.claims = [self.claims[j] for j in keep]
        self.dead = [False] * len(keep)
        self.ndead = 0
        self.last = max(0, last)


class _Scheduler:
    """One scheduling round: the pools, nodes and claims it builds, and their caches."""

    def __init__(
        self,
        existing: Sequence[ExistingCapacity],
        templates: Sequence[NodePoolTemplate],
        instance_types: Sequence[InstanceType],
        offerings: Sequence[Offering],
        daemon_overhead: Resources,
    ) -> None:
        self.catalog = CatalogView(instance_types, offerings, daemon_overhead)
        self.pools: list[Pool] = []
        for t in sorted(templates, key=lambda t: (-t.weight, t.name)):
            reqs = (
                Requirements.from_terms(t.requirements)
                .intersect(Requirements.from_labels(t.labels))
                .intersect(Requirements.from_labels({wk.NODEPOOL: t.name}))
            )
            budget = None if t.remaining is None else list(vec(t.remaining))
            if budget is not None:
                budget[3] = budget[4] = BIG  # limits count cpu, memory and gpu
            self.pools.append(
                Pool(t, reqs, self.catalog.candidates(reqs), budget, t.nodes_remaining)
            )
        self.nodes = [
            NodeState(e, e.labels.get(wk.HOSTNAME, e.name), vec(e.free))
            for e in sorted(existing, key=lambda e: (e.in_flight, e.name))
        ]
        self.claims: list[ClaimState] = []
        self.open: list[ClaimState] = []
        #: Open claims that may still grow under their price cap (a superset; pruned lazily).
        self.growable: list[ClaimState] = []
        #: The claim the last constrained pod went to: the next one starts looking there.
        self.cursor: ClaimState | None = None
        self.retired = 0
        self.generation = 0
        self.plan = Plan()
        self.topology: Topology | None = None
        self.agg: dict[Hashable, list[int]] = {}
        self.waste: dict[Hashable, tuple[float, float]] = {}
        self.min_need: Vec = (0, 0, 0, 1, 0)
        self.room = FreeRoom(self.min_need)
        self._meet: dict[tuple[Requirements, Requirements], Requirements | None] = {}
        self._tolerated: dict[tuple[int, int], bool] = {}
        self._node_ok: dict[tuple[int, int], bool] = {}
        self._profiles: dict[tuple[int, int], Profile] = {}
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

    def node_static_ok(self, i: int, node: NodeState, group: Group, v: Variant) -> bool:
        key = (i, v.id)
        found = self._node_ok.get(key)
        if found is None:
            found = v.reqs.matches(node.cap.labels) and self.taints_ok(
                -1 - i, node.cap.taints, group, v
            )
            self._node_ok[key] = found
        return found

    def profile(self, group: Group, v: Variant) -> Profile | None:
        topo = self.topology
        if topo is None:
            return None
        key = (id(group), v.id)
        found = self._profiles.get(key)
        if found is None:
            pod = group.pods[0]
            constraints, owners = topo.constraints(pod, v.spreads, v.affinity, v.anti)
            found = Profile(topo.records(pod), owners, topo.inverse(pod), constraints)
            self._profiles[key] = found
        return found

    # -- running -------------------------------------------------------------------------
    def run(self, pods: Sequence[Pod]) -> Plan:
        topo_in_play = any(has_topology(p) for p in pods) or any(
            p.pod_anti_affinity for n in self.nodes for p in n.cap.pods
        )
        groups = build_groups(pods, topo_in_play)
        if topo_in_play:
            self.topology = Topology(
                ((n.host, n.cap.labels, n.cap.pods) for n in self.nodes), self._universe
            )
            for g in groups:
                self.topology.register(g.pods[0])
        squares: dict[Hashable, list[int]] = {}
        for g in groups:
            agg = self.agg.setdefault(g.klass, [0, 0, 0, 0])
            n = len(g.pods)
            agg[0] += n * g.req[0]
            agg[1] += n * g.req[1]
            agg[2] += n * g.req[2]
            agg[3] += n
            sq = squares.setdefault(g.klass, [0, 0])
            sq[0] += n * g.req[0] * g.req[0]
            sq[1] += n * g.req[1] * g.req[1]
        for klass, agg in self.agg.items():
            sq = squares[klass]
            self.waste[klass] = (
                sq[0] / agg[0] / 2 if agg[0] else 0.0,
                sq[1] / agg[1] / 2 if agg[1] else 0.0,
            )
        # A claim is retired once it cannot take even the smallest pod of the round.
        self.min_need = (
            min(g.req[0] for g in groups) if groups else 0,
            min(g.req[1] for g in groups) if groups else 0,
            0,
            1,
            0,
        )
        self.room = FreeRoom(self.min_need)
        failed: list[tuple[Group, list[Pod]]] = []
        deferred: list[Entry] = []
        for g in groups:
            v = g.variants[0]
            prof = self.profile(g, v)
            if prof is None or not (prof.constraints or prof.inverse):
                # unconstrained: existing capacity now, new claims in the packing pass
                left = self.place_bulk(g, v, prof, g.pods, existing_only=True)
                if left:
                    deferred.append(Entry(g, v, prof, left))
                continue
            key = zonal_key(prof)
            left = g.pods
            if key is not None:
                # zonal rules only: the zone now, the node in the packing pass
                entries, left = defer_zonal(self, g, v, prof, key, g.pods)
                deferred.extend(entries)
            left = self.place_group(g, left) if left else left
            if left:
                failed.append((g, left))
        for entry in fill_deferred(self, deferred):
            release(entry)
            left = self.place_group(entry.group, entry.pods[entry.done :])
            if left:
                failed.append((entry.group, left))
        if failed and self.topology is not None:
            # pod affinity may name pods placed later in the round: one more pass.
            retry, failed = failed, []
            for g, left in retry:
                left = self.place_group(g, left) if g.variants[-1].has_terms else left
                if left:
                    failed.append((g, left))
        for g, left in failed:
            reason = explain(self, g)
            for pod in left:
                self.plan.unschedulable[pod.key] = reason
        self.plan.new_claims = [self.finish(c) for c in self.claims]
        return self.plan

    def _universe(self, key: str) -> frozenset[str]:
        out: set[str] = set()
        for pool in self.pools:
            out |= pool.cands.possible_values(key)
        return frozenset(out)

    def place_group(self, group: Group, pods: list[Pod]) -> list[Pod]:
        for v in group.variants:
            prof = self.profile(group, v)
            if prof is not None and (prof.constraints or prof.inverse):
                pods = self.place_each(group, v, prof, pods)
            else:
                pods = self.place_bulk(group, v, prof, pods)
            if not pods:
                break
        return pods

    def placed(self, group: Group, k: int) -> None:
        agg = self.agg[group.klass]
        agg[0] -= k * group.req[0]
        agg[1] -= k * group.req[1]
        agg[2] -= k * group.req[2]
        agg[3] -= k

    def record(self, prof: Profile | None, k: int, host: str, domain_of: object) -> None:
        if prof is None:
            return
        for counter in (*prof.records, *prof.owners):
            if counter.key == wk.HOSTNAME:
                counter.add(host, k)
                continue
            if isinstance(domain_of, ClaimState):
                allowed = domain_of.reqs.allowed(counter.key)
                value = next(iter(allowed)) if allowed is not None and len(allowed) == 1 else None
            else:
                assert isinstance(domain_of, NodeState)
                value = domain_of.cap.labels.get(counter.key)
            if value is not None:
                counter.add(value, k)

    def place_bulk(
        self,
        group: Group,
        v: Variant,
        prof: Profile | None,
        pods: list[Pod],
        *,
        existing_only: bool = False,
    ) -> list[Pod]:
        n, i, req = len(pods), 0, group.req
        for j, node in enumerate(self.nodes):
            if i == n:
                break
            if not self.node_static_ok(j, node, group, v):
                continue
            k = min(room(node.free, _ZERO, req), n - i)
            if k <= 0:
                continue
            self.to_node(node, pods[i : i + k], req, k)
            self.record(prof, k, node.host, node)
            i += k
        if existing_only:
            self.placed(group, i)
            return pods[i:]
        for claim in self.open:
            if i == n:
                break
            if claim.retired:
                continue
            k = self.claim_take(claim, group, v, None, n - i)
            if k:
                claim.pods.extend(pods[i : i + k])
                self.record(prof, k, claim.host, claim)
                i += k
        while i < n:
            fresh, k = self.open_claim(group, v, None, n - i)
            if fresh is None:
                break
            fresh.pods.extend(pods[i : i + k])
            self.record(prof, k, fresh.host, fresh)
            i += k
        self.placed(group, i)
        self._compact()
        return pods[i:]

    def place_each(self, group: Group, v: Variant, prof: Profile, pods: list[Pod]) -> list[Pod]:
        assert self.topology is not None
        left: list[Pod] = []
        req = group.req
        constraints = prof.constraints
        # Claims this group may still use, in order. A claim that turns a pod away for a
        # reason that cannot change for its identical successors (capacity, taints,
        # requirements, hostname anti-affinity or spread) is dropped from the list, so
        # each group walks past a full or forbidden claim once, not once per pod.
        self.growable = [
            c for c in self.growable if not c.retired and c.cap_price > c.cands.prices[c.idx]
        ]
        ring = _Ring(list(self.growable), self.cursor)
        for pod in pods:
            pt = PodTopology(self.topology, constraints, prof.inverse, v.reqs)
            if pt.impossible:
                left.append(pod)
                continue
            placed = False
            for j, node in enumerate(self.nodes):
                if (
                    self.node_static_ok(j, node, group, v)
                    and room(node.free, _ZERO, req) >= 1
                    and pt.node_ok(node.host, node.cap.labels)
                ):
                    self.to_node(node, [pod], req, 1)
                    self.record(prof, 1, node.host, node)
                    placed = True
                    break
            if not placed:
                claim = self._claim_for(ring, group, v, pt)
                if claim is not None:
                    claim.pods.append(pod)
                    self.record(prof, 1, claim.host, claim)
                    placed = True
            if not placed:
                fresh, _ = self.open_claim(group, v, pt, 1)
                if fresh is not None:
                    fresh.pods.append(pod)
                    self.record(prof, 1, fresh.host, fresh)
                    ring.add(fresh)
                    placed = True
            if placed:
                self.placed(group, 1)
            else:
                left.append(pod)
        self._compact()
        return left

    def _claim_for(
        self, ring: _Ring, group: Group, v: Variant, pt: PodTopology
    ) -> ClaimState | None:
        """Add one pod of ``group`` to an open claim; the claim, or None.

        First room that costs nothing: among the oldest claims with room left, the one
        whose room the pod matches best (dot product of the pod and the room, per unit
        of the claim's type). Then growth: of the next few claims round the ring that can
        take the pod under their price cap, the one whose price rises least, and among
        equals the one left most balanced. Going round the ring spreads pods over the
        claims, as Karpenter's fewest-pods-first order does, instead of piling them on
        the first; choosing the most balanced keeps a claim from filling up its memory
        while its CPU idles.
        """
        claim = self._free_fit(group, v, pt)
        if claim is not None:
            return claim
        claims, dead = ring.claims, ring.dead
        n = len(claims)
        req = group.req
        best: tuple[float, float, ClaimState, Take] | None = None
        seen = 0
        for step in range(1, n + 1):
            j = (ring.last + step) % n
            claim = claims[j]
            if dead[j]:
                continue
            if claim.retired:
                ring.drop(j)
                continue
            self.monotone = True
            take = self.probe(claim, group, v, pt, 1)
            if take is None:
                if self.monotone:
                    # the reason (no room under the cap, taints, requirements, hostname
                    # spread or anti-affinity) holds for every later pod of the group too
                    ring.drop(j)
                continue
            _, idx, _, cands = take
            top, total = cands.types[idx].cap, plus(claim.total, req, 1)
            delta = cands.prices[idx] - claim.cands.prices[claim.idx]
            skew = abs(total[0] / top[0] - total[1] / top[1])
            if (
                best is None
                or delta < best[0] * 0.98
                or (delta <= best[0] * 1.02 and skew < best[1])
            ):
                best = (delta, skew, claim, take)
                ring.last = j
            seen += 1
            if seen >= _GROWTH_CHOICES:
                break
        ring.compact()
        if best is None:
            return None
        claim = best[2]
        self.commit(claim, group, best[3])
        self.cursor = claim
        return claim

    def _free_fit(self, group: Group, v: Variant, pt: PodTopology) -> ClaimState | None:
        """A claim whose current type still has room for the pod, the most balanced after.

        Looks at the first few claims the room index offers (tightest first) and tries
        them in order of how even their CPU and memory use would be with the pod.
        """
        req = group.req
        scored: list[tuple[float, int, ClaimState]] = []
        for claim in self.room.fitting(req):
            top, total = claim.cands.types[claim.idx].cap, claim.total
            skew = abs((total[0] + req[0]) / top[0] - (total[1] + req[1]) / top[1])
            scored.append((skew, len(scored), claim))
            if len(scored) >= _FREE_CHOICES:
                break
        scored.sort()
        for _, _, claim in scored:
            if self.claim_take(claim, group, v, pt, 1, claim.cands.prices[claim.idx]):
                return claim
        return None

    def to_node(self, node: NodeState, pods: list[Pod], req: Vec, k: int) -> None:
        node.free = plus(node.free, req, -k)
        for pod in pods:
            self.plan.existing[pod.key] = node.cap.name

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
            cands_now = self.catalog.candidates(reqs) if reqs is not claim.reqs else claim.cands
            choice = pt.choose(claim.host, cands_now.possible_values)
            if choice is None:
                self.monotone = pt.monotone and not pt.allowed
                return None
            for key, value in choice.items():
                allowed = reqs.allowed(key)
                if allowed is None or allowed != {value}:
                    reqs = reqs.with_key(key, KeyRequirement(frozenset((value,)), False, False))
        cands = claim.cands if reqs is claim.reqs else self.catalog.candidates(reqs)
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
            for d in range(3):
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
        for pool in self.pools:
            if pool.nodes_left is not None and pool.nodes_left <= 0:
                continue
            if not self.taints_ok(id(pool), pool.template.taints, group, v):
                continue
            reqs = self.meet(pool.reqs, v.reqs)
            if reqs is None:
                continue
            cands = self.catalog.candidates(reqs)
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
        left = [pool.budget[d] - pool.used[d] for d in range(3)]
        if all(cands.max_alloc[d] <= left[d] for d in range(3)):
            return cands
        pairs = [
            (p, t)
            for t, p in zip(cands.types, cands.prices, strict=True)
            if t.alloc[0] <= left[0] and t.alloc[1] <= left[1] and t.alloc[2] <= left[2]
        ]
        if len(pairs) == len(cands.types):
            return cands
        return Candidates(cands.reqs, pairs)

    # -- output ----------------------------------------------------------------------------
    def finish(self, claim: ClaimState) -> ClaimPlan:
        pool, cands, total, idx = claim.pool, claim.cands, claim.total, claim.idx
        budget = pool.budget
        if budget is not None:
            left = tuple(budget[d] - pool.used[d] + claim.contrib[d] for d in range(3))
            if all(cands.max_alloc[d] <= left[d] for d in range(3)):
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
            price=price,
        )


def schedule(
    pods: Sequence[Pod],
    existing: Sequence[ExistingCapacity],
    templates: Sequence[NodePoolTemplate],
    instance_types: Sequence[InstanceType],
    offerings: Sequence[Offering],
    *,
    daemon_overhead: Resources = _NO_OVERHEAD,
) -> Plan:
    """Plan where ``pods`` go: existing capacity first, then new claims (see module doc)."""
    return _Scheduler(existing, templates, instance_types, offerings, daemon_overhead).run(pods)
