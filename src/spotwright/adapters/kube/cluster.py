"""``KubeCluster``: the Cluster port on a real Kubernetes API server.

It is the live twin of ``adapters.memory_cluster`` and keeps its semantics, so the same
controllers run on both:

* reads are synchronous and come from list-then-watch caches (pods with an index by node,
  nodes, PodDisruptionBudgets, NodeClaims), of the whole cluster or, for the per-node
  handler, of one node's share (``scope.CacheScope``: that Node and its pods, listed and
  watched with field selectors, and the cluster's Nodes and NodeClaims only inside
  ``capacity_view()``). A node's record leaves out the taints the
  node lifecycle controller puts on a node that is not Ready (``not-ready``,
  ``unreachable``): the record's ``ready`` says that already, and the in-memory world has
  no such taints, so a node that has just registered counts as capacity still booting,
  as Karpenter treats it, instead of as a node the pods cannot go to (which had the
  provisioner launch a second instance for the same pods);
* ``watch()`` subscribes when called. Unlike the in-memory cluster, a live controller may
  start long after the objects it must act on exist (a restart, a new leader), so a new
  subscription first receives every cached object, the way a Kubernetes informer's new
  handler does: as MODIFIED, except a NodeClaim that was never launched and is not being
  deleted, which is ADDED (it is still waiting for its launch);
* writes are merge patches (a node's taints conditioned on its resourceVersion, since
  the list has no merge key; a NodeClaim's status field by field), evictions
  go through the policy/v1 Eviction API (429 is ``EvictionBlocked``), and each write's
  response goes into the cache at once so a controller reads its own writes;
* Events (events.k8s.io/v1) are recorded in the background: a controller never waits for
  one, identical events within a minute are sent once, and a full queue drops them
  rather than slowing a drain down. ``flush_events`` waits until every Event queued has
  been sent (or has failed), not merely taken off the queue: the last ones are usually
  still waiting for a token or an answer when the queue runs empty, and a shutdown that
  went ahead then cancelled them.

An optional ``fence`` is asked before every write; leader election passes "am I still the
leader", so a replica that has lost its lease cannot write even from a task that has not
been cancelled yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from lightkube.types import PatchType

from spotwright.adapters._watch import WatchHub
from spotwright.adapters.kube.client import EVENTS, NODES, PDBS, PODS, Api, status_code
from spotwright.adapters.kube.convert import (
    READINESS_TAINTS,
    format_time,
    node_from_api,
    pdb_from_api,
    pod_from_api,
    taint_to_api,
)
from spotwright.adapters.kube.informer import ChangeType, Informer
from spotwright.adapters.kube.nodeclaims import NodeClaimStorage, StoredClaim
from spotwright.adapters.kube.scope import CacheScope, WideView
from spotwright.model.objects import Node, NodeClaim, Pod, PodDisruptionBudget, Taint
from spotwright.observability.logs import get_logger
from spotwright.ports.cluster import (
    ClusterError,
    EvictionBlocked,
    Kind,
    NotFound,
    WatchEvent,
)

__all__ = ["KubeCluster"]

log = get_logger("kube.cluster")

REPORTING_CONTROLLER = "spotwright.io/controller"
_EVENT_QUEUE = 2000
_CONFLICT_RETRIES = 5
_EVENT_WORKERS = 4
_EVENT_DEDUP_SECONDS = 60.0
_WIDE_SYNC_SECONDS = 30.0
_API_VERSIONS = {
    "Pod": "v1",
    "Node": "v1",
    "NodeClaim": "spotwright.io/v1alpha1",
    "NodePool": "spotwright.io/v1alpha1",
    "EC2NodeClass": "spotwright.io/v1alpha1",
}


class KubeCluster:
    def __init__(
        self,
        api: Api,
        *,
        identity: str = "spotwright",
        fence: Callable[[], bool] | None = None,
        scope: CacheScope | None = None,
    ) -> None:
        self.api = api
        self.identity = identity
        self.fence = fence
        self.scope = scope or CacheScope()
        self._subs = WatchHub()
        self._by_node: dict[str, dict[str, Pod]] = {}
        self._node_uids: dict[str, str] = {}
        self._all_taints: dict[str, list[Taint]] = {}
        self.pods_cache: Informer[Pod] = Informer(
            api, PODS, pod_from_api, listener=self._on_pod, fields=self.scope.pod_fields
        )
        self.nodes_cache: Informer[Node] = Informer(
            api, NODES, self._convert_node, listener=self._on_node, fields=self.scope.node_fields
        )
        self.pdbs_cache: Informer[PodDisruptionBudget] = Informer(api, PDBS, pdb_from_api)
        self.claims = NodeClaimStorage(api)
        self.claims.informer.listener = self._on_claim
        self._wide: WideView | None = None
        self._wide_users = 0
        self._events: asyncio.Queue[dict[str, Any]] = asyncio.Queue(_EVENT_QUEUE)
        self._recent_events: OrderedDict[tuple[str, ...], float] = OrderedDict()
        self.events_dropped = 0
        self.events_failed = 0
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def informers(self) -> tuple[Informer[Any], ...]:
        """The caches the scope asks for (all four for the controller)."""
        kept: list[Informer[Any]] = [self.pods_cache, self.nodes_cache]
        if self.scope.pdbs:
            kept.append(self.pdbs_cache)
        if self.scope.node_claims:
            kept.append(self.claims.informer)
        return tuple(kept)

    async def start(self, *, timeout: float = 60.0) -> None:
        """Start the caches and the event recorder; return once every cache has listed."""
        for informer in self.informers:
            self._tasks.append(asyncio.create_task(informer.run()))
        for _ in range(_EVENT_WORKERS):
            self._tasks.append(asyncio.create_task(self._event_worker()))
        async with asyncio.timeout(timeout):
            for informer in self.informers:
                await informer.synced.wait()

    async def close(self) -> None:
        if self._wide is not None:
            wide, self._wide = self._wide, None
            await wide.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()

    # -- reads ----------------------------------------------------------------------------
    def pods(self) -> Sequence[Pod]:
        return list(self.pods_cache.items.values())

    def pod(self, key: str) -> Pod | None:
        return self.pods_cache.items.get(key)

    def pods_on(self, node_name: str) -> Sequence[Pod]:
        return list(self._by_node.get(node_name, {}).values())

    def nodes(self) -> Sequence[Node]:
        if self._wide is None:
            return list(self.nodes_cache.items.values())
        # Inside capacity_view(): the cluster's nodes, this one as its own cache has it
        # (that cache reads its own writes at once).
        merged = dict(self._wide.node_items)
        merged.update(self.nodes_cache.items)
        return list(merged.values())

    def node(self, name: str) -> Node | None:
        found = self.nodes_cache.items.get(name)
        if found is None and self._wide is not None:
            found = self._wide.node_items.get(name)
        return found

    def _claim_items(self) -> Mapping[str, StoredClaim]:
        if self.scope.node_claims:
            return self.claims.informer.items
        return self._wide.claim_items if self._wide is not None else {}

    def node_claims(self) -> Sequence[NodeClaim]:
        return [s.claim for s in self._claim_items().values()]

    def node_claim(self, name: str) -> NodeClaim | None:
        stored = self._claim_items().get(name)
        return stored.claim if stored is not None else None

    def pdbs(self) -> Sequence[PodDisruptionBudget]:
        return list(self.pdbs_cache.items.values()) if self.scope.pdbs else []

    def watch(self, *kinds: Kind) -> AsyncIterator[WatchEvent]:
        """Subscribe now; every cached object of these kinds is announced first."""
        backlog: list[WatchEvent] = []
        if "node" in kinds:
            backlog += [WatchEvent("node", "MODIFIED", name) for name in self.nodes_cache.items]
        if "pod" in kinds:
            backlog += [WatchEvent("pod", "MODIFIED", key) for key in self.pods_cache.items]
        if "nodeclaim" in kinds:
            for name, stored in self.claims.informer.items.items():
                fresh = not stored.claim.provider_id and not stored.deleting
                backlog.append(WatchEvent("nodeclaim", "ADDED" if fresh else "MODIFIED", name))
        return self._subs.subscribe(kinds, backlog)

    @contextlib.asynccontextmanager
    async def capacity_view(self) -> AsyncIterator[None]:
        """Inside the block, ``nodes()`` and ``node_claims()`` cover the whole cluster.

        For a node-scoped cache (the per-node handler), which otherwise sees only its own
        Node: cluster-wide caches of Nodes and NodeClaims are started on entry, listed
        before the block runs, and stopped when the last block using them ends. A
        cluster-wide cache already sees everything, and the block costs nothing.
        """
        if self.scope.node is None and self.scope.node_claims:
            yield
            return
        self._wide_users += 1
        try:
            if self._wide is None:
                self._wide = WideView(self.api, claims=not self.scope.node_claims)
            await self._wide.ready(_WIDE_SYNC_SECONDS)
            yield
        finally:
            self._wide_users -= 1
            if self._wide_users == 0 and self._wide is not None:
                wide, self._wide = self._wide, None
                await wide.close()

    # -- cache listeners --------------------------------------------------------------------
    def _convert_node(self, obj: Mapping[str, Any]) -> Node:
        """The node as the controllers see it: without the node lifecycle controller's
        readiness taints, which ``ready`` already says (see ``READINESS_TAINTS``); the
        full list is kept aside, since a taint patch replaces the whole list."""
        node = node_from_api(obj)
        self._node_uids[node.name] = str((obj.get("metadata") or {}).get("uid") or "")
        self._all_taints[node.name] = list(node.taints)
        node.taints = [t for t in node.taints if t.key not in READINESS_TAINTS]
        return node

    def _on_pod(self, change: ChangeType, key: str, old: Pod | None, new: Pod | None) -> None:
        if old is not None and old.node_name is not None:
            on_node = self._by_node.get(old.node_name)
            if on_node is not None:
                on_node.pop(key, None)
                if not on_node:
                    del self._by_node[old.node_name]
        if new is not None and new.node_name is not None:
            self._by_node.setdefault(new.node_name, {})[key] = new
        self._publish("pod", change, key)

    def _on_node(self, change: ChangeType, key: str, old: Node | None, new: Node | None) -> None:
        if change == "DELETED":
            self._node_uids.pop(key, None)
            self._all_taints.pop(key, None)
        self._publish("node", change, key)

    def _on_claim(
        self, change: ChangeType, key: str, old: StoredClaim | None, new: StoredClaim | None
    ) -> None:
        if change == "DELETED":
            self.claims.forget_history(key)
        self._publish("nodeclaim", change, key)

    def _publish(self, kind: Kind, change: ChangeType, name: str) -> None:
        if self._subs:
            self._subs.publish(WatchEvent(kind, change, name))

    # -- writes ---------------------------------------------------------------------------
    def _check_fence(self) -> None:
        if self.fence is not None and not self.fence():
            raise ClusterError("not the leader any more: refusing to write")

    async def create_node_claim(self, claim: NodeClaim) -> None:
        self._check_fence()
        await self.claims.create(claim)

    async def update_node_claim(self, claim: NodeClaim) -> None:
        self._check_fence()
        await self.claims.update(claim)

    async def remove_node_claim(self, name: str) -> None:
        self._check_fence()
        await self.claims.remove(name)

    async def patch_node(
        self,
        name: str,
        *,
        add_taints: Sequence[Taint] = (),
        remove_taints: Sequence[str] = (),
        unschedulable: bool | None = None,
        labels: Mapping[str, str | None] | None = None,
    ) -> None:
        """One merge patch; a taint change is conditioned on the node's resourceVersion.

        A Node's taint list has no merge key, so any patch of it replaces the whole list:
        the new list is computed from the cached node and sent with the version it was
        read at, and a 409 (someone changed the node meanwhile) re-reads and retries, so a
        taint another controller added in between is never dropped.
        """
        self._check_fence()
        for _ in range(_CONFLICT_RETRIES):
            patch: dict[str, Any] = {}
            spec: dict[str, Any] = {}
            if add_taints or remove_taints:
                if name not in self.nodes_cache.items:
                    raise NotFound(f"node {name} not found")
                taints = [t for t in self._all_taints[name] if t.key not in remove_taints]
                taints += [t for t in add_taints if t not in taints]
                spec["taints"] = [taint_to_api(t) for t in taints]
                patch["metadata"] = {"resourceVersion": self.nodes_cache.version_of(name)}
            if unschedulable is not None:
                spec["unschedulable"] = unschedulable
            if spec:
                patch["spec"] = spec
            if labels:
                patch.setdefault("metadata", {})["labels"] = dict(labels)
            if not patch:
                return
            try:
                response = await self.api.patch(NODES, name, patch, patch_type=PatchType.MERGE)
            except Exception as exc:
                if status_code(exc) != 409:
                    raise _error(exc, f"node {name}") from exc
                try:
                    self.nodes_cache.apply(await self.api.get(NODES, name))
                except Exception as fresh_exc:
                    raise _error(fresh_exc, f"node {name}") from fresh_exc
                continue
            self.nodes_cache.apply(response)
            return
        raise ClusterError(f"node {name}: still conflicting after {_CONFLICT_RETRIES} attempts")

    async def delete_node(self, name: str) -> None:
        self._check_fence()
        try:
            await self.api.delete(NODES, name)
        except Exception as exc:
            if status_code(exc) != 404:
                raise _error(exc, f"node {name}") from exc
        self.nodes_cache.forget(name)

    async def evict(self, pod: Pod) -> None:
        self._check_fence()
        try:
            await self.api.evict(pod.namespace, pod.name, pod.uid)
        except Exception as exc:
            code = status_code(exc)
            if code == 429:
                raise EvictionBlocked(str(exc), _refusing_budget(exc, pod.namespace)) from exc
            raise _error(exc, f"pod {pod.key}") from exc
        self._mark_terminating(pod.key, evicted=True)

    async def delete_pod(self, pod: Pod, grace_seconds: float | None = None) -> None:
        self._check_fence()
        grace = None if grace_seconds is None else max(0, int(grace_seconds))
        try:
            await self.api.delete(PODS, pod.name, namespace=pod.namespace, grace_seconds=grace)
        except Exception as exc:
            raise _error(exc, f"pod {pod.key}") from exc
        self._mark_terminating(pod.key, evicted=False)

    def _mark_terminating(self, key: str, *, evicted: bool) -> None:
        """The API accepted the deletion; show it before the watch event does."""
        cached = self.pods_cache.items.get(key)
        if cached is not None and cached.deleting_since is None:
            cached.deleting_since = time.time()
            cached.evicted = cached.evicted or evicted
            self.pods_cache.touch(key)

    async def record_event(
        self, kind: str, name: str, reason: str, message: str, *, warning: bool = False
    ) -> None:
        now = time.time()
        signature = (kind, name, reason, message)
        last = self._recent_events.get(signature)
        if last is not None and now - last < _EVENT_DEDUP_SECONDS:
            return
        self._recent_events[signature] = now
        self._recent_events.move_to_end(signature)
        while len(self._recent_events) > 4096:
            self._recent_events.popitem(last=False)
        try:
            self._events.put_nowait(self._event(kind, name, reason, message, warning, now))
        except asyncio.QueueFull:
            self.events_dropped += 1

    def _event(
        self, kind: str, name: str, reason: str, message: str, warning: bool, now: float
    ) -> dict[str, Any]:
        namespace, _, short = name.rpartition("/")
        regarding: dict[str, Any] = {
            "apiVersion": _API_VERSIONS.get(kind, "v1"),
            "kind": kind,
            "name": short,
        }
        uid = self._uid(kind, name)
        if uid:
            regarding["uid"] = uid
        if namespace:
            regarding["namespace"] = namespace
        return {
            # client-go's naming: the object's name and a unique suffix (generateName would
            # end in "." and is refused).
            "metadata": {
                "name": f"{short[:200]}.{uuid.uuid4().hex[:16]}",
                "namespace": namespace or "default",
            },
            "eventTime": format_time(now),
            "reportingController": REPORTING_CONTROLLER,
            "reportingInstance": self.identity[:128],
            "action": reason[:128],
            "reason": reason[:128],
            "note": message[:1024],
            "type": "Warning" if warning else "Normal",
            "regarding": regarding,
        }

    def _uid(self, kind: str, name: str) -> str:
        if kind == "Pod":
            pod = self.pods_cache.items.get(name)
            return pod.uid if pod is not None else ""
        if kind == "Node":
            return self._node_uids.get(name, "")
        if kind == "NodeClaim":
            stored = self.claims.informer.items.get(name)
            return stored.uid if stored is not None else ""
        return ""

    async def _event_worker(self) -> None:
        while True:
            event = await self._events.get()
            try:
                await self.api.create(EVENTS, event, namespace=event["metadata"]["namespace"])
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # an Event is best effort, never a failure
                self.events_failed += 1
                say = log.warning if self.events_failed <= 5 else log.debug
                say("could not record event", reason=event["reason"], error=str(exc))
            finally:
                # Done only now, answered: an Event taken off the queue may still be
                # waiting for a token or for the API server (see flush_events).
                self._events.task_done()

    async def flush_events(self, timeout: float = 5.0) -> None:
        """Wait (at most ``timeout``) until every queued Event has been sent: for shutdown.

        Waiting for an empty queue is not enough: the workers take the last Events off
        it and are still sending them (or waiting for the Events' rate limit) when it
        runs empty, and the ``close()`` that follows a flush would cancel them.
        """
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._events.join(), timeout)


def _error(exc: Exception, what: str) -> ClusterError:
    if status_code(exc) == 404:
        return NotFound(f"{what} not found")
    return ClusterError(f"{what}: {exc}")


#: kube-apiserver's eviction REST (pkg/registry/core/pod/storage/eviction.go) names the
#: budget in a DisruptionBudget cause: "... needs N healthy pods ..." or, when the budget
#: controller has not synced it, "... does not allow evicting pods currently ...".
_BUDGET_CAUSE = re.compile(r"disruption budget (\S+) (?:needs|does not allow)")


def _refusing_budget(exc: BaseException, namespace: str) -> str | None:
    """``namespace/name`` of the budget a 429 names, else None.

    The message only says "would violate the pod's disruption budget"; the name is in a
    cause of type DisruptionBudget ("The disruption budget web needs 2 healthy pods ...").
    """
    status = getattr(exc, "status", None)
    details = getattr(status, "details", None)
    for cause in getattr(details, "causes", None) or ():
        match = _BUDGET_CAUSE.search(getattr(cause, "message", None) or "")
        if match:
            return f"{namespace}/{match.group(1)}"
    return None
