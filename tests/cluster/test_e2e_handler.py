"""The IMDS-mode handler on a real API server, as its own ServiceAccount under the shipped
handler ClusterRole (deploy/handler-daemonset.yaml) and nothing else.

* its cluster caches its own node's share only: its Node and the pods bound to it, from
  the first list on and for every change after (a pod created on another node is never
  seen), no NodeClaims, no budgets; the cluster's Nodes and NodeClaims appear inside
  ``capacity_view()`` and are gone after it;
* a spot notice raised on an IMDS mock ends, through the command's own wiring
  (``HandlerService``), with its node tainted, cordoned and drained, the other node and
  its pods untouched, and every step recorded as an Event;
* ``flush_events`` sends the last Events before the shutdown: none is lost when they were
  still waiting for their rate limit as the queue ran empty.
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from _e2e import DEPLOY, NAMESPACE, _collection_path, eventually

from spotwright.adapters.kube.client import Api, connect
from spotwright.adapters.kube.cluster import KubeCluster
from spotwright.adapters.kube.nodeclaims import claim_to_api
from spotwright.adapters.kube.scope import CacheScope
from spotwright.cli.handler import HandlerOptions, HandlerService
from spotwright.events.actions import ActionPolicy
from spotwright.events.imds_source import PollerSettings
from spotwright.imds import CONTROL_PREFIX, MockConfig, start_mock
from spotwright.model import labels as wk
from spotwright.model.objects import NodeClaim
from spotwright.testing.cluster import TestCluster

pytestmark = pytest.mark.cluster

HANDLER_ACCOUNT = "spotwright-handler"
INSTANCE = "i-1234567890abcdef0"  # the IMDS mock's default instance
OTHER_INSTANCE = "i-0fedcba9876543210"


@pytest.fixture(scope="module")
def handler_kubeconfig(test_cluster: TestCluster, controller_kubeconfig: Path) -> Path:
    """The CRDs (the session's installation), and the handler's own RBAC objects from its
    manifest (the DaemonSet itself is not run): its ServiceAccount holds that role only."""
    import yaml

    for doc in yaml.safe_load_all((DEPLOY / "handler-daemonset.yaml").read_text()):
        if not doc or doc["kind"] == "DaemonSet":
            continue
        status, body = test_cluster.request("POST", _collection_path(doc), doc)
        if status not in (201, 409):
            raise RuntimeError(f"applying {doc['kind']} {doc['metadata']['name']}: {body}")
    return test_cluster.service_account_kubeconfig(NAMESPACE, HANDLER_ACCOUNT)


def kwok_node(name: str, instance: str) -> dict[str, Any]:
    allocatable = {"cpu": "4", "memory": "16Gi", "pods": "20"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {wk.INSTANCE_TYPE: "m4.xlarge"},
        },
        "spec": {"providerID": f"aws:///us-east-1a/{instance}"},
        "status": {"capacity": allocatable, "allocatable": allocatable},
    }


def bound_pod(name: str, node: str) -> dict[str, Any]:
    """A pod bound to ``node`` directly: what the scheduler would have done."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "handler-e2e"}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "registry.invalid/x:1"}],
        },
    }


def create(cluster: TestCluster, path: str, body: dict[str, Any]) -> None:
    status, answer = cluster.request("POST", path, body)
    assert status == 201, answer


async def _true(value: bool) -> bool:
    return value


def test_the_handler_sees_and_drains_only_its_own_node(
    test_cluster: TestCluster, handler_kubeconfig: Path, namespace: str
) -> None:
    asyncio.run(_own_node(test_cluster, handler_kubeconfig, namespace))


