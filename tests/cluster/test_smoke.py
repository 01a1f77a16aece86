"""The tier proves itself: real scheduling onto a kwok Node, and evictions under a real PDB.

Everything the test asserts is done by the upstream binaries: the Deployment and ReplicaSet
controllers create the pod, kube-scheduler binds it, kwok (standing in for a kubelet) makes
it Running, the disruption controller computes the PDB's status, and the apiserver's
eviction subresource answers 429 while the budget forbids the eviction.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.models.apps_v1 import DeploymentSpec
from lightkube.models.core_v1 import (
    Container,
    NodeSpec,
    NodeStatus,
    PodSpec,
    PodTemplateSpec,
)
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.models.policy_v1 import PodDisruptionBudgetSpec
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.policy_v1 import PodDisruptionBudget

from spotwright.testing.cluster import KWOK_NODE_ANNOTATION, TestCluster

pytestmark = pytest.mark.cluster

T = TypeVar("T")
TIMEOUT = 60.0


async def eventually(what: str, probe: Callable[[], Awaitable[T | None]]) -> T:
    """Poll ``probe`` until it returns something truthy; fail after TIMEOUT seconds."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        result = await probe()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {TIMEOUT:.0f}s waiting for {what}")
        await asyncio.sleep(0.2)


def is_ready(pod: Pod) -> bool:
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


async def running_pods(client: AsyncClient, namespace: str) -> list[Pod]:
    return [
        pod
        async for pod in client.list(Pod, namespace=namespace, labels={"app": "smoke"})
        if pod.metadata
        and pod.metadata.deletionTimestamp is None
        and pod.status is not None
        and pod.status.phase == "Running"
        and is_ready(pod)
    ]


async def evict(client: AsyncClient, pod: Pod) -> None:
    assert pod.metadata is not None and pod.metadata.name is not None
    name, namespace = pod.metadata.name, pod.metadata.namespace
    await client.create(
        Pod.Eviction(metadata=ObjectMeta(name=name, namespace=namespace)),
        name=name,
        namespace=namespace,
    )


def kwok_node(name: str) -> Node:
    key, value = KWOK_NODE_ANNOTATION
    return Node(
        metadata=ObjectMeta(
            name=name,
            annotations={key: value},
            labels={key: value, "kubernetes.io/hostname": name, "type": "kwok"},
        ),
        spec=NodeSpec(providerID=f"kwok://{name}"),
        status=NodeStatus(
            capacity={"cpu": "4", "memory": "16Gi", "pods": "110"},
            allocatable={"cpu": "4", "memory": "16Gi", "pods": "110"},
        ),
    )


def smoke_deployment(node_name: str) -> Deployment:
    labels = {"app": "smoke"}
    return Deployment(
        metadata=ObjectMeta(name="smoke", labels=labels),
        spec=DeploymentSpec(
            replicas=1,
            selector=LabelSelector(matchLabels=labels),
            template=PodTemplateSpec(
                metadata=ObjectMeta(labels=labels),
                spec=PodSpec(
                    # Pinned to this test's node so parallel tests cannot interfere; the
                    # binding is still the scheduler's decision.
                    nodeSelector={"kubernetes.io/hostname": node_name},
                    terminationGracePeriodSeconds=1,
                    containers=[Container(name="app", image="registry.invalid/smoke:1")],
                ),
            ),
        ),
    )


