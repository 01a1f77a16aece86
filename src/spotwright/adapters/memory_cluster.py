"""An in-memory Kubernetes for the simulator and fast tests.

It implements the Cluster port and, behind it, the parts of Kubernetes the controllers rely
on without owning: kube-scheduler (binds pending pods to ready nodes, marks the rest
Unschedulable), the ReplicaSet controller (recreates pods of a Deployment as soon as one
starts terminating), the Eviction API with PodDisruptionBudgets, and the kubelet (a pod is
ready ``startup_seconds`` after binding; a deleted pod is gone after its grace period).
Timers are event-loop timers, so on the virtual loop they run in simulated time.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from spotwright.adapters._watch import WatchHub
from spotwright.model.objects import (
    Deployment,
    Node,
    NodeClaim,
    Pod,
    PodDisruptionBudget,
    Taint,
)
from spotwright.model.resources import Resources
from spotwright.ports.clock import Clock
from spotwright.ports.cluster import EvictionBlocked, Kind, NotFound, WatchEvent
from spotwright.scheduling import node_fit, pod_requests

__all__ = ["ClusterObserver", "MemoryCluster", "RecordedEvent"]


class ClusterObserver(Protocol):
    """Hooks the simulator's ledger uses to measure availability and disruption."""

    def pod_created(self, pod: Pod, replaces: Pod | None, now: float) -> None: ...

    def pod_bound(self, pod: Pod, now: float) -> None: ...

    def pod_ready(self, pod: Pod, now: float) -> None: ...

    def pod_unready(self, pod: Pod, now: float) -> None: ...

    def pod_gone(self, pod: Pod, graceful: bool, now: float) -> None: ...

    def desired_changed(self, deployment: str, replicas: int, now: float) -> None: ...


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    time: float
    kind: str
    name: str
    reason: str
    message: str
    warning: bool


