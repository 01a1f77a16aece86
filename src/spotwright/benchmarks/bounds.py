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

__all__ = ["BoundResult", "Shape", "configuration_bound"]

Vec = tuple[int, ...]

_EPS = 1e-9
_NODE_LIMIT = 4000
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
    solver = _ColumnGeneration(usable, kinds)
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


class _ColumnGeneration:
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
                k = _copies(shape.req, cap, 1 if shape.solo else shape.count)
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
            if rc < best_rc * (1 + 1e-12) and rc < -_EPS * price:
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
            sack = _Knapsack(self, y, cap)
            self.u_cache[t] = sack.u
            if sack.root > price * (1 + 1e-7):
                ranked.append((sack.root / price, price, sack))
        ranked.sort(key=lambda r: -r[0])
        added = 0
        finished = True
        for limit in (_NODE_LIMIT, _PROOF_LIMIT):
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
                total += gain * _copies(shape.req, cap, 1 if shape.solo else shape.count)
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
            sack = _Knapsack(self, y, cap)
            if sack.root / price <= worst:
                continue
            value, _ = sack.solve(0.0, _PROOF_LIMIT)
            if not sack.complete:
                value = min(sack.root, sack.surrogate())
            worst = max(worst, value / price)
        return covered / worst if worst > 0 else 0.0


