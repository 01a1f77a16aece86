"""The packing pass: unconstrained pods placed together, bin by bin, dearest first.

Pods without topology terms do not need to be placed one group at a time in queue order,
and placing them that way is what makes packings expensive: the first claims fill with
whatever shape happens to sort first (all the CPU-heavy pods, say) and strand the other
resource. So once every constrained pod has a place, the unconstrained ones that existing
capacity could not take are packed per class (same requirements and tolerations, hence
the same NodePools and instance types):

1. into the room left on the claims opened this round, at no extra cost: a claim takes a
   pod only if a type no dearer than its current one still holds everything;
2. then into new claims, one at a time. The dearest remaining shape opens the claim, with
   a price cap of the type that holds that shape most cheaply per pod; the claim may
   become any candidate type up to that cap, and the other shapes, dearest first, fill
   what is left before the next claim opens.

A shape's worth is what one such pod costs at best on its own: the lowest price per pod
over the candidate types, counting how many copies fit (``Candidates.per_pod``). Dear pods
thus pick node types that suit them, and cheap pods fill the gaps, which is the structure
of near-optimal packings on real catalogs (a 1.5-vCPU pod alone on a small burstable
node with a few 100m pods beside it; memory-heavy pods together on a memory-rich type).
Each claim is priced at the end by the cheapest type that holds its final pods.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spotwright.model.objects import Pod
from spotwright.scheduling.candidates import Candidates, Vec
from spotwright.scheduling.state import ClaimState, Profile, plus, room

if TYPE_CHECKING:
    from spotwright.scheduling.packing import Take, _Scheduler
    from spotwright.scheduling.queue import Group, Variant

__all__ = ["Entry", "fill_deferred"]

_GROWTH_CHOICES = 8
_GROWTH_SCAN = 64


@dataclass(eq=False, slots=True)
class Entry:
    """A group's pods waiting for the packing pass; ``done`` of them are placed."""

    group: Group
    variant: Variant
    profile: Profile | None
    pods: list[Pod]
    done: int = 0

    @property
    def left(self) -> int:
        return len(self.pods) - self.done


@dataclass(eq=False, slots=True)
class _Shape:
    """The entries of one class with the same resource vector, and what one pod is worth."""

    req: Vec
    value: float
    #: (price, capacity) of the types that hold this shape most cheaply per pod.
    targets: tuple[tuple[float, Vec], ...]
    entries: list[Entry] = field(default_factory=list)
    left: int = 0


def fill_deferred(sched: _Scheduler, entries: list[Entry]) -> list[Entry]:
    """Pack ``entries`` (see module doc); returns those with pods still unplaced."""
    classes: dict[Hashable, list[Entry]] = {}
    for e in entries:
        key = (e.variant.reqs, e.group.pods[0].tolerations, e.variant.tolerate_prefer_no_schedule)
        classes.setdefault(key, []).append(e)
    leftovers: list[Entry] = []
    for members in classes.values():
        cands = _class_candidates(sched, members[0])
        if cands is not None:
            shapes = _shapes(cands, members)
            _fill_open(sched, shapes, members[0])
            _grow_open(sched, shapes, members[0])
            _fill_new(sched, cands, shapes)
        leftovers.extend(e for e in members if e.left)
    return leftovers


def _class_candidates(sched: _Scheduler, e: Entry) -> Candidates | None:
    """The instance types of the first NodePool (by weight) that can take the class."""
    for pool in sched.pools:
        if not sched.taints_ok(id(pool), pool.template.taints, e.group, e.variant):
            continue
        reqs = sched.meet(pool.reqs, e.variant.reqs)
        if reqs is None:
            continue
        cands = sched.catalog.candidates(reqs)
        if cands.types:
            return cands
    return None


def _shapes(cands: Candidates, members: list[Entry]) -> list[_Shape]:
    by_req: dict[Vec, _Shape] = {}
    for e in members:
        shape = by_req.get(e.group.req)
        if shape is None:
            value, targets = cands.per_pod(e.group.req)
            shape = by_req[e.group.req] = _Shape(e.group.req, value, targets)
        shape.entries.append(e)
        shape.left += e.left
    # Dearest first. Shapes worth the same (within 0.5 %) go smallest first: they pack
    # more worth into the room a claim has left.
    cpu = sum(s.req[0] * s.left for s in by_req.values()) or 1
    mem = sum(s.req[1] * s.left for s in by_req.values()) or 1
    ordered = sorted(by_req.values(), key=lambda s: -s.value)
    out: list[_Shape] = []
    i = 0
    while i < len(ordered):
        j = i + 1
        while j < len(ordered) and ordered[j].value >= ordered[i].value * 0.995:
            j += 1
        out.extend(sorted(ordered[i:j], key=lambda s: max(s.req[0] / cpu, s.req[1] / mem)))
        i = j
    return out


def _compatible(sched: _Scheduler, claim: ClaimState, e: Entry) -> bool:
    pool = claim.pool
    return (
        sched.taints_ok(id(pool), pool.template.taints, e.group, e.variant)
        and sched.meet(claim.reqs, e.variant.reqs) is not None
    )


def _fill_open(sched: _Scheduler, shapes: list[_Shape], sample: Entry) -> None:
    """Fill the room claims opened earlier this round have left, without raising prices."""
    for claim in list(sched.open):
        if claim.retired or not _compatible(sched, claim, sample):
            continue
        _pack(sched, claim, shapes, claim.cands.prices[claim.idx])


