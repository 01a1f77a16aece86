"""The shipped ClusterRoles grant exactly what the controller's calls need.

Every call the Kubernetes adapter makes is recorded (``Api.used``) as the RBAC permission
it needs. This test drives every code path that talks to the API server (the caches, every
write of the Cluster port, NodeClaim finalizer removal including its conflict retry, leader
election, the NodePool cache and the kwok cloud's fake Nodes) against a small in-process
API server, and compares the recorded permissions with the rules in ``deploy/``: a call
added without its rule, or a rule kept after its call went away, fails here. That the
rules are also *sufficient* on a real API server is shown by the real-cluster tier, where
the controller runs as a ServiceAccount bound to these roles only.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import yaml
from lightkube import AsyncClient, KubeConfig

from spotwright.adapters.kube.client import Api, Permission
from spotwright.adapters.kube.cluster import KubeCluster
from spotwright.adapters.kube.kwok import KwokCloud
from spotwright.adapters.kube.leader import LeaderElector
from spotwright.adapters.kube.nodeclasses import LiveNodeClasses
from spotwright.adapters.kube.nodepools import LiveNodePools
from spotwright.adapters.kube.scope import CacheScope
from spotwright.catalog import load_catalog
from spotwright.model.objects import NodeClaim, Pod, Taint
from spotwright.model.resources import Resources
from spotwright.ports.clock import LoopClock
from spotwright.ports.cloud import Instance

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


class FakeApiServer:
    """Just enough of an API server: objects by path, resourceVersions, 404/409, watches
    that stay open, finalizers, and one injectable conflict."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = itertools.count(1)
        self.conflicts: set[str] = set()

    def handler(self, request: httpx2.Request) -> httpx2.Response:
        parts = request.url.path.strip("/").split("/")
        base = parts[:2] if parts[0] == "api" else parts[:3]
        rest = parts[len(base) :]
        namespace = ""
        if rest and rest[0] == "namespaces" and len(rest) > 2:
            namespace, rest = rest[1], rest[2:]
        plural, name, sub = rest[0], (rest[1:2] or [""])[0], (rest[2:3] or [""])[0]
        collection = "/".join([*base, plural])
        key = (collection, f"{namespace}/{name}")
        if request.method == "GET" and not name:
            if request.url.params.get("watch") == "true":
                return httpx2.Response(200, stream=_Forever())
            items = [o for (c, _), o in self.objects.items() if c == collection]
            return _json(200, {"items": items, "metadata": {"resourceVersion": "1"}})
        if request.method == "GET":
            found = self.objects.get(key)
            return _json(200, found) if found else _status(404, "NotFound")
        if request.method == "POST" and sub == "eviction":
            return _json(201, {"kind": "Status", "status": "Success"})
        if request.method == "POST":
            body = json.loads(request.content)
            meta = body.setdefault("metadata", {})
            meta.setdefault("name", meta.get("generateName", "x") + str(next(self.version)))
            key = (collection, f"{namespace}/{meta['name']}")
            if key in self.objects:
                return _status(409, "AlreadyExists")
            self._stamp(body, namespace)
            self.objects[key] = body
            return _json(201, body)
        current = self.objects.get(key)
        if current is None:
            return _status(404, "NotFound")
        if request.method == "PATCH":
            patch = json.loads(request.content)
            wanted = (patch.get("metadata") or {}).pop("resourceVersion", None)
            if name in self.conflicts or (
                wanted and wanted != current["metadata"]["resourceVersion"]
            ):
                self.conflicts.discard(name)
                return _status(409, "Conflict")
            _merge(current, patch)
            self._stamp(current, namespace)
            return _json(200, current)
        if request.method == "DELETE":
            if current["metadata"].get("finalizers"):
                current["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
            else:
                del self.objects[key]
            return _json(200, {"kind": "Status", "status": "Success"})
        return _status(405, "MethodNotAllowed")

    def _stamp(self, obj: dict[str, Any], namespace: str) -> None:
        meta = obj["metadata"]
        meta["resourceVersion"] = str(next(self.version))
        meta.setdefault("uid", f"uid-{meta['resourceVersion']}")
        meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
        if namespace:
            meta["namespace"] = namespace


class _Forever(httpx2.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        await asyncio.Event().wait()
        yield b""


def _json(code: int, body: dict[str, Any]) -> httpx2.Response:
    return httpx2.Response(code, json=body, headers={"Content-Type": "application/json"})


def _status(code: int, reason: str) -> httpx2.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code}
    return _json(code, {**body, "reason": reason, "message": reason})


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value


def api_for(server: FakeApiServer) -> Api:
    kubeconfig = KubeConfig.from_dict(
        {
            "clusters": [{"name": "fake", "cluster": {"server": "https://fake.invalid"}}],
            "users": [{"name": "fake", "user": {"token": "t"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
            "current-context": "fake",
        }
    )
    transport = httpx2.MockTransport(server.handler)
    return Api(AsyncClient(config=kubeconfig, transport=transport), qps=1000, burst=1000)


def granted(*files: str) -> set[Permission]:
    """The permissions the ClusterRoles in ``files`` grant, one per (group, resource, verb)."""
    out: set[Permission] = set()
    for name in files:
        for doc in yaml.safe_load_all((DEPLOY / name).read_text()):
            if doc and doc["kind"] == "ClusterRole":
                for rule in doc["rules"]:
                    out |= {
                        Permission(group, resource, verb)
                        for group, resource, verb in itertools.product(
                            rule["apiGroups"], rule["resources"], rule["verbs"]
                        )
                    }
    return out


async def exercise(sim: bool) -> set[Permission]:
    server = FakeApiServer()
    api = api_for(server)
    # The controller's scope: no PodDisruptionBudgets (the Eviction API enforces them).
    cluster = KubeCluster(api, identity="test", scope=CacheScope(pdbs=False))
    pools = LiveNodePools(api)
    classes = LiveNodeClasses(api)
    pools_task = asyncio.create_task(pools.informer.run())
    classes_task = asyncio.create_task(classes.informer.run())
    await cluster.start(timeout=5)
    await pools.informer.synced.wait()
    await classes.informer.synced.wait()
    # NodeClaims: create, launch result, deletion, finalizer removal after a conflict.
    claim = NodeClaim(name="default-00001", nodepool="default", requests=Resources(cpu=1000))
    await cluster.create_node_claim(claim)
    cached = cluster.node_claim("default-00001")
    assert cached is not None
    cached.provider_id = "aws:///us-east-1a/i-0123"
    cached.instance_type = "m5.large"
    await cluster.update_node_claim(cached)
    cached = cluster.node_claim("default-00001")
    assert cached is not None
    cached.deleting_since = 1.0
    await cluster.update_node_claim(cached)
    server.conflicts.add("default-00001")
    await cluster.remove_node_claim("default-00001")
    # Nodes and pods.
    node = {"metadata": {"name": "n1"}, "spec": {}, "status": {}}
    server.objects[("api/v1/nodes", "/n1")] = node
    server._stamp(node, "")
    cluster.nodes_cache.apply(node)  # the fake's watches never deliver: seed the cache
    server.conflicts.add("n1")  # taints are conditioned on the version: re-read on 409
    await cluster.patch_node("n1", add_taints=[Taint("k", "NoSchedule")], unschedulable=True)
    await cluster.evict(Pod(name="p", namespace="ns", uid="u"))
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}
    server.objects[("api/v1/pods", "ns/p")] = pod
    server._stamp(pod, "ns")
    await cluster.delete_pod(Pod(name="p", namespace="ns"), grace_seconds=1)
    await cluster.record_event("Node", "n1", "Cordoned", "test")
    await cluster.flush_events()
    await cluster.delete_node("n1")
    # Leader election: acquire (create), renew (get + patch), release (patch).
    elector = LeaderElector(api, namespace="spotwright", identity="test")
    assert await elector.try_acquire_or_renew()
    assert await elector.try_acquire_or_renew()
    await elector.release()
    if sim:
        catalog = load_catalog()
        kwok = KwokCloud(
            cluster, api, catalog.types, region="us-east-1", zones=["us-east-1a"], clock=LoopClock()
        )
        instance = Instance("i-1", "m5.large", "us-east-1a", "spot", 0.04, 0.0, "ip-10-0-0-1")
        await kwok._create_node(instance)
        await kwok._delete_node("ip-10-0-0-1")
    pools_task.cancel()
    classes_task.cancel()
    await cluster.close()
    await api.close()
    return api.used


def run(sim: bool) -> set[Permission]:
    return asyncio.run(exercise(sim))


def test_the_cluster_role_grants_exactly_what_the_controller_calls_need() -> None:
    used = run(sim=False)
    assert used == granted("rbac.yaml"), (
        f"missing from deploy/rbac.yaml: {sorted(used - granted('rbac.yaml'))}; "
        f"granted but never used: {sorted(granted('rbac.yaml') - used)}"
    )


def test_the_sim_role_adds_exactly_fake_node_creation() -> None:
    used = run(sim=True)
    assert used == granted("rbac.yaml", "rbac-sim.yaml")
    assert granted("rbac-sim.yaml") == {Permission("", "nodes", "create")}


def test_the_bindings_name_the_shipped_service_account() -> None:
    def docs() -> Iterator[dict[str, Any]]:
        for name in ("rbac.yaml", "rbac-sim.yaml"):
            yield from (d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d)

    accounts = {
        (d["metadata"]["namespace"], d["metadata"]["name"])
        for d in docs()
        if d["kind"] == "ServiceAccount"
    }
    roles = {d["metadata"]["name"] for d in docs() if d["kind"] == "ClusterRole"}
    for binding in (d for d in docs() if d["kind"] == "ClusterRoleBinding"):
        assert binding["roleRef"]["name"] in roles
        assert {(s["namespace"], s["name"]) for s in binding["subjects"]} <= accounts