class MemoryCluster:
    def __init__(self, clock: Clock, observer: ClusterObserver | None = None) -> None:
        self._clock = clock
        self._observer = observer
        self._pods: dict[str, Pod] = {}
        self._nodes: dict[str, Node] = {}
        self._claims: dict[str, NodeClaim] = {}
        self._deployments: dict[str, Deployment] = {}
        self._pdbs: list[PodDisruptionBudget] = []
        self._on_node: dict[str, dict[str, Pod]] = {}
        self._used: dict[str, Resources] = {}
        self._pending: dict[str, Pod] = {}
        self._subs = WatchHub()
        self._serial = 0
        self._pass_scheduled = False
        self._forced: set[str] = set()
        self.events: deque[RecordedEvent] = deque(maxlen=20_000)

    # -- world-side API (what the simulator does to the cluster) -----------------------
    def apply_deployment(self, deployment: Deployment) -> None:
        self._deployments[deployment.name] = deployment
        self._emit_desired(deployment)
        self._reconcile_replicas(deployment)

    def apply_pdb(self, pdb: PodDisruptionBudget) -> None:
        self._pdbs.append(pdb)

    def scale(self, name: str, replicas: int) -> None:
        deployment = self._deployments[name]
        deployment.replicas = replicas
        self._emit_desired(deployment)
        self._reconcile_replicas(deployment)

    def deployments(self) -> Sequence[Deployment]:
        return list(self._deployments.values())

    def register_node(self, node: Node) -> None:
        """A kubelet joined: the node exists (not ready yet unless ``node.ready``)."""
        self._nodes[node.name] = node
        self._on_node.setdefault(node.name, {})
        self._used.setdefault(node.name, Resources())
        self._publish("node", "ADDED", node.name)
        if node.ready:
            self._schedule_soon()

    def set_node_ready(self, name: str, ready: bool = True) -> None:
        node = self._nodes.get(name)
        if node is None:
            return
        node.ready = ready
        self._publish("node", "MODIFIED", name)
        if ready:
            self._schedule_soon()

    def node_lost(self, name: str) -> None:
        """The instance behind a node vanished: its pods die where they stand."""
        node = self._nodes.pop(name, None)
        if node is None:
            return
        for pod in list(self._on_node.pop(name, {}).values()):
            self._remove_pod(pod, graceful=False)
        self._used.pop(name, None)
        self._publish("node", "DELETED", name)

    # -- reads --------------------------------------------------------------------------
    def pods(self) -> Sequence[Pod]:
        return list(self._pods.values())

    def pod(self, key: str) -> Pod | None:
        return self._pods.get(key)

    def pending_pods(self) -> Sequence[Pod]:
        return list(self._pending.values())

    def pods_on(self, node_name: str) -> Sequence[Pod]:
        return list(self._on_node.get(node_name, {}).values())

    def used(self, node_name: str) -> Resources:
        return self._used.get(node_name, Resources())

    def nodes(self) -> Sequence[Node]:
        return list(self._nodes.values())

    def node(self, name: str) -> Node | None:
        return self._nodes.get(name)

    def node_claims(self) -> Sequence[NodeClaim]:
        return list(self._claims.values())

    def node_claim(self, name: str) -> NodeClaim | None:
        return self._claims.get(name)

    def pdbs(self) -> Sequence[PodDisruptionBudget]:
        return list(self._pdbs)

    def watch(self, *kinds: Kind) -> AsyncIterator[WatchEvent]:
        """Subscribe now (not at first iteration), so no change after this call is missed."""
        return self._subs.subscribe(kinds)

    # -- writes (the Cluster port) -------------------------------------------------------
    async def create_node_claim(self, claim: NodeClaim) -> None:
        self._claims[claim.name] = claim
        self._publish("nodeclaim", "ADDED", claim.name)

    async def update_node_claim(self, claim: NodeClaim) -> None:
        if claim.name not in self._claims:
            raise NotFound(f"nodeclaim {claim.name} not found")
        self._claims[claim.name] = claim
        self._publish("nodeclaim", "MODIFIED", claim.name)

    async def remove_node_claim(self, name: str) -> None:
        if self._claims.pop(name, None) is not None:
            self._publish("nodeclaim", "DELETED", name)

    async def patch_node(
        self,
        name: str,
        *,
        add_taints: Sequence[Taint] = (),
        remove_taints: Sequence[str] = (),
        unschedulable: bool | None = None,
        labels: Mapping[str, str | None] | None = None,
    ) -> None:
        node = self._nodes.get(name)
        if node is None:
            raise NotFound(f"node {name} not found")
        taints = [t for t in node.taints if t.key not in remove_taints]
        for taint in add_taints:
            if taint not in taints:
                taints.append(taint)
        node.taints = taints
        if unschedulable is not None:
            node.unschedulable = unschedulable
        for key, value in (labels or {}).items():
            if value is None:
                node.labels.pop(key, None)
            else:
                node.labels[key] = value
        self._publish("node", "MODIFIED", name)
        if remove_taints or unschedulable is False:
            self._schedule_soon()

    async def delete_node(self, name: str) -> None:
        if name in self._nodes:
            self.node_lost(name)

    async def evict(self, pod: Pod) -> None:
        current = self._pods.get(pod.key)
        if current is None:
            raise NotFound(f"pod {pod.key} not found")
        if current.terminating:
            return
        for pdb in self._matching_pdbs(current):
            if not self._disruption_allowed(pdb, current):
                raise EvictionBlocked(
                    f"Cannot evict pod as it would violate the pod's disruption budget "
                    f"{pdb.namespace}/{pdb.name}",
                    budget=f"{pdb.namespace}/{pdb.name}",
                )
        current.evicted = True
        self._start_termination(current, current.grace_seconds)

    async def delete_pod(self, pod: Pod, grace_seconds: float | None = None) -> None:
        current = self._pods.get(pod.key)
        if current is None:
            raise NotFound(f"pod {pod.key} not found")
        grace = current.grace_seconds if grace_seconds is None else grace_seconds
        if grace < current.grace_seconds:
            # Cut short: whatever the pod was doing, it did not shut down gracefully.
            self._forced.add(current.key)
        if current.terminating:
            if grace <= 0:
                self._remove_pod(current, graceful=False)
            return
        self._start_termination(current, grace)

    async def record_event(
        self, kind: str, name: str, reason: str, message: str, *, warning: bool = False
    ) -> None:
        self.events.append(RecordedEvent(self._clock.now(), kind, name, reason, message, warning))

    # -- ReplicaSet controller ----------------------------------------------------------
    def _reconcile_replicas(self, deployment: Deployment, replaces: Pod | None = None) -> None:
        live = [p for p in self._pods.values() if p.owner == deployment.name and not p.terminating]
        missing = deployment.replicas - len(live)
        for _ in range(missing):
            self._create_pod(deployment, replaces)
        if missing < 0:
            # Scale down the way the ReplicaSet controller ranks: unbound, then not ready,
            # then the newest.
            live.sort(key=lambda p: (p.node_name is not None, p.ready, -p.created_at))
            for pod in live[:-missing]:
                self._start_termination(pod, pod.grace_seconds)

    def _create_pod(self, deployment: Deployment, replaces: Pod | None) -> None:
        self._serial += 1
        now = self._clock.now()
        template = deployment.template
        pod = replace(
            template,
            name=f"{deployment.name}-{self._serial:05x}",
            namespace=deployment.namespace,
            uid=f"uid-{self._serial}",
            labels=dict(template.labels),
            node_selector=dict(template.node_selector),
            annotations=dict(template.annotations),
            owner=deployment.name,
            created_at=now,
            node_name=None,
            unschedulable=False,
            ready=False,
            ready_at=None,
            deleting_since=None,
            evicted=False,
        )
        self._pods[pod.key] = pod
        self._pending[pod.key] = pod
        if self._observer:
            self._observer.pod_created(pod, replaces, now)
        self._publish("pod", "ADDED", pod.key)
        self._schedule_soon()

    def _emit_desired(self, deployment: Deployment) -> None:
        if self._observer:
            self._observer.desired_changed(deployment.name, deployment.replicas, self._clock.now())

    # -- kubelet ----------------------------------------------------------------------
    def _start_termination(self, pod: Pod, grace: float) -> None:
        now = self._clock.now()
        pod.deleting_since = now
        if pod.ready:
            pod.ready = False
            if self._observer:
                self._observer.pod_unready(pod, now)
        self._publish("pod", "MODIFIED", pod.key)
        deployment = self._deployments.get(pod.owner or "")
        if deployment is not None:
            self._reconcile_replicas(deployment, replaces=pod)
        if pod.node_name is None or grace <= 0:
            self._remove_pod(pod, graceful=pod.node_name is None or pod.key not in self._forced)
            return
        loop = asyncio.get_running_loop()
        loop.call_later(grace, self._finish_termination, pod)

    def _finish_termination(self, pod: Pod) -> None:
        if self._pods.get(pod.key) is pod:
            self._remove_pod(pod, graceful=pod.key not in self._forced)

    def _remove_pod(self, pod: Pod, *, graceful: bool) -> None:
        if self._pods.pop(pod.key, None) is None:
            return
        self._pending.pop(pod.key, None)
        self._forced.discard(pod.key)
        now = self._clock.now()
        if pod.node_name is not None:
            self._on_node.get(pod.node_name, {}).pop(pod.key, None)
            if pod.node_name in self._used:
                self._used[pod.node_name] = self._used[pod.node_name] - pod_requests(pod)
        if pod.ready and self._observer:
            self._observer.pod_unready(pod, now)
        pod.ready = False
        if self._observer:
            self._observer.pod_gone(pod, graceful, now)
        self._publish("pod", "DELETED", pod.key)
        deployment = self._deployments.get(pod.owner or "")
        if deployment is not None and not pod.terminating:
            self._reconcile_replicas(deployment, replaces=pod)
        self._schedule_soon()

    def _mark_ready(self, pod: Pod) -> None:
        if self._pods.get(pod.key) is not pod or pod.terminating or pod.node_name is None:
            return
        now = self._clock.now()
        pod.ready = True
        pod.ready_at = now
        if self._observer:
            self._observer.pod_ready(pod, now)
        self._publish("pod", "MODIFIED", pod.key)

    # -- kube-scheduler ---------------------------------------------------------------
    def _schedule_soon(self) -> None:
        if not self._pass_scheduled:
            self._pass_scheduled = True
            asyncio.get_running_loop().call_soon(self._scheduling_pass)

    def _scheduling_pass(self) -> None:
        self._pass_scheduled = False
        if not self._pending:
            return
        nodes = [n for n in self._nodes.values() if n.ready and not n.unschedulable]
        loop = asyncio.get_running_loop()
        now = self._clock.now()
        for pod in sorted(self._pending.values(), key=lambda p: (-p.priority, p.created_at)):
            best: Node | None = None
            best_score = -1.0
            for node in nodes:
                free = node.allocatable - self._used[node.name]
                if (
                    node_fit(
                        pod,
                        labels=node.labels,
                        taints=node.taints,
                        unschedulable=node.unschedulable,
                        free=free,
                    )
                    is not None
                ):
                    continue
                score = _least_allocated(free, node.allocatable)
                if score > best_score:
                    best, best_score = node, score
            if best is None:
                if not pod.unschedulable:
                    pod.unschedulable = True
                    self._publish("pod", "MODIFIED", pod.key)
                continue
            del self._pending[pod.key]
            pod.node_name = best.name
            pod.unschedulable = False
            pod.started_at = now  # the kubelet takes it on at once (status.startTime)
            self._on_node[best.name][pod.key] = pod
            # What node_fit checked: requests, overhead and the pod's slot (max pods).
            self._used[best.name] = self._used[best.name] + pod_requests(pod)
            if self._observer:
                self._observer.pod_bound(pod, now)
            self._publish("pod", "MODIFIED", pod.key)
            loop.call_later(pod.startup_seconds, self._mark_ready, pod)

    # -- PodDisruptionBudgets ----------------------------------------------------------
    def _matching_pdbs(self, pod: Pod) -> list[PodDisruptionBudget]:
        return [
            pdb
            for pdb in self._pdbs
            if pdb.namespace == pod.namespace
            and all(pod.labels.get(k) == v for k, v in pdb.selector.items())
        ]

    def _disruption_allowed(self, pdb: PodDisruptionBudget, pod: Pod) -> bool:
        selected = [
            p
            for p in self._pods.values()
            if p.namespace == pdb.namespace
            and all(p.labels.get(k) == v for k, v in pdb.selector.items())
        ]
        expected = self._expected_count(selected)
        healthy = sum(1 for p in selected if p.ready and not p.terminating)
        if pdb.min_available is not None:
            desired_healthy = _scaled(pdb.min_available, expected)
        else:
            desired_healthy = expected - _scaled(pdb.max_unavailable or 0, expected)
        if not pod.ready:
            # Unhealthy pods may go as long as the budget is otherwise met.
            return healthy >= desired_healthy
        return healthy - 1 >= desired_healthy

    def _expected_count(self, selected: list[Pod]) -> int:
        owners = {p.owner for p in selected if p.owner}
        counted = sum(self._deployments[o].replicas for o in owners if o in self._deployments)
        return counted + sum(1 for p in selected if not p.owner)

    # -- watch fan-out ----------------------------------------------------------------
    def _publish(self, kind: Kind, type_: str, name: str) -> None:
        if self._subs:
            self._subs.publish(WatchEvent(kind, type_, name))  # type: ignore[arg-type]


def _least_allocated(free: Resources, allocatable: Resources) -> float:
    cpu = free.cpu / allocatable.cpu if allocatable.cpu else 0.0
    memory = free.memory / allocatable.memory if allocatable.memory else 0.0
    return (cpu + memory) / 2


def _scaled(value: int | str, total: int) -> int:
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(total * int(value[:-1]) / 100)
    return int(value)
