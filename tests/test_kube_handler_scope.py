"""The per-node handler's cache scope, its calls and its RBAC, against an in-process fake.

A node-scoped ``KubeCluster`` (``CacheScope.one_node``) must ask the API server for one
node's objects only: its list and watch requests carry field selectors, it never lists
PodDisruptionBudgets or NodeClaims except inside ``capacity_view()``, and the calls it
makes are exactly what the handler's ClusterRole (deploy/handler-daemonset.yaml) grants.
That the scope holds on a real API server, and that the role is sufficient there, is
tests/cluster/test_e2e_handler.py's job. Also here: ``flush_events`` returns only once
the last Event has been sent, not once the queue is empty.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx2

from spotwright.adapters.kube.client import Api, TokenBucket
from spotwright.adapters.kube.cluster import KubeCluster
from spotwright.adapters.kube.nodeclaims import claim_to_api
from spotwright.adapters.kube.scope import CacheScope
from spotwright.model.objects import NodeClaim, Pod, Taint
from test_rbac import FakeApiServer, api_for, granted

NODE = "ip-10-0-0-1.ec2.internal"


class Recorder:
    """The fake API server, with every request's method, path and query kept."""

    def __init__(self) -> None:
        self.server = FakeApiServer()
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        handle: Callable[[httpx2.Request], httpx2.Response] = self.server.handler

        def recording(request: httpx2.Request) -> httpx2.Response:
            self.requests.append((request.method, request.url.path, dict(request.url.params)))
            return handle(request)

        self.server.handler = recording  # type: ignore[method-assign]

    def reads(self, plural: str) -> list[dict[str, str]]:
        """The query of every list or watch of ``plural``."""
        return [
            query
            for method, path, query in self.requests
            if method == "GET" and path.endswith(f"/{plural}")
        ]

    def add(self, collection: str, key: str, obj: dict[str, Any]) -> dict[str, Any]:
        namespace = key.split("/", 1)[0]
        self.server.objects[(collection, key)] = obj
        self.server._stamp(obj, namespace)
        return obj


def node_object(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {}, "status": {}}


async def handler_calls(recorder: Recorder) -> Api:
    """Every kind of call the handler makes, through a node-scoped cluster."""
    api = api_for(recorder.server)
    cluster = KubeCluster(api, identity="handler-test", scope=CacheScope.one_node(NODE))
    await cluster.start(timeout=5)
    node = recorder.add("api/v1/nodes", f"/{NODE}", node_object(NODE))
    cluster.nodes_cache.apply(node)  # the fake's watches never deliver
    # Taint and cordon, re-reading the node after a conflict; evict and force-delete.
    recorder.server.conflicts.add(NODE)
    await cluster.patch_node(NODE, add_taints=[Taint("k", "NoSchedule")], unschedulable=True)
    await cluster.evict(Pod(name="p", namespace="ns", uid="u"))
    pod = {"metadata": {"name": "p"}, "spec": {"nodeName": NODE, "containers": [{"name": "c"}]}}
    recorder.add("api/v1/pods", "ns/p", pod)
    await cluster.delete_pod(Pod(name="p", namespace="ns"), grace_seconds=1)
    await cluster.record_event("Node", NODE, "Cordoned", "test")
    await cluster.flush_events()
    # The replace-then-drain wait's wider view.
    async with cluster.capacity_view():
        pass
    await cluster.close()
    return api


def test_a_node_scoped_cluster_lists_and_watches_its_node_and_pods_only() -> None:
    recorder = Recorder()
    api = asyncio.run(handler_calls(recorder))
    pod_reads = recorder.reads("pods")
    assert pod_reads and all(q.get("fieldSelector") == f"spec.nodeName={NODE}" for q in pod_reads)
    # The node: by name, except for the one list and watch of the replacement wait.
    node_reads = [q.get("fieldSelector") for q in recorder.reads("nodes")]
    assert node_reads.count(f"metadata.name={NODE}") >= 2  # the list, then the watch
    assert node_reads.count(None) == 2
    assert recorder.reads("poddisruptionbudgets") == []
    assert len(recorder.reads("nodeclaims")) == 2  # inside capacity_view() only
    # ... and exactly the permissions the handler's ClusterRole grants.
    role = granted("handler-daemonset.yaml")
    assert api.used == role, (
        f"missing from the handler's role: {sorted(api.used - role)}; "
        f"granted but never used: {sorted(role - api.used)}"
    )


def test_the_wider_view_shows_the_clusters_nodes_and_claims_only_while_it_lasts() -> None:
    async def main() -> None:
        recorder = Recorder()
        claim = claim_to_api(NodeClaim(name="default-abcde", nodepool="default"))
        recorder.add("apis/spotwright.io/v1alpha1/nodeclaims", "/default-abcde", claim)
        api = api_for(recorder.server)
        cluster = KubeCluster(api, scope=CacheScope.one_node(NODE))
        await cluster.start(timeout=5)
        assert cluster.node_claims() == [] and cluster.pdbs() == []
        async with cluster.capacity_view(), cluster.capacity_view():  # nested: shared
            assert [c.name for c in cluster.node_claims()] == ["default-abcde"]
            assert cluster.node_claim("default-abcde") is not None
        assert cluster.node_claims() == []
        watches = [q for q in recorder.reads("nodeclaims") if q.get("watch") == "true"]
        assert len(watches) == 1
        await cluster.close()
        await api.close()

    asyncio.run(main())


def test_flush_events_waits_for_the_last_event_not_just_an_empty_queue() -> None:
    """At 5 Events a second, the last few are still waiting for their turn when the queue
    runs empty; a flush must see them sent before the close that follows it."""

    async def main() -> int:
        recorder = Recorder()
        api = api_for(recorder.server)
        api.events_bucket = TokenBucket(qps=5, burst=1)
        cluster = KubeCluster(api, scope=CacheScope.one_node(NODE))
        await cluster.start(timeout=5)
        for step in range(8):
            await cluster.record_event("Node", NODE, "Step", f"step {step}")
        await cluster.flush_events(timeout=30)
        await cluster.close()
        await api.close()
        return sum(1 for collection, _ in recorder.server.objects if collection.endswith("/events"))

    assert asyncio.run(main()) == 8
