"""A lower bound on what any packing of a set of pods must cost: the configuration LP.

The benchmark compares the scheduler's cost with this figure, so it has to be honest (no
packing can beat it) and tight (close to what the best packing costs), or the comparison
says nothing. Two simpler bounds fail one way or the other:

* "total vCPU x cheapest $/vCPU, total GiB x cheapest $/GiB, the larger" is honest but
  loose: it lets every pod use the type that is cheapest for one resource, and ignores
  that pods are whole (three 500m pods on a 1.93-vCPU type leave 0.43 vCPU that nobody
  can use);
* charging each pod "price x the larger of its CPU and memory shares" of its best type
  is not a bound at all: a CPU-heavy and a memory-heavy pod sharing one node would be
  charged almost two nodes.

The configuration LP is the standard tight relaxation of bin packing. Its variables are
how many nodes of each *pattern* (an instance type and a multiset of pod shapes that
fits it) to buy, fractionally; the only relaxation is that a pattern may be bought 2.4
times. Column generation solves it: a small simplex over the patterns found so far, and
for each instance type a knapsack that finds the pattern most worth adding under the
current dual prices ``y`` (what one pod of each shape is worth).

Whatever the solver reaches, the printed figure is valid by construction (Farley's
bound): for any ``y >= 0``, every node of type ``t`` holds pods worth at most ``K_t(y)``,
an upper bound on the knapsack, so covering all pods costs at least
``sum(n_s * y_s) / max_t(K_t(y) / price_t)``. Knapsacks that hit their search limit
report their relaxation's bound instead of the best pattern found, which keeps it valid.

Shapes are pod resource vectors; pods that must not share a node (required hostname
anti-affinity among themselves) add one more dimension of capacity one. Zone and other
topology rules are left out, which can only lower the bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from spotwright.benchmarks._knapsack import EPS, NODE_LIMIT, Knapsack, Vec, copies

__all__ = ["BoundResult", "Shape", "configuration_bound"]

_PROOF_LIMIT = 100_000
#: Work column generation may spend in all (branch-and-bound nodes, knapsack LPs); past
#: it, the bound is Farley's for the duals reached (still valid, only lower).
_WORK_BUDGET = 400_000
_LP_BUDGET = 3_000
_MAX_ROUNDS = 2000
_COLUMNS_PER_ROUND = 8


@dataclass(frozen=True, slots=True)
class Shape:
    """Pods alike for packing: their resource vector, how many, and their solo group."""

    req: Vec
    count: int
    #: Pods with the same non-empty ``solo`` may not share a node.
    solo: str = ""


@dataclass(frozen=True, slots=True)
class BoundResult:
    value: float
    #: The LP optimum when column generation converged (``value`` is then within a hair
    #: of it); None if it stopped early and ``value`` is only Farley's bound.
    lp: float | None
    patterns: int


def configuration_bound(shapes: Sequence[Shape], types: Sequence[tuple[float, Vec]]) -> BoundResult:
    """Lower bound on packing ``shapes`` into nodes of ``types`` ((price, capacity))."""
    usable = [s for s in shapes if s.count > 0 and _fits_any(s.req, types)]
    if not usable:
        return BoundResult(0.0, 0.0, 0)
    kinds = _prune(types)
    solver = ColumnGeneration(usable, kinds)
    return solver.run()


def _fits_any(req: Vec, types: Sequence[tuple[float, Vec]]) -> bool:
    return any(all(req[d] <= cap[d] for d in range(len(req))) for _, cap in types)


def _prune(types: Sequence[tuple[float, Vec]]) -> list[tuple[float, Vec]]:
    """Drop types another type beats: no dearer and at least as big in every resource."""
    ordered = sorted(types, key=lambda t: (t[0], [-c for c in t[1]]))
    kept: list[tuple[float, Vec]] = []
    for price, cap in ordered:
        if price <= 0:
            continue
        if any(all(k[d] >= cap[d] for d in range(len(cap))) for _, k in kept):
            continue
        kept.append((price, cap))
    return kept


class ColumnGeneration:
    """Revised simplex on the covering LP, columns priced by per-type knapsacks."""

    def __init__(self, shapes: list[Shape], types: list[tuple[float, Vec]]) -> None:
        self.shapes = shapes
        self.types = types
        self.m = len(shapes)
        self.n = [float(s.count) for s in shapes]
        self.solo_of = [s.solo for s in shapes]
        self.dims = [d for d in range(len(shapes[0].req)) if any(s.req[d] for s in shapes)]
        self.u_cache: dict[int, list[float]] = {}
        self.proven = False
        # start from one column per shape: its best type holding as many as fit
        self.columns: list[tuple[float, list[int]]] = []
        basis: list[int] = []
        for i, shape in enumerate(shapes):
            best: tuple[float, float, int] | None = None
            for price, cap in types:
                k = copies(shape.req, cap, 1 if shape.solo else shape.count)
                if k and (best is None or price / k < best[0]):
                    best = (price / k, price, k)
            assert best is not None  # every shape fits some type (filtered above)
            column = [0] * self.m
            column[i] = best[2]
            basis.append(self._add(best[1], column))
        self.basis = basis
        # B is diagonal at the start
        self.binv = [
            [1.0 / self.columns[basis[i]][1][i] if i == j else 0.0 for j in range(self.m)]
            for i in range(self.m)
        ]
        self.x = [self.n[i] / self.columns[basis[i]][1][i] for i in range(self.m)]

    def _add(self, price: float, column: list[int]) -> int:
        self.columns.append((price, column))
        return len(self.columns) - 1

    def duals(self) -> list[float]:
        cb = [self.columns[j][0] for j in self.basis]
        return [sum(cb[i] * self.binv[i][k] for i in range(self.m)) for k in range(self.m)]

    def run(self) -> BoundResult:
        converged = False
        self.budget = _WORK_BUDGET
        self.solves = _LP_BUDGET
        y = self.duals()
        for _ in range(_MAX_ROUNDS):
            entering = self._price_pool(y)
            if entering is None:
                found = self._generate(y)
                if not found:
                    converged = self.proven
                    break
                entering = self._price_pool(y)
                if entering is None:  # numerically marginal columns: stop here
                    break
            if not self._pivot(entering):
                break
            y = self.duals()
        y = [max(0.0, v) for v in y]
        value = self._farley(y)
        lp = sum(self.columns[j][0] * x for j, x in zip(self.basis, self.x, strict=True))
        if converged:
            # proven optimal: the LP value is the bound (less a hair for rounding)
            value = max(value, lp * (1 - 1e-6))
        return BoundResult(value, lp if converged else None, len(self.columns))

    # -- simplex --------------------------------------------------------------------------
    def _price_pool(self, y: list[float]) -> int | None:
        best, best_rc = None, -1e-9
        in_basis = set(self.basis)
        for j, (price, column) in enumerate(self.columns):
            if j in in_basis:
                continue
            rc = price - sum(y[i] * a for i, a in enumerate(column) if a)
            if rc < best_rc * (1 + 1e-12) and rc < -EPS * price:
                best, best_rc = j, rc
        return best

    def _pivot(self, j: int) -> bool:
        column = self.columns[j][1]
        d = [
            sum(self.binv[i][k] * column[k] for k in range(self.m) if column[k])
            for i in range(self.m)
        ]
        leave, ratio = -1, math.inf
        for i in range(self.m):
            if d[i] > 1e-12:
                r = self.x[i] / d[i]
                if r < ratio - 1e-15 or (
                    abs(r - ratio) <= 1e-15 and self.basis[i] < self.basis[leave]
                ):
                    leave, ratio = i, r
        if leave < 0:  # unbounded cannot happen for a covering LP with positive costs
            return False
        pivot = d[leave]
        row = [v / pivot for v in self.binv[leave]]
        for i in range(self.m):
            if i == leave:
                continue
            factor = d[i]
            if factor:
                bi = self.binv[i]
                for k in range(self.m):
                    bi[k] -= factor * row[k]
                self.x[i] -= factor * ratio
                if self.x[i] < 0:
                    self.x[i] = 0.0
        self.binv[leave] = row
        self.x[leave] = ratio
        self.basis[leave] = j
        return True

    # -- pricing: one knapsack per type -----------------------------------------------------
    def _generate(self, y: list[float]) -> bool:
        """Add the best pattern of each type that improves on the current duals.

        Sets ``proven`` when it adds none and has shown, for every type, that none
        exists (a finished search or a relaxation below the price), which makes the
        current LP value the configuration LP's optimum.
        """
        self.proven = False
        ranked = []
        for t, (price, cap) in enumerate(self.types):
            if self._quick(t, y) <= price * (1 + 1e-7):
                continue  # the previous duals of this type already prove nothing is better
            if self.solves <= 0:
                return False
            self.solves -= 1
            sack = Knapsack(self, y, cap)
            self.u_cache[t] = sack.u
            if sack.root > price * (1 + 1e-7):
                ranked.append((sack.root / price, price, sack))
        ranked.sort(key=lambda r: -r[0])
        added = 0
        finished = True
        for limit in (NODE_LIMIT, _PROOF_LIMIT):
            finished = True
            for _, price, sack in ranked:
                if self.budget <= 0:
                    return added > 0
                sack.complete = True
                value, pattern = sack.solve(price * (1 + 1e-7), min(limit, self.budget))
                self.budget -= sack.nodes
                if not sack.complete and limit == _PROOF_LIMIT:
                    # the search ran out; the surrogate bound may still prove it
                    sack.complete = sack.surrogate() <= price * (1 + 1e-7)
                finished = finished and sack.complete
                if pattern is not None and value > price * (1 + 1e-7):
                    self._add(price, pattern)
                    added += 1
                    if added >= _COLUMNS_PER_ROUND:
                        return True
            if added:
                return True
        self.proven = finished and self.budget > 0
        return False

    def _quick(self, t: int, y: list[float]) -> float:
        """An upper bound on type ``t``'s knapsack from the duals last computed for it."""
        u = self.u_cache.get(t)
        cap = self.types[t][1]
        if u is None:
            return math.inf
        dims = [d for d in self.dims if cap[d] > 0]
        total = sum(cap[d] * u[j] for j, d in enumerate(dims))
        for i, shape in enumerate(self.shapes):
            gain = y[i] - sum(shape.req[d] * u[j] for j, d in enumerate(dims))
            if gain > 0:
                total += gain * copies(shape.req, cap, 1 if shape.solo else shape.count)
        return total

    def _farley(self, y: list[float]) -> float:
        covered = sum(n * v for n, v in zip(self.n, y, strict=True))
        if covered <= 0:
            return 0.0
        # Types in order of a cheap upper bound (the last duals seen for each); once
        # that bound is below the worst ratio found, no later type can raise it.
        quick = sorted(
            ((self._quick(t, y) / price, t) for t, (price, _) in enumerate(self.types)),
            reverse=True,
        )
        worst = 0.0
        for ratio, t in quick:
            if ratio <= worst:
                break
            price, cap = self.types[t]
            sack = Knapsack(self, y, cap)
            if sack.root / price <= worst:
                continue
            value, _ = sack.solve(0.0, _PROOF_LIMIT)
            if not sack.complete:
                value = min(sack.root, sack.surrogate())
            worst = max(worst, value / price)
        return covered / worst if worst > 0 else 0.0