class _Knapsack:
    """Most valuable pattern of pod shapes one node of capacity ``cap`` holds.

    ``root`` is the LP relaxation (``_lagrangian``), an upper bound no pattern beats; its
    dual prices ``u`` bound every node of the branch and bound below, which visits shapes
    by value per unit of what they use at those prices and starts from the LP solution
    rounded down. ``complete`` says whether the search finished within its node limit; if
    not, only ``root`` is a safe upper bound.
    """

    def __init__(self, cg: _ColumnGeneration, y: list[float], cap: Vec) -> None:
        self.m = cg.m
        self.cap = cap
        dims = [d for d in cg.dims if cap[d] > 0]
        self.dims = dims
        chosen: list[tuple[int, int]] = []
        for i, shape in enumerate(cg.shapes):
            if y[i] <= 1e-15:
                continue
            k = _copies(shape.req, cap, 1 if shape.solo else shape.count)
            if k > 0:
                chosen.append((i, k))
        self.complete = True
        self.nodes = 0
        self.relaxed: dict[int, float] = {}
        if not chosen:
            self.root, self.order, self.u = 0.0, [], [0.0] * len(dims)
            return
        self.root, self.u, relaxed = _lagrangian(chosen, y, cg, cap, dims)
        self.relaxed = {i: v for (i, _), v in zip(chosen, relaxed, strict=True)}
        u = self.u
        items = []
        for i, k in chosen:
            cost = sum(cg.shapes[i].req[d] * u[j] for j, d in enumerate(dims))
            items.append((y[i] / cost if cost > 0 else math.inf, i, k, cost))
        items.sort(key=lambda t: -t[0])
        self.items = items
        self.order = [i for _, i, _, _ in items]
        self.y = y
        self.reqs = [cg.shapes[i].req for i in self.order]
        self.solos = [cg.solo_of[i] for i in self.order]

    def surrogate(self, units: int = 4000) -> float:
        """An upper bound from the integer knapsack on one surrogate constraint.

        The resource constraints added up with the LP's dual prices as weights give one
        constraint every real pattern meets; sizes rounded down to ``units`` steps keep
        it so. That 1-D bounded knapsack is solved exactly by dynamic programming, which
        removes the fractional pod the LP relaxation may still count.
        """
        if not self.order:
            return 0.0
        u, dims, cap, y = self.u, self.dims, self.cap, self.y
        capacity = sum(u[j] * cap[d] for j, d in enumerate(dims))
        if capacity <= 0:
            return self.root
        scale = units / capacity
        free = 0.0
        pieces: list[tuple[int, float]] = []  # (size, value) after binary splitting
        for _, i, k, _ in self.items:
            req = self.reqs[self.order.index(i)]
            size = int(sum(u[j] * req[d] for j, d in enumerate(dims)) * scale)
            if size <= 0:
                free += k * y[i]
                continue
            k = min(k, units // size)
            chunk = 1
            while k > 0:
                take = min(chunk, k)
                pieces.append((take * size, take * y[i]))
                k -= take
                chunk *= 2
        best = [0.0] * (units + 1)
        for size, value in pieces:
            for c in range(units, size - 1, -1):
                candidate = best[c - size] + value
                if candidate > best[c]:
                    best[c] = candidate
        return free + best[units]

    def greedy(self) -> tuple[float, list[int] | None]:
        """A good pattern fast: the LP relaxation rounded down, then repeatedly the shape
        worth most per unit of what it uses of the resources still free (scarce resources
        weigh more), half of what fits at a time so the others keep a chance."""
        cap, dims, y = self.cap, self.dims, self.y
        free = list(cap)
        left = {i: k for _, i, k, _ in self.items}
        req_of = dict(zip(self.order, self.reqs, strict=True))
        solo_of = dict(zip(self.order, self.solos, strict=True))
        used: set[str] = set()
        pattern = [0] * self.m
        value = 0.0
        for i, v in self.relaxed.items():
            take = int(v + 1e-9)
            if take <= 0 or (solo_of[i] and solo_of[i] in used):
                continue
            req = req_of[i]
            if any(take * req[d] > free[d] for d in range(len(free))):
                continue
            for d in range(len(free)):
                free[d] -= take * req[d]
            left[i] -= take
            pattern[i] += take
            value += take * y[i]
            if solo_of[i]:
                used.add(solo_of[i])
        while True:
            best_i, best_score, best_fit = -1, 0.0, 0
            for i, k in left.items():
                if not k or (solo_of[i] and solo_of[i] in used):
                    continue
                req = req_of[i]
                fit, cost = k, 0.0
                for d in dims:
                    if req[d]:
                        fit = min(fit, free[d] // req[d])
                        cost += req[d] / free[d] if free[d] > 0 else math.inf
                if fit <= 0:
                    continue
                score = y[i] / cost if cost > 0 else math.inf
                if score > best_score:
                    best_i, best_score, best_fit = i, score, fit
            if best_i < 0:
                break
            take = max(1, best_fit // 2)
            req = req_of[best_i]
            for d in range(len(free)):
                free[d] -= take * req[d]
            left[best_i] -= take
            pattern[best_i] += take
            value += take * y[best_i]
            if solo_of[best_i]:
                used.add(solo_of[best_i])
        return value, (pattern if value > 0 else None)

    def solve(self, target: float, limit: int = _NODE_LIMIT) -> tuple[float, list[int] | None]:
        """Search; stop early once a pattern worth more than ``target`` (if > 0) is found."""
        if not self.order:
            return 0.0, None
        items, reqs, solos, y, dims = self.items, self.reqs, self.solos, self.y, self.dims
        cap, u = self.cap, self.u
        n_items = len(items)
        gains = [
            y[i] - sum(reqs[p][d] * u[j] for j, d in enumerate(dims))
            for p, (_, i, _, _) in enumerate(items)
        ]
        best_value, best_pattern = self.greedy()
        if target and best_value > target:
            return best_value, best_pattern
        nodes = 0
        counts = [0] * n_items

        def descend(start: int, free: list[int], value: float, used: frozenset[str]) -> bool:
            nonlocal best_value, best_pattern, nodes
            nodes += 1
            if nodes > limit:
                self.complete = False
                return True
            if value > best_value:
                best_value = value
                best_pattern = [0] * self.m
                for p, c in enumerate(counts):
                    if c:
                        best_pattern[items[p][1]] = c
                if target and best_value > target:
                    return True
            if start == n_items:
                return False
            rest = [p for p in range(start, n_items) if not (solos[p] and solos[p] in used)]
            lagrange = sum(free[d] * u[j] for j, d in enumerate(dims))
            for p in rest:
                gain = gains[p]
                if gain > 0:
                    lagrange += items[p][2] * gain
            if value + lagrange <= best_value * (1 + 1e-12):
                return False
            req, solo = reqs[start], solos[start]
            most = 0 if solo and solo in used else items[start][2]
            for d in dims:
                if req[d]:
                    most = min(most, free[d] // req[d])
            value_each = y[items[start][1]]
            for c in range(most, -1, -1):
                counts[start] = c
                nfree = [free[d] - c * req[d] for d in range(len(free))]
                nused = used | {solo} if (c and solo) else used
                if descend(start + 1, nfree, value + c * value_each, nused):
                    counts[start] = 0
                    return True
            counts[start] = 0
            return False

        descend(0, list(cap), 0.0, frozenset())
        self.nodes = nodes
        return best_value, best_pattern


def _lagrangian(
    chosen: list[tuple[int, int]], y: list[float], cg: _ColumnGeneration, cap: Vec, dims: list[int]
) -> tuple[float, list[float], list[float]]:
    """The knapsack's LP relaxation: its value, dual prices ``u`` and solution ``x``.

    ``L(u) = cap.u + sum k_i max(0, y_i - a_i.u)`` is an upper bound on the knapsack for
    every ``u >= 0`` (weak duality), and the LP's own duals minimise it. The LP has one
    row per resource (two or three), so a bounded-variable simplex with a tiny basis
    solves it exactly in a few dozen pivots. The value returned is ``L(u)`` evaluated
    afresh, so rounding in the simplex can only make it larger, never invalid.
    """
    m = len(dims)
    n = len(chosen)
    cols = [[float(cg.shapes[i].req[d]) for d in dims] for i, _ in chosen]
    cols += [[1.0 if r == q else 0.0 for r in range(m)] for q in range(m)]  # slacks
    c = [y[i] for i, _ in chosen] + [0.0] * m
    ub = [float(k) for _, k in chosen] + [math.inf] * m
    b = [float(cap[d]) for d in dims]
    basis = list(range(n, n + m))
    x = [0.0] * n + b[:]
    at_upper = [False] * (n + m)
    in_basis = [False] * n + [True] * m
    u = [0.0] * m
    for _ in range(20 * (n + m)):
        binv = _inverse([[cols[j][r] for j in basis] for r in range(m)])
        if binv is None:
            break
        u = [sum(c[basis[r]] * binv[r][k] for r in range(m)) for k in range(m)]
        entering, best, direction = -1, 1e-12, 1
        for j in range(n + m):
            if in_basis[j]:
                continue
            col = cols[j]
            d = c[j]
            for r in range(m):
                d -= u[r] * col[r]
            if at_upper[j]:
                if -d > best:
                    entering, best, direction = j, -d, -1
            elif d > best:
                entering, best, direction = j, d, 1
        if entering < 0:
            break
        col = cols[entering]
        alpha = [sum(binv[r][k] * col[k] for k in range(m)) for r in range(m)]
        step = ub[entering]
        leave = -1
        for r in range(m):
            a = alpha[r] * direction
            j = basis[r]
            if a > 1e-12:
                t = x[j] / a
            elif a < -1e-12 and ub[j] < math.inf:
                t = (ub[j] - x[j]) / -a
            else:
                continue
            if t < step - 1e-12:
                step, leave = t, r
        if step == math.inf:
            break
        for r in range(m):
            x[basis[r]] -= step * alpha[r] * direction
        x[entering] += step * direction
        if leave < 0:
            at_upper[entering] = direction > 0  # bound flip
            continue
        out = basis[leave]
        at_upper[out] = ub[out] < math.inf and x[out] >= ub[out] - 1e-9
        x[out] = ub[out] if at_upper[out] else 0.0
        in_basis[out] = False
        at_upper[entering] = False
        in_basis[entering] = True
        basis[leave] = entering
    u = [max(0.0, v) for v in u]
    value = sum(b[r] * u[r] for r in range(m))
    for j in range(n):
        gain = c[j] - sum(cols[j][r] * u[r] for r in range(m))
        if gain > 0:
            value += ub[j] * gain
    return value, u, x[:n]


def _inverse(a: list[list[float]]) -> list[list[float]] | None:
    """Gauss-Jordan inverse of a small square matrix (None if singular)."""
    size = len(a)
    work = [row[:] + [1.0 if i == j else 0.0 for j in range(size)] for i, row in enumerate(a)]
    for col in range(size):
        pivot = max(range(col, size), key=lambda r: abs(work[r][col]))
        if abs(work[pivot][col]) < 1e-15:
            return None
        work[col], work[pivot] = work[pivot], work[col]
        scale = work[col][col]
        work[col] = [v / scale for v in work[col]]
        for r in range(size):
            if r != col and work[r][col]:
                factor = work[r][col]
                work[r] = [v - factor * w for v, w in zip(work[r], work[col], strict=True)]
    return [row[size:] for row in work]


def _copies(req: Vec, cap: Vec, limit: int) -> int:
    k = limit
    for d in range(len(req)):
        if req[d] > 0:
            k = min(k, cap[d] // req[d])
    return max(0, k)
