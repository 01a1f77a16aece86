"""The packing pass: pods without hostname rules placed together, bin by bin.

Pods without topology terms (and, via ``zonal.py``, pods whose rules only pick a zone)
do not need to be placed one group at a time in queue order, and placing them that way
is what makes packings expensive: the first claims fill with whatever shape happens to
sort first (all the CPU-heavy pods, say) and strand the other resource. So once every
pod with hostname rules has a place, the others that existing capacity could not take
are packed per class (same requirements and tolerations, hence the same NodePools and
instance types):

1. the claims opened earlier this round are completed (``_fill_open``): each is filled
   at its own price or grown to one of the next few dearer types, whichever choice
   leaves the least money unused. This matters most for a pod that must be alone on its
   node: the smallest type that holds a memory-heavy one has CPU left that no pod can
   use without memory, and one size up it holds CPU-heavy pods worth more than the step;
2. then new claims are opened one at a time. The dearest remaining shape opens the
   claim, with a price cap of the type that holds that shape most cheaply per pod; the
   claim may become any candidate type up to that cap, and the other shapes, dearest
   first, fill what is left before the next claim opens.

A shape's worth is what one such pod costs at best on its own: the lowest price per pod
over the candidate types, counting how many copies fit (``Candidates.per_pod``). Dear pods
thus pick node types that suit them, and cheap pods fill the gaps, which is the structure
of near-optimal packings on real catalogs (a 1.5-vCPU pod alone on a small burstable
node with a few 100m pods beside it; memory-heavy pods together on a memory-rich type).
Completing a claim counts instead a pod's CPU and memory at half the best price of each
(``Candidates.unit_rates``), so a fill that leaves one resource idle is worth less than
one that uses both. Each claim is priced at the end by the cheapest type that holds its
final pods.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spotwright.model.objects import Pod
from spotwright.scheduling.candidates import Candidates, Vec
from spotwright.scheduling.state import ClaimState, Profile, plus, room
from spotwright.scheduling.topology import Counter

if TYPE_CHECKING:
    from spotwright.scheduling.packing import _Scheduler
    from spotwright.scheduling.queue import Group, Variant

__all__ = ["Entry", "fill_deferred"]

_GROWTH_CHOICES = 8
_GROWTH_SCAN = 64
#: Prices (the claim's own and the next dearer ones) a claim is tried at when completed.
_COMPLETION_STEPS = 3
_EMPTY: Vec = (0, 0, 0, 0, 0)


@dataclass(eq=False, slots=True)
class Entry:
    """A group's pods waiting for the packing pass; ``done`` of them are placed."""

    group: Group
    variant: Variant
    profile: Profile | None
    pods: list[Pod]
    done: int = 0
    #: For pods whose zone was chosen ahead (``zonal.py``): the counters bumped, the zone.
    zonal: tuple[list[Counter], str] | None = None

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
    #: What the pod's CPU and memory cost at half the cheapest price of each: the worth
    #: of its share of a node, which a node only recovers when both are used.
    share: float = 0.0
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
        cands = pool.catalog.candidates(reqs)
        if cands.types:
            return cands
    return None


def _shapes(cands: Candidates, members: list[Entry]) -> list[_Shape]:
    by_req: dict[Vec, _Shape] = {}
    for e in members:
        shape = by_req.get(e.group.req)
        if shape is None:
            value, targets = cands.per_pod(e.group.req)
            rate_cpu, rate_mem = cands.unit_rates()
            share = rate_cpu * e.group.req[0] + rate_mem * e.group.req[1]
            shape = by_req[e.group.req] = _Shape(e.group.req, value, targets, share=share)
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
    """Complete the claims opened earlier this round: fill their room, or grow them.

    A claim whose room is all in one resource (a memory-heavy pod alone on the smallest
    type that holds it leaves CPU that no pod can use without memory) is worth a larger
    type when the pods that then fit are worth more than the price step. Each claim takes
    the choice, among its own price and the next few, that leaves the least money unused.
    """
    for claim in list(sched.open):
        if not _compatible(sched, claim, sample):
            continue
        choice = _completion_cap(claim, shapes)
        if choice is not None:
            _pack(sched, claim, shapes, *choice)


