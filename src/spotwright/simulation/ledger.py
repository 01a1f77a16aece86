"""The simulator's books: what a user wants to know about a run, measured as it happens.

The ledger watches the in-memory cluster through its observer hooks: time-weighted ready
replicas over desired replicas (availability), how long pods waited to be scheduled, how long
the pods of an interrupted node took to be ready elsewhere, and which pods were lost (killed
without a completed graceful eviction). For node groups it keeps each group's nodes by
capacity type and how long the group had at least its target split up. How each
interrupted node's pods moved, and how close each PodDisruptionBudget came to its floor,
are kept in ``simulation.disruption``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from spotwright.model.objects import Pod, PodDisruptionBudget
from spotwright.simulation.disruption import BudgetBooks, InterruptedNodes

__all__ = ["GroupBooks", "Ledger", "percentile"]


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class GroupBooks:
    """One node group's nodes by capacity type, against the split it should have."""

    target: dict[str, int]
    nodes: dict[str, int] = field(default_factory=dict)
    launched: dict[str, int] = field(default_factory=dict)
    at_target_seconds: float = 0.0
    seconds: float = 0.0
    since: float | None = None

    def at_target(self) -> bool:
        return all(self.nodes.get(ct, 0) >= want for ct, want in self.target.items())

    def advance(self, now: float) -> None:
        if self.since is not None and now > self.since:
            self.seconds += now - self.since
            if self.at_target():
                self.at_target_seconds += now - self.since
        self.since = now

    def at_target_pct(self) -> float:
        return 100.0 * self.at_target_seconds / self.seconds if self.seconds > 0 else 0.0


class Ledger:
    def __init__(self) -> None:
        self._t: float | None = None
        self._ready: dict[str, int] = {}
        self._desired: dict[str, int] = {}
        self._ready_area = 0.0
        self._desired_area = 0.0
        self._created: dict[str, float] = {}
        self.max_pending = 0.0
        #: Notice time for pods whose node got an interruption notice, by pod uid.
        self._origin: dict[str, float] = {}
        self._noticed_nodes: dict[str, float] = {}
        self.recovery: list[float] = []
        self.evicted = 0
        self.lost = 0
        self.groups: dict[str, GroupBooks] = {}
        self.interrupted = InterruptedNodes()
        self.budgets = BudgetBooks()

    # -- availability -------------------------------------------------------------
    def _advance(self, now: float) -> None:
        if self._t is not None and now > self._t:
            dt = now - self._t
            self._ready_area += dt * sum(
                min(self._ready.get(d, 0), want) for d, want in self._desired.items()
            )
            self._desired_area += dt * sum(self._desired.values())
        self._t = now

    def availability_pct(self, now: float) -> float:
        self._advance(now)
        if self._desired_area <= 0:
            return 100.0
        return 100.0 * self._ready_area / self._desired_area

    # -- node groups -------------------------------------------------------------------
    def track_group(self, name: str, target: dict[str, int], now: float) -> None:
        self.groups[name] = GroupBooks(target=dict(target), since=now)

    def group_nodes(self, name: str, nodes: dict[str, int], now: float) -> None:
        """The group now has ``nodes`` up, by capacity type."""
        books = self.groups.get(name)
        if books is not None:
            books.advance(now)
            books.nodes = dict(nodes)

    def group_launched(self, name: str, capacity_type: str) -> None:
        books = self.groups.get(name)
        if books is not None:
            books.launched[capacity_type] = books.launched.get(capacity_type, 0) + 1

    # -- interruption bookkeeping -----------------------------------------------------
    def notice(self, node_name: str, now: float) -> None:
        self._noticed_nodes.setdefault(node_name, now)
        self.interrupted.signal(node_name, now, notice=True)

    def rebalance(self, node_name: str, now: float) -> None:
        """A rebalance recommendation for the node: its move may start before any notice."""
        self.interrupted.signal(node_name, now, notice=False)

    def node_ready(self, node_name: str, now: float) -> None:
        self.interrupted.node_ready(node_name, now)

    def track_pdb(self, pdb: PodDisruptionBudget, now: float) -> None:
        self.budgets.track(pdb, now)

    # -- observer hooks (called by the memory cluster) -----------------------------------
    def desired_changed(self, deployment: str, replicas: int, now: float) -> None:
        self._advance(now)
        self._desired[deployment] = replicas
        self.budgets.desired_changed(deployment, replicas, now)

    def pod_created(self, pod: Pod, replaces: Pod | None, now: float) -> None:
        self._created[pod.uid] = now
        self.interrupted.pod_created(pod, replaces, now)
        self.budgets.pod_created(pod, now)
        if replaces is None:
            return
        origin = self._origin.pop(replaces.uid, None)
        if origin is None and replaces.node_name in self._noticed_nodes:
            origin = self._noticed_nodes[replaces.node_name or ""]
        if origin is not None:
            self._origin[pod.uid] = origin

    def pod_bound(self, pod: Pod, now: float) -> None:
        created = self._created.pop(pod.uid, now)
        self.max_pending = max(self.max_pending, now - created)
        self.interrupted.pod_bound(pod, now)

    def pod_ready(self, pod: Pod, now: float) -> None:
        if pod.owner:
            self._advance(now)
            self._ready[pod.owner] = self._ready.get(pod.owner, 0) + 1
        self.budgets.ready_changed(pod, +1, now)
        self.interrupted.pod_ready(pod, now)
        origin = self._origin.pop(pod.uid, None)
        if origin is not None:
            self.recovery.append(now - origin)

    def pod_unready(self, pod: Pod, now: float) -> None:
        if pod.owner:
            self._advance(now)
            self._ready[pod.owner] = max(0, self._ready.get(pod.owner, 0) - 1)
        self.budgets.ready_changed(pod, -1, now)

    def pod_gone(self, pod: Pod, graceful: bool, now: float) -> None:
        self._created.pop(pod.uid, None)
        if pod.node_name is None:
            return
        if not graceful and not pod.daemon:
            self.lost += 1
        elif pod.evicted:
            self.evicted += 1

    def still_pending(self, now: float) -> None:
        """Count pods that never got a node up to the end of the run."""
        for created in self._created.values():
            self.max_pending = max(self.max_pending, now - created)
        for books in self.groups.values():
            books.advance(now)
        self.budgets.close(now)
