"""The Kubernetes adapter's moving parts against a real API server (no fakes).

* the informer lists, resumes a watch from a version, and on 410 Gone lists again,
  announcing exactly the changes it missed;
* Lease leader election: one winner among racers, renewal, takeover after expiry, release,
  and stepping down at once when the Lease is taken;
* ``KubeCluster``: NodeClaims as custom resources (status patches that only carry what
  changed, deletion held by the finalizer, conflict-safe finalizer removal), taints merged
  by key, and evictions refused with 429 under a budget.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from _e2e import NAMESPACE, NodeClaimCR, admin, eventually
from lightkube.types import PatchType

from spotwright.adapters.kube.client import NODES, Api, connect
from spotwright.adapters.kube.cluster import KubeCluster
from spotwright.adapters.kube.convert import node_from_api
from spotwright.adapters.kube.informer import Informer
from spotwright.adapters.kube.leader import LeaderElector, LostLeadership
from spotwright.model.nodeclaim import FINALIZER
from spotwright.model.objects import Node as NodeRecord
from spotwright.model.objects import NodeClaim, Pod, Taint
from spotwright.model.resources import Resources
from spotwright.ports.cluster import EvictionBlocked
from spotwright.testing.cluster import TestCluster

pytestmark = pytest.mark.cluster


@pytest.fixture
def installed(controller_kubeconfig: Path) -> Path:
    """spotwright's CRDs and RBAC: the session's one installation (conftest.py)."""
    return controller_kubeconfig


@contextlib.asynccontextmanager
async def api_for(cluster: TestCluster) -> AsyncIterator[Api]:
    api = Api(connect(cluster.kubeconfig))
    try:
        yield api
    finally:
        await api.close()


def plain_node(name: str, label: str) -> dict[str, Any]:
    """A Node nobody manages (no kwok annotation): just an object to cache."""
    return {"metadata": {"name": name, "labels": {"informer-test": label}}, "spec": {}}


# ---------------------------------------------------------------------------------------
# The informer


def test_informer_resumes_and_relists_after_410(test_cluster: TestCluster) -> None:
    """On a control plane of its own whose apiserver watches etcd directly
    (``--watch-cache=false``): the watch cache would otherwise serve old versions from
    memory, and only a compaction of etcd makes a version truly gone."""
    own = TestCluster(test_cluster.bin_dir, extra_args={"kube-apiserver": ["--watch-cache=false"]})
    with own:
        asyncio.run(_informer(own))


async def _informer(cluster: TestCluster) -> None:
    label = secrets.token_hex(4)
    names = [f"informer-{label}-{i}" for i in range(3)]
    async with api_for(cluster) as api:
        for name in names[:2]:
            await api.create(NODES, plain_node(name, label))
        changes: list[tuple[str, str]] = []

        def listener(change: str, key: str, old: object, new: object) -> None:
            # The node lifecycle controller keeps modifying these nodes (taints for an
            # unready node); arrivals and departures are what the test follows.
            if key in names and change != "MODIFIED":
                changes.append((change, key))

        informer: Informer[NodeRecord] = Informer(api, NODES, node_from_api, listener=listener)
        task = asyncio.create_task(informer.run())
        await asyncio.wait_for(informer.synced.wait(), 30)
        assert {n for n in names[:2]} <= set(informer.items)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        stopped_at = informer.resource_version
        assert stopped_at is not None

        # While nobody watches: one node goes, another comes.
        await api.delete(NODES, names[0])
        await api.create(NODES, plain_node(names[2], label))

        # Resuming from a version the server still has replays exactly the two changes.
        changes.clear()
        task = asyncio.create_task(informer.run(resume_from=stopped_at))
        await eventually("the watch to replay the missed changes", _has(changes, 2), timeout=30)
        assert changes == [("DELETED", names[0]), ("ADDED", names[2])]
        assert informer.relists == 0

        # A version compacted away: 410 Gone, list again, announce the difference.
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        stopped_at = informer.resource_version
        await api.delete(NODES, names[1])
        # One more write, so that the compaction is past the deletion itself.
        await api.patch(NODES, names[2], {"metadata": {"labels": {"after": "delete"}}})
        await asyncio.to_thread(compact_etcd, cluster)
        changes.clear()
        task = asyncio.create_task(informer.run(resume_from=stopped_at))
        await eventually("a relist after 410", lambda: _value(informer.relists >= 1), timeout=30)
        await eventually("the relist's changes", _has(changes, 1), timeout=30)
        assert changes == [("DELETED", names[1])]
        assert names[2] in informer.items and names[1] not in informer.items
        # ... and it watches on from the new list.
        await api.patch(NODES, names[2], {"metadata": {"labels": {"touched": "yes"}}})
        await eventually(
            "the watch after the relist",
            lambda: _value(informer.items[names[2]].labels.get("touched") == "yes"),
            timeout=30,
        )
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await api.delete(NODES, names[2])


def compact_etcd(cluster: TestCluster) -> None:
    """Compact etcd's history up to now, as the API server does every five minutes."""
    base = f"http://127.0.0.1:{cluster.ports['etcd']}/v3"

    def call(path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer

    revision = int(
        call("/kv/range", {"key": base64.b64encode(b"/").decode()})["header"]["revision"]
    )
    call("/kv/compaction", {"revision": revision, "physical": True})


def _has(changes: list[Any], count: int) -> Any:
    async def probe() -> bool:
        return len(changes) >= count

    return probe


async def _value(value: bool) -> bool:
    return value


# ---------------------------------------------------------------------------------------
# Leader election


def elector(api: Api, lease: str, identity: str) -> LeaderElector:
    return LeaderElector(
        api,
        namespace=NAMESPACE,
        name=lease,
        identity=identity,
        lease_seconds=3.0,
        renew_deadline=2.0,
        retry_seconds=0.5,
    )


def test_leader_election_state_machine(test_cluster: TestCluster, installed: Path) -> None:
    asyncio.run(_election(test_cluster))


async def _election(cluster: TestCluster) -> None:
    lease = f"election-{secrets.token_hex(4)}"
    async with api_for(cluster) as api_a, api_for(cluster) as api_b:
        a, b = elector(api_a, lease, "a"), elector(api_b, lease, "b")
        # Racing for a Lease that does not exist yet: exactly one wins.
        results = await asyncio.gather(a.try_acquire_or_renew(), b.try_acquire_or_renew())
        assert sorted(results) == [False, True]
        leader, standby = (a, b) if results[0] else (b, a)
        assert leader.is_leader and not standby.is_leader
        # Renewal keeps it; the standby keeps being refused.
        for _ in range(3):
            await asyncio.sleep(0.5)
            assert await leader.try_acquire_or_renew()
            assert not await standby.try_acquire_or_renew()
        assert leader.record is not None and leader.record.transitions == 0

        # The leader stops renewing (it "died"): the standby takes over once it expires.
        stopped = time.monotonic()
        await asyncio.wait_for(standby.acquire(), 10)
        took = time.monotonic() - stopped
        assert 2.0 <= took <= 3.0 + 1.0, took
        assert standby.is_leader
        assert standby.record is not None and standby.record.transitions == 1
        # The old leader finds the Lease taken: it may not renew it.
        assert not await leader.try_acquire_or_renew()

        # A clean release hands over without waiting for expiry.
        await standby.release()
        assert not standby.is_leader
        started = time.monotonic()
        await asyncio.wait_for(leader.acquire(), 5)
        assert time.monotonic() - started < 1.5

        # Taken from under a running leader: the work is cancelled at once.
        cancelled = asyncio.Event()

        async def work() -> None:
            try:
                await asyncio.Event().wait()
            finally:
                cancelled.set()

        running = asyncio.create_task(leader.run(work))
        await asyncio.sleep(0.2)
        client = admin(cluster, NAMESPACE)
        try:
            from lightkube.resources.coordination_v1 import Lease

            await client.patch(
                Lease, lease, {"spec": {"holderIdentity": "intruder"}}, namespace=NAMESPACE
            )
        finally:
            await client.close()
        taken = time.monotonic()
        with pytest.raises(LostLeadership):
            await asyncio.wait_for(running, 5)
        assert cancelled.is_set() and not leader.is_leader
        assert time.monotonic() - taken <= leader.retry_seconds + 1.0


# ---------------------------------------------------------------------------------------
# KubeCluster


def test_kube_cluster_port(test_cluster: TestCluster, installed: Path, namespace: str) -> None:
    asyncio.run(_port(test_cluster, namespace))


async def _port(cluster: TestCluster, namespace: str) -> None:
    async with api_for(cluster) as api:
        kube = KubeCluster(api, identity="adapter-test")
        await kube.start()
        events = kube.watch("nodeclaim", "node")
        try:
            await _claims(kube, api, cluster)
            await _taints(kube, api)
            await _eviction(kube, cluster, namespace)
        finally:
            events.close()  # type: ignore[attr-defined]
            await kube.close()


async def _claims(kube: KubeCluster, api: Api, cluster: TestCluster) -> None:
    name = f"adapter-{secrets.token_hex(3)}"
    claim = NodeClaim(name=name, nodepool="adapter", requests=Resources(cpu=1500, pods=2))
    await kube.create_node_claim(claim)
    cached = kube.node_claim(name)
    assert cached is not None and cached.requests == Resources(cpu=1500, pods=2)
    # A controller holds a record while the claim changes under it (someone else writes
    # the zone, another controller the launch result); its own update must undo neither.
    stale = kube.node_claim(name)
    assert stale is not None
    client = admin(cluster)
    try:
        await client.patch(
            NodeClaimCR.Status, name, {"status": {"zone": "us-east-1a"}}, patch_type=PatchType.MERGE
        )
        await eventually(
            "the cache to see the zone",
            lambda: _value(getattr(kube.node_claim(name), "zone", "") == "us-east-1a"),
        )
        fresh = kube.node_claim(name)
        assert fresh is not None and fresh is not stale
        fresh.provider_id = "aws:///us-east-1a/i-0abc"
        fresh.launched_at = time.time()
        await kube.update_node_claim(fresh)
        stale.drain_deadline = time.time() + 120
        await kube.update_node_claim(stale)
        stored = await client.get(NodeClaimCR, name)
        status = stored["status"]
        assert status["providerID"] == "aws:///us-east-1a/i-0abc", status  # not undone
        assert status["zone"] == "us-east-1a", status
        assert "drainDeadline" in status
        assert [c["type"] for c in status["conditions"]][:1] == ["Launched"]
        # Someone else's finalizer, added while that is still allowed.
        await client.patch(
            NodeClaimCR,
            name,
            {"metadata": {"finalizers": [FINALIZER, "example.com/keep"]}},
            patch_type=PatchType.MERGE,
        )
        await eventually(
            "the cache to see the second finalizer",
            lambda: _value("example.com/keep" in kube.claims.informer.items[name].finalizers),
        )
        # Deletion is held by the finalizers until remove_node_claim.
        current = kube.node_claim(name)
        assert current is not None
        current.deleting_since = time.time()
        current.deletion_reason = "spot_interruption"
        await kube.update_node_claim(current)
        held = await client.get(NodeClaimCR, name)
        assert held["metadata"]["deletionTimestamp"]
        assert held["status"]["deletionReason"] == "spot_interruption"
        assert (kube.node_claim(name) or current).deleting_since is not None  # read-your-writes
        # Ours is dropped; theirs survives (the write is conditional, not an overwrite).
        await kube.remove_node_claim(name)
        kept = await client.get(NodeClaimCR, name)
        assert kept["metadata"]["finalizers"] == ["example.com/keep"]
        await client.patch(
            NodeClaimCR, name, {"metadata": {"finalizers": None}}, patch_type=PatchType.MERGE
        )
        await eventually("the claim to be gone", lambda: _value(kube.node_claim(name) is None))
    finally:
        await client.close()


async def _taints(kube: KubeCluster, api: Api) -> None:
    name = f"adapter-node-{secrets.token_hex(3)}"
    await api.create(
        NODES,
        {
            "metadata": {"name": name},
            "spec": {"taints": [{"key": "theirs", "value": "x", "effect": "NoExecute"}]},
        },
    )
    await eventually("the node in the cache", lambda: _value(kube.node(name) is not None))
    await kube.patch_node(
        name,
        add_taints=[Taint("karpenter.sh/disrupted", "NoSchedule")],
        unschedulable=True,
        labels={"example.com/drained": "yes"},
    )
    node = kube.node(name)  # read-your-writes: no waiting for the watch
    assert node is not None and node.unschedulable
    # (The node lifecycle controller may add not-ready taints of its own meanwhile.)
    assert {
        Taint("theirs", "NoExecute", "x"),
        Taint("karpenter.sh/disrupted", "NoSchedule"),
    } <= set(node.taints)
    await kube.patch_node(
        name, remove_taints=["karpenter.sh/disrupted"], labels={"example.com/drained": None}
    )
    node = kube.node(name)
    assert node is not None and Taint("theirs", "NoExecute", "x") in node.taints
    assert all(t.key != "karpenter.sh/disrupted" for t in node.taints)
    assert "example.com/drained" not in node.labels
    await kube.delete_node(name)
    assert kube.node(name) is None


async def _eviction(kube: KubeCluster, cluster: TestCluster, namespace: str) -> None:
    """A Running pod under a budget that needs it: the Eviction API answers 429.

    (A Pending pod may always be evicted, so the pod is bound to a kwok node.)
    """
    node_name = f"adapter-kwok-{secrets.token_hex(3)}"
    allocatable = {"cpu": "2", "memory": "4Gi", "pods": "10"}
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node_name, "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "status": {"capacity": allocatable, "allocatable": allocatable},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "guarded", "labels": {"app": "guarded"}},
        "spec": {
            "nodeName": node_name,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "registry.invalid/x:1"}],
        },
    }
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "guarded"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
    }
    for path, body in (
        ("/api/v1/nodes", node),
        (f"/api/v1/namespaces/{namespace}/pods", pod),
        (f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets", budget),
    ):
        status, answer = cluster.request("POST", path, body)
        assert status == 201, answer
    key = f"{namespace}/guarded"

    async def running() -> Pod | None:
        found = kube.pod(key)
        return found if found is not None and found.ready else None

    cached = await eventually("the pod Running and Ready in the cache", running, timeout=60)
    assert kube.pods_on(node_name) == [cached]

    async def refused() -> bool:
        try:
            await kube.evict(cached)
        except EvictionBlocked as refusal:
            # The drain's Warning Event names the budget: the real 429 must carry it.
            assert refusal.budget == f"{namespace}/guarded", refusal
            return True
        pytest.fail("the eviction went through although the budget forbids it")

    await eventually("the eviction to be refused with 429", refused, timeout=30)
    await kube.delete_pod(cached, grace_seconds=0)
    current = kube.pod(key)
    assert current is None or current.terminating
    await eventually("the pod to be gone", lambda: _value(kube.pod(key) is None), timeout=30)
    assert kube.pods_on(node_name) == []
    await kube.delete_node(node_name)


# ---------------------------------------------------------------------------------------
# The CRDs on a real API server


def test_crds_accept_what_the_models_accept(test_cluster: TestCluster, installed: Path) -> None:
    from spotwright.model.nodeclass import EC2NodeClass
    from spotwright.model.nodepool import NodePool

    name = f"crd-{secrets.token_hex(3)}"
    pool = {
        "apiVersion": "spotwright.io/v1alpha1",
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": {
            "template": {
                "spec": {
                    "requirements": [
                        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}
                    ],
                    "nodeClassRef": {"name": name},
                    "expireAfter": "Never",
                }
            },
            "limits": {"cpu": "1000", "memory": "1000Gi"},
            "disruption": {"consolidateAfter": "30s", "budgets": [{"nodes": "10%"}]},
        },
    }
    nodeclass = {
        "apiVersion": "spotwright.io/v1alpha1",
        "kind": "EC2NodeClass",
        "metadata": {"name": name},
        "spec": {
            "role": "KarpenterNodeRole-test",
            "amiSelectorTerms": [{"alias": "al2023@latest"}],
            "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": "test"}}],
            "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": "test"}}],
        },
    }
    for plural, body, model in (
        ("nodepools", pool, NodePool),
        ("ec2nodeclasses", nodeclass, EC2NodeClass),
    ):
        path = f"/apis/spotwright.io/v1alpha1/{plural}"
        status, stored = test_cluster.request("POST", path, body)
        assert status == 201, stored
        model.model_validate({k: v for k, v in stored.items() if k != "status"})  # defaults too
        status, refused = test_cluster.request(
            "POST", path, {**body, "metadata": {"name": f"{name}-bad"}, "spec": {"bogus": 1}}
        )
        assert status == 422 or plural == "nodepools", refused  # spec requirements enforced
        test_cluster.request("DELETE", f"{path}/{name}")
    # A weight out of range is refused by the API server, as by the model.
    bad = {**pool, "metadata": {"name": f"{name}-w"}, "spec": {**pool["spec"], "weight": 500}}
    status, refused = test_cluster.request("POST", "/apis/spotwright.io/v1alpha1/nodepools", bad)
    assert status == 422, refused
