"""What a drain waits on before its next eviction: a budget's room, and a place to go.

A PodDisruptionBudget refusal is retried on a backoff timer, but the moment that usually
frees the budget is one of its pods becoming ready (the replacement of the pod evicted
before). ``BudgetWaker`` watches pods and cuts the wait short then, so a budget that allows
one pod down at a time costs each pod its own start-up, not start-up plus a backoff step.
The timer stays the upper bound: a drain wakes on such an event or on the timer, never in
a loop of its own.

``Room`` answers whether a pod evicted now would find a ready node: a replace-then-drain
(no deadline yet) holds back a pod that would not, and the provisioner, which counts the
pods of a disrupted node as pending, adds the room it lacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Iterable, Sequence

from spotwright.model import labels as wk
from spotwright.model.objects import Node, Pod, PodDisruptionBudget
from spotwright.model.resources import Resources
from spotwright.ports.clock import Clock
from spotwright.ports.cluster import Cluster, WatchEvent
from spotwright.scheduling.fit import node_fit, pod_requests

__all__ = ["BudgetWaker", "Room", "budgets_of", "promise"]

#: An evicted pod's room stays promised until its owner has created a replacement (which
#: is then counted instead: a Deployment's appears as soon as the pod starts terminating),
#: or while it terminates and this long after (a StatefulSet recreates it only once it is
#: gone). Counting both would hold another drain back for the whole grace period.
_PROMISE_SECONDS = 5.0
_PROMISED: weakref.WeakKeyDictionary[Cluster, dict[str, tuple[Pod, float]]] = (
    weakref.WeakKeyDictionary()
)


def _selects(budget: PodDisruptionBudget, pod: Pod) -> bool:
    return budget.namespace == pod.namespace and all(
        pod.labels.get(k) == v for k, v in budget.selector.items()
    )


def budgets_of(cluster: Cluster, pod: Pod, named: str | None) -> list[PodDisruptionBudget]:
    """The budgets that may have refused the pod: the named one, else every one selecting it.

    Without any cached budget (a cache that does not hold them), a stand-in selecting the
    pod's whole namespace, which wakes the drain more often but never misses the moment.
    """
    matching = [b for b in cluster.pdbs() if _selects(b, pod)]
    if named is not None:
        exact = [b for b in matching if f"{b.namespace}/{b.name}" == named]
        matching = exact or matching
    return matching or [PodDisruptionBudget(name="", namespace=pod.namespace)]


class BudgetWaker:
    """Wakes a drain when a pod selected by a budget that refused it becomes ready."""

    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster
        self._budgets: list[PodDisruptionBudget] = []
        self._woken = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None

    def refused(self, budgets: Sequence[PodDisruptionBudget]) -> None:
        """Start listening for these budgets' pods (the watch opens at the first refusal)."""
        for budget in budgets:
            if budget not in self._budgets:
                self._budgets.append(budget)
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch(self._cluster.watch("pod")))

    async def sleep(self, clock: Clock, seconds: float) -> bool:
        """Sleep up to ``seconds``; True when a budget's pod became ready meanwhile."""
        if self._watcher is None:
            await clock.sleep(seconds)
            return False
        timer = asyncio.ensure_future(clock.sleep(seconds))
        woken = asyncio.ensure_future(self._woken.wait())
        try:
            await asyncio.wait({timer, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            woken.cancel()
        if self._woken.is_set():
            self._woken.clear()
            return True
        return False

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None

    async def _watch(self, events: AsyncIterator[WatchEvent]) -> None:
        try:
            async for event in events:
                if event.type == "DELETED":
                    continue
                pod = self._cluster.pod(event.name)
                if pod is None or not pod.ready or pod.deleting_since is not None:
                    continue
                if any(_selects(b, pod) for b in self._budgets):
                    self._woken.set()
        finally:
            closer = getattr(events, "aclose", None)
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer()


class Room:
    """Free capacity on the ready, schedulable nodes, as kube-scheduler would see it.

    Taken once per drain pass; pods already waiting for a node, and pods this pass lets go,
    are placed on it (on the emptiest node that fits, as least-allocated scoring would) so
    two pods are never promised the same room.
    """

    def __init__(self, cluster: Cluster, leaving: str, now: float) -> None:
        self._nodes: list[Node] = [
            n for n in cluster.nodes() if n.name != leaving and n.ready and not _disrupted(n)
        ]
        self._free: dict[str, Resources] = {}
        for node in self._nodes:
            used = Resources()
            # Terminating pods included: the scheduler counts them until they are gone.
            for pod in cluster.pods_on(node.name):
                used = used + pod_requests(pod)
            self._free[node.name] = node.allocatable - used
        for pod in cluster.pods():
            if pod.node_name is None and pod.deleting_since is None:
                self.take(pod)
        promised = _PROMISED.setdefault(cluster, {})
        fresh = _created_by_owner(cluster)
        for key, (pod, at) in sorted(promised.items(), key=lambda item: item[1][1]):
            if _replaced(pod, at, fresh) or (
                at + _PROMISE_SECONDS < now and cluster.pod(key) is None
            ):
                del promised[key]
            else:
                self.take(pod)

    def take_all(self, pods: Iterable[Pod]) -> bool:
        """Place every pod, in order; False as soon as one finds no room."""
        return all(self.take(pod) for pod in pods)

    def take(self, pod: Pod) -> bool:
        """Place the pod if some node has room for it; False (nothing taken) if none does."""
        best: Node | None = None
        for node in self._nodes:
            free = self._free[node.name]
            reason = node_fit(
                pod,
                labels=node.labels,
                taints=node.taints,
                unschedulable=node.unschedulable,
                free=free,
            )
            if reason is None and (best is None or free.cpu > self._free[best.name].cpu):
                best = node
        if best is None:
            return False
        self._free[best.name] = self._free[best.name] - pod_requests(pod)
        return True


def promise(cluster: Cluster, pod: Pod, now: float) -> None:
    """Keep room for a pod just evicted until its replacement surely shows up as pending.

    Several drains decide in the same instant: without this, two of them would both count
    on the room the first one's pods are about to take.
    """
    _PROMISED.setdefault(cluster, {})[pod.key] = (pod, now)


def _created_by_owner(cluster: Cluster) -> dict[tuple[str, str], list[float]]:
    """Creation times of the live pods of each owner, oldest first."""
    times: dict[tuple[str, str], list[float]] = {}
    for pod in cluster.pods():
        if pod.owner is not None and pod.deleting_since is None:
            times.setdefault((pod.namespace, pod.owner), []).append(pod.created_at)
    for created in times.values():
        created.sort()
    return times


def _replaced(pod: Pod, at: float, fresh: dict[tuple[str, str], list[float]]) -> bool:
    """Whether a pod of the evicted pod's owner created since the eviction stands in for it.

    Each such pod stands in for one promise (the oldest first), so two pods of one owner
    evicted together stay promised until both replacements exist.
    """
    if pod.owner is None:
        return False
    created = fresh.get((pod.namespace, pod.owner), [])
    for i, when in enumerate(created):
        if when >= at:
            del created[i]
            return True
    return False


def _disrupted(node: Node) -> bool:
    return node.unschedulable or any(t.key == wk.DISRUPTED_TAINT_KEY for t in node.taints)
