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
from spotwright.scheduling.output import describe_claim
from spotwright.scheduling.plan import ClaimPlan, ExistingCapacity, NodePoolTemplate, Plan
from spotwright.scheduling.queue import Group, Variant, build_groups, has_topology
from spotwright.scheduling.requirements import KeyRequirement, Requirements
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

__all__ = ["schedule"]

_ZERO: Vec = (0, 0, 0, 0, 0)
_NO_OVERHEAD = Resources()


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
        self.retired = 0
        self.generation = 0
        self.plan = Plan()
        self.topology: Topology | None = None
        self.agg: dict[Hashable, list[int]] = {}
        self.waste: dict[Hashable, tuple[float, float]] = {}
        self.min_need: Vec = (0, 0, 0, 1, 0)
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
        suffix: list[Vec] = [(0, 0, 0, 1, 0)] * (len(groups) + 1)
        low_cpu = low_mem = BIG
        for i in range(len(groups) - 1, -1, -1):
            low_cpu = min(low_cpu, groups[i].req[0])
            low_mem = min(low_mem, groups[i].req[1])
            suffix[i] = (low_cpu, low_mem, 0, 1, 0)
        failed: list[tuple[Group, list[Pod]]] = []
        for i, g in enumerate(groups):
            self.min_need = suffix[i]
            left = self.place_group(g, g.pods)
            if left:
                failed.append((g, left))
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

    def _placed(self, group: Group, k: int) -> None:
        agg = self.agg[group.klass]
        agg[0] -= k * group.req[0]
        agg[1] -= k * group.req[1]
        agg[2] -= k * group.req[2]
        agg[3] -= k

    def _record(self, prof: Profile | None, k: int, host: str, domain_of: object) -> None:
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
        self, group: Group, v: Variant, prof: Profile | None, pods: list[Pod]
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
            self._to_node(node, pods[i : i + k], req, k)
            self._record(prof, k, node.host, node)
            i += k
        for claim in self.open:
            if i == n:
                break
            if claim.retired:
                continue
            k = self.claim_take(claim, group, v, None, n - i)
            if k:
                claim.pods.extend(pods[i : i + k])
                self._record(prof, k, claim.host, claim)
                i += k
        while i < n:
            fresh, k = self.open_claim(group, v, None, n - i)
            if fresh is None:
                break
            fresh.pods.extend(pods[i : i + k])
            self._record(prof, k, fresh.host, fresh)
            i += k
        self._placed(group, i)
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
        alive = [c for c in self.open if not c.retired]
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
                    self._to_node(node, [pod], req, 1)
                    self._record(prof, 1, node.host, node)
                    placed = True
                    break
            if not placed:
                kept: list[ClaimState] = []
                for i, claim in enumerate(alive):
                    if claim.retired:
                        continue
                    self.monotone = True
                    if self.claim_take(claim, group, v, pt, 1):
                        claim.pods.append(pod)
                        self._record(prof, 1, claim.host, claim)
                        placed = True
                        kept.extend(alive[i:])
                        break
                    if not self.monotone:
                        kept.append(claim)
                alive = kept
            if not placed:
                fresh, _ = self.open_claim(group, v, pt, 1)
                if fresh is not None:
                    fresh.pods.append(pod)
                    self._record(prof, 1, fresh.host, fresh)
                    alive.append(fresh)
                    placed = True
            if placed:
                self._placed(group, 1)
            else:
                left.append(pod)
        self._compact()
        return left

    def _to_node(self, node: NodeState, pods: list[Pod], req: Vec, k: int) -> None:
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
        self, claim: ClaimState, group: Group, v: Variant, pt: PodTopology | None, want: int
    ) -> int:
        """Add up to ``want`` pods of ``group`` to ``claim``; how many were added."""
        pool = claim.pool
        if pt is not None and not pt.host_ok(claim.host):
            self.monotone = pt.monotone
            return 0
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
            return 0
        if pt is not None:
            cands_now = self.catalog.candidates(reqs) if reqs is not claim.reqs else claim.cands
            choice = pt.choose(claim.host, cands_now.possible_values)
            if choice is None:
                self.monotone = pt.monotone and not pt.allowed
                return 0
            for key, value in choice.items():
                allowed = reqs.allowed(key)
                if allowed is None or allowed != {value}:
                    reqs = reqs.with_key(key, KeyRequirement(frozenset((value,)), False, False))
        cands = claim.cands if reqs is claim.reqs else self.catalog.candidates(reqs)
        total, req = claim.total, group.req
        k = 0
        for cap in cands.frontier(claim.cap_price):
            spare = room(cap, total, req)
            if spare > k:
                k = spare
        if k > want:
            k = want
        if k <= 0:
            if cands is claim.cands:
                self._maybe_retire(claim)
            return 0
        start = claim.idx if cands is claim.cands else 0
        idx = cands.first_fit(plus(total, req, k), start, claim.cap_price)
        if idx < 0:  # pragma: no cover - the frontier guarantees a fit
            return 0
        if pool.budget is not None:
            k, idx = self._within_limits(claim, cands, start, k, req)
            if k <= 0:
                return 0
        new_total = plus(total, req, k)
        claim.reqs, claim.cands, claim.idx, claim.total = reqs, cands, idx, new_total
        if pool.budget is not None:
            alloc = cands.types[idx].alloc
            for d in range(5):
                pool.used[d] += alloc[d] - claim.contrib[d]
            claim.contrib = alloc
        return k

    def _within_limits(
        self, claim: ClaimState, cands: Candidates, start: int, k: int, req: Vec
    ) -> tuple[int, int]:
        """The most pods (at most ``k``) whose cheapest type keeps the pool within limits."""
        pool = claim.pool
        assert pool.budget is not None
        budget, used, old = pool.budget, pool.used, claim.contrib

        def fits(count: int) -> int:
            idx = cands.first_fit(plus(claim.total, req, count), start, claim.cap_price)
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

    def open_claim(
        self, group: Group, v: Variant, pt: PodTopology | None, want: int
    ) -> tuple[ClaimState | None, int]:
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
            agg = self.agg[group.klass]
            cap = cands.anchor_price(
                group.klass, (agg[0], agg[1], agg[2], agg[3]), self.waste[group.klass], group.req
            )
            claim = ClaimState(pool, cands.reqs, cands, cap, f"claim-{len(self.claims) + 1}", first)
            k = self.claim_take(claim, group, v, pt, want)
            if k <= 0:
                continue
            self.claims.append(claim)
            self.open.append(claim)
            if pool.nodes_left is not None:
                pool.nodes_left -= 1
            return claim, k
        return None, 0

    def _limited(self, pool: Pool, cands: Candidates) -> Candidates:
        assert pool.budget is not None
        left = [pool.budget[d] - pool.used[d] for d in range(3)]
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