def _fill_new(sched: _Scheduler, cands: Candidates, shapes: list[_Shape]) -> None:
    """Open claims one at a time, each for the type that packs the most worth per dollar.

    For every type that some remaining shape would pick on its own, a dry run fills one
    node of it the way ``_pack`` will (``_plan``); the type whose node holds the most
    worth for its price (the cheapest type holding the result) wins, and the claim is
    opened and filled for real. The same choice is reused while a node of it still fills
    exactly as when it was chosen, so a batch of a few shapes costs a few dry runs, not
    one per claim; once a shape runs short the choice is made again, or the last type
    chosen (a memory-rich node that suited the last memory-heavy pod, say) would go on
    taking one small pod each.
    """
    failed: set[int] = set()
    choice: tuple[float, Vec] | None = None  # (price cap, capacity)
    chosen: list[tuple[int, int]] = []  # how a node of that capacity filled when chosen
    while True:
        live = [i for i, s in enumerate(shapes) if s.left and i not in failed]
        if not live:
            return
        steps: list[tuple[int, int]] = []
        if choice is not None:
            steps = _plan(choice[1], _EMPTY, shapes, live)[3]
        if choice is None or steps != chosen:
            # the node the choice was made for no longer fills the same way (a shape ran
            # short): another type may now hold the remaining pods better
            choice = _best_node(cands, shapes, live)
            if choice is None:
                return
            steps = chosen = _plan(choice[1], _EMPTY, shapes, live)[3]
        if choice is None or not steps:
            return
        price, target = choice
        first, want = steps[0]
        top = shapes[first]
        e = next(x for x in top.entries if x.left)
        claim, k = sched.open_claim(
            e.group, e.variant, None, min(want, e.left), cap=price, target=target
        )
        if claim is None:
            failed.add(first)  # no NodePool takes more of it; the fallback explains why
            choice = None
            continue
        _assign(sched, claim, e, k)
        top.left -= k
        _pack(sched, claim, shapes, claim.cap_price, target)


def _best_node(
    cands: Candidates, shapes: list[_Shape], live: list[int]
) -> tuple[float, Vec] | None:
    best: tuple[float, float, Vec] | None = None
    seen: set[Vec] = set()
    options = [t for i in live for t in shapes[i].targets]
    for price, target in options:
        if target in seen:
            continue
        seen.add(target)
        total, worth, _, steps = _plan(target, _EMPTY, shapes, live)
        if not steps:
            continue
        at = cands.first_fit(total)
        if at < 0:
            continue
        efficiency = worth / cands.prices[at]
        if best is None or efficiency > best[0] * (1 + 1e-9):
            best = (efficiency, price, target)
    return None if best is None else (best[1], best[2])


