"""Pricing one node for the configuration-LP bound: the most valuable pattern it holds.

Column generation (``bounds``) asks, for each instance type and the current dual prices,
which multiset of pod shapes one node of that type can hold that is worth the most. That
is a bounded multi-dimensional knapsack: this module answers it with a branch and bound
whose upper bound is the knapsack's LP relaxation (solved by a small bounded simplex),
so a search cut short still reports a value no pattern beats.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spotwright.benchmarks.bounds import ColumnGeneration

__all__ = ["EPS", "NODE_LIMIT", "Knapsack", "Vec", "copies"]

Vec = tuple[int, ...]

EPS = 1e-9
NODE_LIMIT = 4000


class Knapsack:
    """Most valuable pattern of pod shapes one node of capacity ``cap`` holds.

    ``root`` is the LP relaxation (``_lagrangian``), an upper bound no pattern beats; its
    dual prices ``u`` bound every node of the branch and bound below, which visits shapes
    by value per unit of what they use at those prices and starts from the LP solution
    rounded down. ``complete`` says whether the search finished within its node limit; if
    not, only ``root`` is a safe upper bound.
    """

    def __init__(self, cg: ColumnGeneration, y: list[float], cap: Vec) -> None:
        self.m = cg.m
        self.cap = cap
        dims = [d for d in cg.dims if cap[d] > 0]
        self.dims = dims
        chosen: list[tuple[int, int]] = []
        for i, shape in enumerate(cg.shapes):
            if y[i] <= 1e-15:
                continue
            k = copies(shape.req, cap, 1 if shape.solo else shape.count)
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

    def solve(self, target: float, limit: int = NODE_LIMIT) -> tuple[float, list[int] | None]:
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
    chosen: list[tuple[int, int]], y: list[float], cg: ColumnGeneration, cap: Vec, dims: list[int]
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


def copies(req: Vec, cap: Vec, limit: int) -> int:
    k = limit
    for d in range(len(req)):
        if req[d] > 0:
            k = min(k, cap[d] // req[d])
    return max(0, k)
