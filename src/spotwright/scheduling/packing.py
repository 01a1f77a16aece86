"""``schedule``: place pending pods on existing capacity or on new claims, cost-aware.

The order is Karpenter's: each pod (here, each group of identical pods) goes first to
existing capacity (initialized nodes before in-flight claims; pods without topology rules
largest first, each where it fits tightest, so pods still pending while their claims boot
land as planned), then to a claim opened earlier in this round, then to a new claim
from the highest-weight NodePool that can take it. A claim keeps every instance type that
still fits its pods.

Where it departs from Karpenter is growth. Karpenter adds pods to a claim while *any*
type still fits, so claims drift up to the largest type, which in a real catalog is often
an expensive special type. Here each claim gets a price cap when it opens: the price of
the type that would cover the pods still to place most cheaply (``anchor_price``). A pod
joins a claim only if some candidate at or under the cap still holds everything, so
claims fill cost-efficient types; the claim's cost is still its cheapest fitting type.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from spotwright.catalog._types import InstanceType
from spotwright.model import labels as wk
from spotwright.model.objects import Pod
from spotwright.model.resources import Resources
from spotwright.ports.cloud import Offering
from spotwright.scheduling.candidates import vec
from spotwright.scheduling.claims import ClaimBook, Take
from spotwright.scheduling.explain import explain
from spotwright.scheduling.fill import Entry, fill_deferred
from spotwright.scheduling.plan import ExistingCapacity, NodePoolTemplate, Plan
from spotwright.scheduling.queue import Group, Variant, build_groups, has_topology
from spotwright.scheduling.room import FreeRoom
from spotwright.scheduling.state import (
    ClaimState,
    NodeState,
    Profile,
    node_room,
    plus,
    take_from_node,
)
from spotwright.scheduling.topology import PodTopology, Topology
from spotwright.scheduling.zonal import defer_zonal, release, zonal_key

__all__ = ["schedule"]

_NO_OVERHEAD = Resources()


#: How many claims with room that costs nothing a pod compares before growing one.
_FREE_CHOICES = 8
#: How many claims that can grow to take a pod are compared before one is chosen.
_GROWTH_CHOICES = 8


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


class _Scheduler(ClaimBook):
    """One scheduling round: existing nodes, topology and the order pods are placed in."""

    def __init__(
        self,
        existing: Sequence[ExistingCapacity],
        templates: Sequence[NodePoolTemplate],
        instance_types: Sequence[InstanceType],
        offerings: Sequence[Offering],
        daemon_overhead: Resources | Mapping[str, Resources],
    ) -> None:
        super().__init__(templates, instance_types, offerings, daemon_overhead)
        self.nodes = [
            NodeState(e, e.labels.get(wk.HOSTNAME, e.name), vec(e.free), dict(e.free.extended))
            for e in sorted(existing, key=lambda e: (e.in_flight, e.name))
        ]
        #: The claim the last constrained pod went to: the next one starts looking there.
        self.cursor: ClaimState | None = None
        #: CPU and memory the round's pods request: the scale of "room left over".
        self.totals: tuple[int, int] = (1, 1)
        self.topology: Topology | None = None
        self._node_ok: dict[tuple[int, int], bool] = {}
        self._profiles: dict[tuple[int, int], Profile] = {}

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
        self.totals = (
            sum(len(g.pods) * g.req[0] for g in groups) or 1,
            sum(len(g.pods) * g.req[1] for g in groups) or 1,
        )
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
        free: dict[int, list[Pod]] = {}
        if self.nodes:
            # Unconstrained pods take existing capacity largest first, each where it fits
            # tightest: pods still pending while the claims planned for them boot then land
            # as they were planned, instead of first-fit stranding room that new claims
            # (nodes of their own) would then make up for.
            for g in sorted(groups, key=lambda g: g.order_key):
                v = g.variants[0]
                prof = self.profile(g, v)
                if prof is None or not (prof.constraints or prof.inverse):
                    free[id(g)] = self.place_bulk(g, v, prof, g.pods, existing_only=True)
        for g in groups:
            v = g.variants[0]
            prof = self.profile(g, v)
            if prof is None or not (prof.constraints or prof.inverse):
                # unconstrained: existing capacity now, new claims in the packing pass
                left = free[id(g)] if self.nodes else g.pods
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
        for j in self._tightest(group, v):
            if i == n:
                break
            node = self.nodes[j]
            k = min(node_room(node, req, group.ext), n - i)
            if k <= 0:
                continue
            self.to_node(node, pods[i : i + k], group, k)
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

    def _tightest(self, group: Group, v: Variant) -> list[int]:
        """The existing nodes ``group`` may use: initialized before in-flight, then best fit.

        Best fit is fewest copies of the pod fitting, then least room left over (CPU and
        memory as shares of the round's requests): a memory-heavy pod goes to the
        memory-rich node planned for it, not to the first general-purpose one by name.
        """
        req, (cpu, mem) = group.req, self.totals
        scored: list[tuple[bool, int, float, int]] = []
        for j, node in enumerate(self.nodes):
            if not self.node_static_ok(j, node, group, v):
                continue
            fits = node_room(node, req, group.ext)
            if fits <= 0:
                continue
            free = node.free
            left = (free[0] - req[0]) / cpu + (free[1] - req[1]) / mem
            scored.append((node.cap.in_flight, fits, left, j))
        scored.sort()
        return [j for *_, j in scored]

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
                    and node_room(node, req, group.ext) >= 1
                    and pt.node_ok(node.host, node.cap.labels)
                ):
                    self.to_node(node, [pod], group, 1)
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

    def to_node(self, node: NodeState, pods: list[Pod], group: Group, k: int) -> None:
        take_from_node(node, group.req, group.ext, k)
        for pod in pods:
            self.plan.existing[pod.key] = node.cap.name


def schedule(
    pods: Sequence[Pod],
    existing: Sequence[ExistingCapacity],
    templates: Sequence[NodePoolTemplate],
    instance_types: Sequence[InstanceType],
    offerings: Sequence[Offering],
    *,
    daemon_overhead: Resources | Mapping[str, Resources] = _NO_OVERHEAD,
) -> Plan:
    """Plan where ``pods`` go: existing capacity first, then new claims (see module doc).

    ``daemon_overhead`` is what DaemonSets take on every new node before any pod lands:
    one figure for all NodePools, or one per NodePool name (a DaemonSet that runs only on
    some pools' nodes counts only there; a pool not named has none).
    """
    return _Scheduler(existing, templates, instance_types, offerings, daemon_overhead).run(pods)