def _grow_open(sched: _Scheduler, shapes: list[_Shape], sample: Entry) -> None:
    """Grow open claims for pods that cost no more there than on a type of their own.

    A claim whose resources are lopsided (all its memory taken, CPU idle) wastes less if
    it grows for a pod that uses the idle part; the growth is worth it when the price
    step is at most what the pod would cost on its own (its shape's value).
    """
    ring = [
        c
        for c in sched.open
        if not c.retired and c.cap_price > c.cands.prices[c.idx] and _compatible(sched, c, sample)
    ]
    if not ring:
        return
    n = len(ring)
    at = 0
    for shape in shapes:
        for e in shape.entries:
            while e.left:
                best: tuple[float, float, ClaimState, Take] | None = None
                seen = 0
                for step in range(min(n, _GROWTH_SCAN)):
                    claim = ring[(at + step) % n]
                    take = sched.probe(claim, e.group, e.variant, None, 1)
                    if take is None:
                        continue
                    _, idx, _, cands = take
                    delta = cands.prices[idx] - claim.cands.prices[claim.idx]
                    if delta > shape.value * 1.000001:
                        continue
                    top, total = cands.types[idx].cap, claim.total
                    skew = abs(
                        (total[0] + shape.req[0]) / top[0] - (total[1] + shape.req[1]) / top[1]
                    )
                    if best is None or (delta, skew) < (best[0], best[1]):
                        best = (delta, skew, claim, take)
                    seen += 1
                    if seen >= _GROWTH_CHOICES:
                        break
                if best is None:
                    break
                sched.commit(best[2], e.group, best[3])
                _assign(sched, best[2], e, 1)
                shape.left -= 1
                at = (ring.index(best[2]) + 1) % n


def _fill_new(sched: _Scheduler, cands: Candidates, shapes: list[_Shape]) -> None:
    """Open claims one at a time, each for the type that packs the most worth per dollar.

    For every type that some remaining shape would pick on its own, a dry run fills one
    node of it the way ``_pack`` will (dearest shapes first); the type whose node holds
    the most worth for its price (the cheapest type holding the result) wins, and the
    claim is opened and filled for real. The same choice is reused while the shapes it
    took still have pods, so a batch of a few shapes costs a few dry runs, not one per
    claim.
    """
    failed: set[int] = set()
    choice: tuple[float, Vec, int] | None = None  # (price cap, capacity, first shape)
    while True:
        live = [i for i, s in enumerate(shapes) if s.left and i not in failed]
        if not live:
            return
        if choice is None or not shapes[choice[2]].left or choice[2] in failed:
            choice = _best_node(cands, shapes, live)
            if choice is None:
                return
        price, target, first = choice
        top = shapes[first]
        e = next(x for x in top.entries if x.left)
        claim, k = sched.open_claim(e.group, e.variant, None, e.left, cap=price, target=target)
        if claim is None:
            failed.add(first)  # no NodePool takes more of it; the fallback explains why
            choice = None
            continue
        _assign(sched, claim, e, k)
        top.left -= k
        before = [s.left for s in shapes]
        _pack(sched, claim, shapes, claim.cap_price)
        if any(s.left == 0 and b > 0 for s, b in zip(shapes, before, strict=True)):
            choice = None  # a shape ran out: the best node may look different now


def _best_node(
    cands: Candidates, shapes: list[_Shape], live: list[int]
) -> tuple[float, Vec, int] | None:
    best: tuple[float, float, Vec, int] | None = None
    seen: set[Vec] = set()
    options = [t for i in live for t in shapes[i].targets]
    for price, target in options:
        if target in seen:
            continue
        seen.add(target)
        total = (0, 0, 0, 0, 0)
        worth, first = 0.0, -1
        for j in live:
            shape = shapes[j]
            k = min(shape.left, room(target, total, shape.req))
            if k > 0:
                total = plus(total, shape.req, k)
                worth += k * shape.value
                if first < 0:
                    first = j
        if first < 0:
            continue
        at = cands.first_fit(total)
        if at < 0:
            continue
        efficiency = worth / cands.prices[at]
        if best is None or efficiency > best[0] * (1 + 1e-9):
            best = (efficiency, price, target, first)
    return None if best is None else (best[1], best[2], best[3])


def _pack(sched: _Scheduler, claim: ClaimState, shapes: list[_Shape], cap: float) -> None:
    """Add pods to ``claim``, dearest shapes first, while a type priced <= ``cap`` holds all."""
    slack = _slack(claim, cap)
    for shape in shapes:
        if not shape.left:
            continue
        r = shape.req
        if (
            r[0] > slack[0]
            or r[1] > slack[1]
            or r[3] > slack[3]
            or r[2] > slack[2]
            or r[4] > slack[4]
        ):
            continue
        for e in shape.entries:
            if not e.left:
                continue
            want = e.left
            k = sched.claim_take(claim, e.group, e.variant, None, want, cap)
            if k:
                _assign(sched, claim, e, k)
                shape.left -= k
                slack = _slack(claim, cap)
            if k < want:
                break  # the claim is full for this shape (entries of a shape are alike)


def _slack(claim: ClaimState, cap: float) -> tuple[int, ...]:
    """Per resource, the most any type priced <= ``cap`` still has free (an upper bound)."""
    tops = claim.cands.frontier(cap) if claim.target is None else (claim.target,)
    total = claim.total
    if not tops:
        return (-1, -1, -1, -1, -1)
    return tuple(max(t[d] for t in tops) - total[d] for d in range(5))


def _assign(sched: _Scheduler, claim: ClaimState, e: Entry, k: int) -> None:
    pods = e.pods[e.done : e.done + k]
    claim.pods.extend(pods)
    e.done += k
    sched.record(e.profile, k, claim.host, claim)
    sched.placed(e.group, k)