async def scenario(cluster: TestCluster, namespace: str) -> None:
    client = AsyncClient(KubeConfig.from_file(cluster.kubeconfig), namespace=namespace)
    node_name = f"kwok-{namespace}"[:63]
    try:
        await client.create(kwok_node(node_name))

        async def node_ready() -> bool:
            node = await client.get(Node, node_name)
            conditions = (node.status.conditions if node.status else None) or []
            return any(c.type == "Ready" and c.status == "True" for c in conditions)

        await eventually(f"kwok to make Node {node_name} Ready", node_ready)
        node = await client.get(Node, node_name)
        assert node.status is not None and node.status.allocatable == {
            "cpu": "4",
            "memory": "16Gi",
            "pods": "110",
        }  # status given at creation is kept: tests control what the scheduler sees

        await client.create(smoke_deployment(node_name))

        async def one_running() -> Pod | None:
            pods = await running_pods(client, namespace)
            return pods[0] if len(pods) == 1 else None

        pod = await eventually("the Deployment's pod to be Running", one_running)
        assert pod.metadata is not None and pod.metadata.name is not None
        pod_name, pod_uid = pod.metadata.name, pod.metadata.uid
        assert pod.spec is not None and pod.spec.nodeName == node_name
        assert pod.spec.schedulerName == "default-scheduler"
        assert pod.status is not None and pod.status.podIP  # kwok assigned one from --cidr
        scheduled = [c for c in pod.status.conditions or [] if c.type == "PodScheduled"]
        assert scheduled and scheduled[0].status == "True"

        # A budget that allows no disruption: the eviction must be refused with 429.
        await client.create(
            PodDisruptionBudget(
                metadata=ObjectMeta(name="smoke"),
                spec=PodDisruptionBudgetSpec(
                    minAvailable=1, selector=LabelSelector(matchLabels={"app": "smoke"})
                ),
            )
        )

        async def pdb_status(allowed: int) -> bool:
            pdb = await client.get(PodDisruptionBudget, "smoke")
            status = pdb.status
            return bool(
                status is not None
                and pdb.metadata is not None
                and status.observedGeneration == pdb.metadata.generation
                and status.currentHealthy == 1
                and status.disruptionsAllowed == allowed
            )

        await eventually("the PDB to allow 0 disruptions", lambda: pdb_status(0))
        with pytest.raises(ApiError) as refused:
            await evict(client, pod)
        assert refused.value.status.code == 429, refused.value.status
        assert "disruption budget" in (refused.value.status.message or "")
        still_there = await client.get(Pod, pod_name)
        assert still_there.metadata is not None and still_there.metadata.deletionTimestamp is None

        # Relax the budget: the same eviction now succeeds, and the pod is replaced.
        await client.patch(
            PodDisruptionBudget,
            "smoke",
            {"spec": {"minAvailable": 0}},
        )
        await eventually("the PDB to allow 1 disruption", lambda: pdb_status(1))
        await evict(client, pod)

        async def replaced() -> Pod | None:
            pods = await running_pods(client, namespace)
            fresh = [p for p in pods if p.metadata is not None and p.metadata.uid != pod_uid]
            return fresh[0] if fresh and len(fresh) == len(pods) else None

        replacement = await eventually("a replacement pod to be Running", replaced)
        assert replacement.spec is not None and replacement.spec.nodeName == node_name

        async def evicted_pod_deleted() -> bool:
            try:
                await client.get(Pod, pod_name)
            except ApiError as exc:
                return exc.status.code == 404
            return False

        await eventually("the evicted pod to be deleted", evicted_pod_deleted)
    finally:
        with contextlib.suppress(ApiError):
            await client.delete(Node, node_name)
        await client.close()


def test_scheduling_onto_kwok_node_and_pdb_guarded_eviction(
    test_cluster: TestCluster, namespace: str
) -> None:
    asyncio.run(scenario(test_cluster, namespace))


def test_service_account_kubeconfig_is_subject_to_rbac(test_cluster: TestCluster) -> None:
    """A minted ServiceAccount kubeconfig authenticates, and RBAC (not system:masters) rules."""
    path = test_cluster.service_account_kubeconfig("smoke-rbac", "probe")

    async def check() -> None:
        client = AsyncClient(KubeConfig.from_file(path))
        try:
            with pytest.raises(ApiError) as forbidden:
                await client.get(Node, "does-not-matter")
            assert forbidden.value.status.code == 403
            assert "system:serviceaccount:smoke-rbac:probe" in (
                forbidden.value.status.message or ""
            )
        finally:
            await client.close()

    asyncio.run(check())
    test_cluster.delete_namespace("smoke-rbac")