def _plan(
    top: Vec, total: Vec, shapes: list[_Shape], live: list[int] | None = None
) -> tuple[Vec, float, float, list[tuple[int, int]]]:
    """How to fill a node of capacity ``top`` holding ``total``.

    Returns the new total, the pods' worth at their lowest price per pod and at the unit
    rates (``_Shape.share``), and the steps as (shape index, count).

    Dearest shape first, as many as fit, except that while the node uses more of one of
    CPU and memory than of the other, a shape that uses more of the lagging one goes
    first, and only until the two are even: filled dearest first alone, a node ends full
    in memory (memory-heavy pods are the dearest) with its CPU idle.
    """
    order = [j for j in (range(len(shapes)) if live is None else live) if shapes[j].left]
    left = {j: shapes[j].left for j in order}
    steps: list[tuple[int, int]] = []
    worth = value = 0.0
    c_top, m_top = max(top[0], 1), max(top[1], 1)
    while order:
        lag = total[0] / c_top - total[1] / m_top  # < 0: CPU lags, > 0: memory lags
        pick, pick_fit, fallback, fallback_fit = -1, 0, -1, 0
        for j in list(order):
            req = shapes[j].req
            fit = min(left[j], room(top, total, req))
            if fit <= 0:
                order.remove(j)
                continue
            tilt = req[0] / c_top - req[1] / m_top
            if _evens(req, lag, c_top, m_top):
                pick, pick_fit = j, min(fit, max(1, int(-lag / tilt) + 1))
                break
            if fallback < 0:
                fallback, fallback_fit = j, fit
        if pick < 0:
            if fallback < 0:
                break
            req = shapes[fallback].req
            after = lag + req[0] / c_top - req[1] / m_top
            if after != 0 and any(_evens(shapes[j].req, after, c_top, m_top) for j in order):
                pick, pick_fit = fallback, 1  # one, then a shape that evens it
            else:
                pick, pick_fit = fallback, fallback_fit
        steps.append((pick, pick_fit))
        total = plus(total, shapes[pick].req, pick_fit)
        worth += pick_fit * shapes[pick].share
        value += pick_fit * shapes[pick].value
        left[pick] -= pick_fit
        if not left[pick]:
            order.remove(pick)
    return total, value, worth, steps


def _evens(req: Vec, lag: float, c_top: int, m_top: int) -> bool:
    """Does a pod of ``req`` use more of the resource the node lags in (``_plan``)?"""
    tilt = req[0] / c_top - req[1] / m_top
    return (lag < 0 < tilt) or (lag > 0 > tilt)


def _pack(sched: _Scheduler, claim: ClaimState, shapes: list[_Shape], cap: float, top: Vec) -> None:
    """Add pods to ``claim`` as ``_plan`` fills ``top``, under the price cap ``cap``."""
    _, _, _, steps = _plan(top, claim.total, shapes)
    for j, want in steps:
        shape = shapes[j]
        for e in shape.entries:
            if want <= 0:
                break
            if not e.left:
                continue
            k = sched.claim_take(claim, e.group, e.variant, None, min(want, e.left), cap)
            if k:
                _assign(sched, claim, e, k)
                shape.left -= k
                want -= k
            else:
                break  # the claim cannot take this shape (entries of a shape are alike)


def _completion_cap(claim: ClaimState, shapes: list[_Shape]) -> tuple[float, Vec] | None:
    """The price cap and capacity to fill ``claim`` to: the dry fill that gains most.

    Gain is the worth of the pods a fill takes (their CPU and memory at the unit rates,
    so a fill that leaves one resource idle gains less) less what the claim's price
    rises by; None if no choice gains anything.
    """
    cands, total = claim.cands, claim.total
    now = cands.prices[claim.idx]
    best_gain, best = 1e-12, None
    caps: list[float] = [now]
    if claim.target is None:
        for i in range(claim.idx + 1, len(cands.types)):
            price = cands.prices[i]
            if price > now * 2 + 1e-12 or len(caps) >= _COMPLETION_STEPS:
                break
            if price > caps[-1] * (1 + 1e-9):
                caps.append(price)
    for cap in caps:
        tops = cands.frontier(cap) if claim.target is None else (claim.target,)
        for top in tops:
            fill, _, worth, steps = _plan(top, total, shapes)
            if not steps:
                continue
            at = cands.first_fit(fill, claim.idx, cap)
            if at < 0:
                continue
            gain = worth - (cands.prices[at] - now)
            if gain > best_gain:
                best_gain, best = gain, (cands.prices[at], top)
    return best


def _assign(sched: _Scheduler, claim: ClaimState, e: Entry, k: int) -> None:
    pods = e.pods[e.done : e.done + k]
    claim.pods.extend(pods)
    e.done += k
    sched.record(e.profile, k, claim.host, claim)
    sched.placed(e.group, k)