async def _own_node(cluster: TestCluster, kubeconfig: Path, namespace: str) -> None:
    tag = secrets.token_hex(3)
    mine, other = f"handler-{tag}-mine", f"handler-{tag}-other"
    pods_path = f"/api/v1/namespaces/{namespace}/pods"
    create(cluster, "/api/v1/nodes", kwok_node(mine, INSTANCE))
    create(cluster, "/api/v1/nodes", kwok_node(other, OTHER_INSTANCE))
    for node in (mine, other):
        for index in range(2):
            create(cluster, pods_path, bound_pod(f"{node}-{index}", node))
    my_pods = {f"{namespace}/{mine}-{index}" for index in range(2)}
    claim_name = f"handler-{tag}"
    claim = {
        "apiVersion": "spotwright.io/v1alpha1",
        "kind": "NodeClaim",
        **claim_to_api(NodeClaim(name=claim_name, nodepool="handler-e2e")),
    }
    create(cluster, "/apis/spotwright.io/v1alpha1/nodeclaims", claim)

    api = Api(connect(kubeconfig))
    kube = KubeCluster(api, identity=f"handler-e2e/{tag}", scope=CacheScope.one_node(mine))
    try:
        await kube.start(timeout=60)

        async def my_pods_ready() -> bool:
            return {p.key for p in kube.pods() if p.ready} == my_pods

        await eventually("this node's pods Running in the cache", my_pods_ready, timeout=60)
        assert [n.name for n in kube.nodes()] == [mine]
        assert {p.key for p in kube.pods()} == my_pods
        assert kube.node(other) is None and kube.pods_on(other) == []
        assert kube.node_claims() == [] and kube.pdbs() == []

        # Changes after the list: the other node's new pod is created first, so a watch
        # that let it through would have delivered it before this node's.
        create(cluster, pods_path, bound_pod(f"{other}-late", other))
        create(cluster, pods_path, bound_pod(f"{mine}-late", mine))
        late = f"{namespace}/{mine}-late"
        await eventually("this node's new pod", lambda: _true(kube.pod(late) is not None))
        assert kube.pod(f"{namespace}/{other}-late") is None
        assert {p.key for p in kube.pods()} == my_pods | {late}

        # The replacement wait's view: the cluster's Nodes and NodeClaims, then gone again.
        async with kube.capacity_view():
            assert {mine, other} <= {n.name for n in kube.nodes()}
            assert claim_name in {c.name for c in kube.node_claims()}
        assert [n.name for n in kube.nodes()] == [mine] and kube.node_claims() == []

        await _spot_notice_drains(cluster, kube, mine)
        await kube.flush_events()
    finally:
        await kube.close()
        await api.close()

    status, node = cluster.request("GET", f"/api/v1/nodes/{mine}")
    assert status == 200 and node["spec"].get("unschedulable") is True
    assert wk.DISRUPTED_TAINT_KEY in {t["key"] for t in node["spec"].get("taints") or ()}
    status, untouched = cluster.request("GET", f"/api/v1/nodes/{other}")
    assert status == 200 and not untouched["spec"].get("unschedulable")
    for name in (f"{other}-0", f"{other}-1", f"{other}-late"):
        status, pod = cluster.request("GET", f"{pods_path}/{name}")
        assert status == 200 and not pod["metadata"].get("deletionTimestamp"), name
    reasons = {e["reason"] for e in events_about(cluster, mine)}
    assert {"InterruptionReceived", "Tainted", "Cordoned", "Drained"} <= reasons, reasons
    for name in (mine, other):
        cluster.request("DELETE", f"/api/v1/nodes/{name}")
    cluster.request("DELETE", f"/apis/spotwright.io/v1alpha1/nodeclaims/{claim_name}")


async def _spot_notice_drains(cluster: TestCluster, kube: KubeCluster, node: str) -> None:
    """The command's wiring on this cluster: IMDS says "terminate", the node is drained."""
    async with await start_mock(MockConfig(port=0, require_token=True)) as mock:
        options = HandlerOptions(
            node_name=node,
            imds=PollerSettings(url=mock.url, poll_interval=0.05, backoff_max=0.2),
            policy=ActionPolicy(),
            metrics_port=None,
        )
        service = HandlerService(options, kube, capacity_view=kube.capacity_view)
        assert await service.start()
        running = asyncio.create_task(service.run())
        try:
            async with aiohttp.ClientSession() as session:
                url = f"{mock.url}{CONTROL_PREFIX}/spot-interruption"
                async with session.post(url, json={"delaySeconds": 0}) as answer:
                    assert answer.status == 200
            await eventually(
                "the node's pods evicted", lambda: _true(not kube.pods_on(node)), timeout=60
            )

            async def drained() -> bool:
                found = await asyncio.to_thread(events_about, cluster, node)
                return any(e["reason"] == "Drained" for e in found)

            await eventually("the Drained Event", drained, timeout=60)
        finally:
            service.stop()
            await running
            await service.aclose()


def events_about(cluster: TestCluster, node: str) -> list[dict[str, Any]]:
    status, listing = cluster.request("GET", "/apis/events.k8s.io/v1/namespaces/default/events")
    assert status == 200, listing
    return [e for e in listing["items"] if (e.get("regarding") or {}).get("name") == node]


def test_flushed_events_are_all_sent_before_the_shutdown(
    test_cluster: TestCluster, handler_kubeconfig: Path
) -> None:
    """Events at 5 a second: the last ones are still waiting for their turn when the queue
    runs empty. Every one must be on the API server after flush and close."""
    node = f"flush-{secrets.token_hex(3)}"
    create(test_cluster, "/api/v1/nodes", kwok_node(node, INSTANCE))

    async def main() -> None:
        api = Api(connect(handler_kubeconfig), event_qps=5, event_burst=1)
        kube = KubeCluster(api, identity=f"flush/{node}", scope=CacheScope.one_node(node))
        try:
            await kube.start(timeout=60)
            for step in range(8):
                await kube.record_event("Node", node, "FlushTest", f"step {step}")
            await kube.flush_events(timeout=30)
        finally:
            await kube.close()
            await api.close()
        assert kube.events_failed == 0 and kube.events_dropped == 0

    asyncio.run(main())
    notes = sorted(
        e["note"] for e in events_about(test_cluster, node) if e["reason"] == "FlushTest"
    )
    assert notes == [f"step {step}" for step in range(8)]
    test_cluster.request("DELETE", f"/api/v1/nodes/{node}")
