"""Books on disruption: how each interrupted node's pods moved, and each budget's floor.

The interruption targets are about what a user sees between a signal and the end of the
move: whether the replacement capacity was there before the first pod left (then the only
gap is each pod's own start-up), how long after the notice every pod that left was ready
elsewhere, and whether any workload dipped below its PodDisruptionBudget. None of that is
visible in per-pod figures alone, so these books follow each interrupted node from its
first signal (a rebalance recommendation or the notice) through the replacement pods of
everything that left it, and each budget's ready pods against its floor over time.

A budget is only held to its floor once every replica of its workload has been ready: a
workload that is starting, or that was just scaled up, is below its floor without anything
having been disrupted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from spotwright.model.objects import Pod, PodDisruptionBudget

__all__ = ["BudgetBooks", "InterruptedNode", "InterruptedNodes", "budget_floor"]

#: A replacement bound within this long of its creation did not wait for capacity.
_NO_WAIT = 1e-6


def budget_floor(pdb: PodDisruptionBudget, expected: int) -> int:
    """Ready pods the budget asks for out of ``expected``; percentages round up, as the
    disruption controller rounds them (for minAvailable and maxUnavailable alike)."""
    if pdb.min_available is not None:
        return _scaled(pdb.min_available, expected)
    return max(0, expected - _scaled(pdb.max_unavailable or 0, expected))


def _scaled(value: int | str, total: int) -> int:
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(total * int(value[:-1]) / 100)
    return int(value)


@dataclass
class InterruptedNode:
    """One node from its first interruption signal until its pods run elsewhere."""

    node: str
    rebalance_at: float | None = None
    notice_at: float | None = None
    #: When the first pod left it (evicted, deleted at the deadline, or lost with it).
    first_out_at: float | None = None
    #: Latest ready time of the nodes its pods' replacements were bound to.
    replacement_ready_at: float | None = None
    #: When the last replacement turned ready.
    last_ready_at: float | None = None
    #: Pods that left it and were recreated elsewhere.
    moved: int = 0
    #: Replacements that had to wait for a node (not bound the moment they were created).
    waited: int = 0
    longest_wait: float = 0.0
    #: Replacements not ready yet, by pod uid.
    waiting: set[str] = field(default_factory=set)
    #: Pods still on the node at the end of the run (set by ``InterruptedNodes.close``).
    stranded: bool = False

    @property
    def signal_at(self) -> float:
        return min(t for t in (self.rebalance_at, self.notice_at) if t is not None)

    @property
    def recovered(self) -> bool:
        """Every pod that left runs elsewhere, and none is left to move."""
        return self.moved > 0 and not self.waiting and not self.stranded

    @property
    def replaced_first(self) -> bool:
        """Every node its pods moved to was ready before the first of them left."""
        return (
            self.recovered
            and self.first_out_at is not None
            and self.replacement_ready_at is not None
            and self.replacement_ready_at <= self.first_out_at
        )

    def recovery_seconds(self) -> float | None:
        """From the notice until every pod that left was ready elsewhere (0 when that was
        done before the notice came); None without a notice or when never recovered."""
        if self.notice_at is None or not self.recovered or self.last_ready_at is None:
            return None
        return max(0.0, self.last_ready_at - self.notice_at)


class InterruptedNodes:
    """Follows interrupted nodes and the replacements of the pods that leave them."""

    def __init__(self) -> None:
        self.nodes: dict[str, InterruptedNode] = {}
        #: Replacement pods not yet ready, to the node their predecessor left.
        self._moving: dict[str, InterruptedNode] = {}
        self._created: dict[str, float] = {}
        #: When each node became ready, for where a replacement landed.
        self._node_ready: dict[str, float] = {}

    def signal(self, node: str, now: float, *, notice: bool) -> None:
        books = self.nodes.get(node)
        if books is None:
            books = self.nodes[node] = InterruptedNode(node)
        if notice and books.notice_at is None:
            books.notice_at = now
        elif not notice and books.rebalance_at is None:
            books.rebalance_at = now

    def node_ready(self, node: str, now: float) -> None:
        self._node_ready.setdefault(node, now)

    def pod_created(self, pod: Pod, replaces: Pod | None, now: float) -> None:
        if replaces is None or replaces.daemon:
            return
        books = self._moving.pop(replaces.uid, None)
        if books is not None:
            books.waiting.discard(replaces.uid)  # its own replacement carries on
        else:
            books = self.nodes.get(replaces.node_name or "")
            if books is None:
                return
            books.moved += 1
            if books.first_out_at is None:
                books.first_out_at = now
        books.waiting.add(pod.uid)
        self._moving[pod.uid] = books
        self._created[pod.uid] = now

    def pod_bound(self, pod: Pod, now: float) -> None:
        books = self._moving.get(pod.uid)
        created = self._created.pop(pod.uid, None)
        if books is None or created is None:
            return
        wait = now - created
        if wait > _NO_WAIT:
            books.waited += 1
            books.longest_wait = max(books.longest_wait, wait)
        ready = self._node_ready.get(pod.node_name or "", 0.0)
        if books.replacement_ready_at is None or ready > books.replacement_ready_at:
            books.replacement_ready_at = ready

    def pod_ready(self, pod: Pod, now: float) -> None:
        books = self._moving.pop(pod.uid, None)
        if books is not None:
            books.waiting.discard(pod.uid)
            books.last_ready_at = now

    def close(self, still_has_pods: dict[str, bool]) -> None:
        """Mark nodes that still held pods to move when the run ended."""
        for name, books in self.nodes.items():
            books.stranded = still_has_pods.get(name, False)


@dataclass
class _Budget:
    pdb: PodDisruptionBudget
    owners: set[str] = field(default_factory=set)
    ready: int = 0
    expected: int = 0
    floor: int = 0
    #: Held to its floor: every replica has been ready since it started or was scaled up
    #: past what it had ready.
    armed: bool = False
    below_seconds: float = 0.0
    drops: int = 0
    lowest_headroom: int | None = None
    since: float | None = None


class BudgetBooks:
    """Each PodDisruptionBudget's ready pods against its floor, over time."""

    def __init__(self) -> None:
        self._budgets: list[_Budget] = []
        self._desired: dict[str, int] = {}

    def track(self, pdb: PodDisruptionBudget, now: float) -> None:
        self._budgets.append(_Budget(pdb, since=now))

    def _matching(self, pod: Pod) -> list[_Budget]:
        return [
            b
            for b in self._budgets
            if b.pdb.namespace == pod.namespace
            and all(pod.labels.get(k) == v for k, v in b.pdb.selector.items())
        ]

    def _advance(self, budget: _Budget, now: float) -> None:
        below = budget.armed and budget.ready < budget.floor
        if below and budget.since is not None and now > budget.since:
            budget.below_seconds += now - budget.since
        budget.since = now

    def _settle(self, budget: _Budget) -> None:
        headroom = budget.ready - budget.floor
        if not budget.armed:
            if budget.floor > 0 and budget.ready >= budget.expected:
                budget.armed = True
            else:
                return
        if budget.lowest_headroom is None or headroom < budget.lowest_headroom:
            budget.lowest_headroom = headroom

    def _refloor(self, budget: _Budget) -> None:
        budget.expected = sum(self._desired.get(o, 0) for o in budget.owners)
        budget.floor = budget_floor(budget.pdb, budget.expected)

    def desired_changed(self, deployment: str, replicas: int, now: float) -> None:
        self._desired[deployment] = replicas
        for budget in self._budgets:
            if deployment not in budget.owners:
                continue
            self._advance(budget, now)
            self._refloor(budget)
            if budget.ready < budget.floor:
                budget.armed = False  # a scale-up, not a disruption
            self._settle(budget)

    def pod_created(self, pod: Pod, now: float) -> None:
        if not pod.owner:
            return
        for budget in self._matching(pod):
            if pod.owner not in budget.owners:
                self._advance(budget, now)
                budget.owners.add(pod.owner)
                self._refloor(budget)
                budget.armed = budget.armed and budget.ready >= budget.floor
                self._settle(budget)

    def ready_changed(self, pod: Pod, delta: int, now: float) -> None:
        for budget in self._matching(pod):
            self._advance(budget, now)
            was_below = budget.armed and budget.ready < budget.floor
            budget.ready = max(0, budget.ready + delta)
            if budget.armed and budget.ready < budget.floor and not was_below:
                budget.drops += 1
            self._settle(budget)

    def close(self, now: float) -> None:
        for budget in self._budgets:
            self._advance(budget, now)

    def summary(self) -> dict[str, object]:
        """The ``disruption_budgets`` part of the simulator's summary."""
        by_name: dict[str, dict[str, object]] = {}
        for budget in sorted(self._budgets, key=lambda b: (b.pdb.namespace, b.pdb.name)):
            key = (
                budget.pdb.name
                if budget.pdb.namespace == "default"
                else f"{budget.pdb.namespace}/{budget.pdb.name}"
            )
            by_name[key] = {
                "below_seconds": round(budget.below_seconds, 3),
                "drops": budget.drops,
                "lowest_headroom": budget.lowest_headroom,
            }
        headrooms = [b.lowest_headroom for b in self._budgets if b.lowest_headroom is not None]
        return {
            "below_seconds": round(sum(b.below_seconds for b in self._budgets), 3),
            "drops": sum(b.drops for b in self._budgets),
            "lowest_headroom": min(headrooms) if headrooms else None,
            "by_budget": by_name,
        }
