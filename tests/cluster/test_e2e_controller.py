"""``spotwright controller`` end to end on a real control plane, with kwok Nodes as instances.

Each test runs the controller as its own process, as the ``spotwright-controller``
ServiceAccount bound to the ClusterRoles shipped in ``deploy/`` and nothing else, with
``--cloud sim`` so launched instances become kwok-managed Nodes that the real
kube-scheduler binds pods to. Interruption notices arrive over SQS (a moto server).

1. The interruption walk-through: a spot NodePool (c/m/r, amd64), a Deployment of two
   replicas under a PodDisruptionBudget, a node launched and the pods running on it; a
   spot interruption warning arrives; the node is tainted and cordoned, the pods are
   evicted without ever breaking the budget, a replacement node comes up and the pods run
   there, the old node and its claim are deleted, and the message is deleted.
2. Leader failover: two controllers, the leader killed mid-provisioning; the standby takes
   the Lease within 15 s and finishes the job, and only one instance is ever launched.
3. Restart mid-drain: the controller is killed while a budget holds a drain up; a new
   process picks the drain up from the NodeClaim and completes it, and the interruption
   message, kept in flight all along, is deleted only once the drain is over.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from _e2e import (
    NAMESPACE,
    Controller,
    MotoSqs,
    NodeClaimCR,
    admin,
    controller_args,
    deployment,
    eventually,
    install,
    nodepool,
    pdb,
    remove_pool,
)
from lightkube import ApiError, AsyncClient
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.policy_v1 import PodDisruptionBudget

from spotwright.testing.cluster import TestCluster

pytestmark = pytest.mark.cluster

DISRUPTED = "karpenter.sh/disrupted"


@pytest.fixture(scope="module")
def controller_kubeconfig(test_cluster: TestCluster) -> Path:
    """CRDs and RBAC applied; a kubeconfig of the controller's ServiceAccount."""
    return install(test_cluster)


@pytest.fixture
def sqs() -> Iterator[MotoSqs]:
    queue = MotoSqs()
    try:
        yield queue
    finally:
        queue.stop()


@pytest.fixture
def pool(test_cluster: TestCluster, namespace: str) -> Iterator[str]:
    """A NodePool named after the test's namespace; its nodes and claims go afterwards."""
    name = namespace
    status, body = test_cluster.request(
        "POST", "/apis/spotwright.io/v1alpha1/nodepools", nodepool(name)
    )
    assert status == 201, body
    try:
        yield name
    finally:
        asyncio.run(remove_pool(test_cluster, name))


@contextlib.contextmanager
def controllers(cluster: TestCluster) -> Iterator[list[Controller]]:
    """Started controllers are killed at the end; their logs stay in the cluster's log dir."""
    started: list[Controller] = []
    try:
        yield started
    finally:
        for controller in started:
            controller.kill(signal.SIGTERM)


def create(cluster: TestCluster, path: str, body: dict[str, Any]) -> None:
    status, answer = cluster.request("POST", path, body)
    assert status == 201, answer


def apply_workload(
    cluster: TestCluster, namespace: str, pool_name: str, min_available: int
) -> None:
    create(
        cluster, f"/apis/apps/v1/namespaces/{namespace}/deployments", deployment("web", pool_name)
    )
    create(
        cluster,
        f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets",
        pdb("web", min_available),
    )


# ---------------------------------------------------------------------------------------
# Reading the cluster


async def claims(client: AsyncClient, pool_name: str) -> list[dict[str, Any]]:
    return [c async for c in client.list(NodeClaimCR) if c["spec"].get("nodePool") == pool_name]


async def nodes(client: AsyncClient, pool_name: str) -> list[Node]:
    return [n async for n in client.list(Node, labels={"e2e": pool_name})]


def ready(pod: Pod) -> bool:
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


async def web_pods(client: AsyncClient, namespace: str) -> list[Pod]:
    return [
        p
        async for p in client.list(Pod, namespace=namespace, labels={"app": "web"})
        if p.metadata is not None and p.metadata.deletionTimestamp is None
    ]


async def running_on(client: AsyncClient, namespace: str, node_name: str) -> list[Pod]:
    return [
        p
        for p in await web_pods(client, namespace)
        if p.spec is not None and p.spec.nodeName == node_name and ready(p)
    ]


def instance_id(node: Node) -> str:
    assert node.spec is not None and node.spec.providerID
    return node.spec.providerID.rsplit("/", 1)[-1]


class Census:
    """Every NodeClaim and Node of the pool ever seen, by watching: counts launches."""

    def __init__(self, client: AsyncClient, pool_name: str) -> None:
        self.client = client
        self.pool = pool_name
        self.claims: set[str] = set()
        self.nodes: set[str] = set()
        self.min_ready: int | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Census:
        self._tasks = [
            asyncio.create_task(self._watch_claims()),
            asyncio.create_task(self._watch_nodes()),
        ]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            if task.done() and task.exception() is not None:
                raise AssertionError("a census watch failed") from task.exception()
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _watch_claims(self) -> None:
        async for claim in self._follow(NodeClaimCR, None):
            if claim["spec"].get("nodePool") == self.pool:
                self.claims.add(claim["metadata"]["name"])

    async def _watch_nodes(self) -> None:
        async for node in self._follow(Node, {"e2e": self.pool}):
            if node.metadata is not None and node.metadata.name is not None:
                self.nodes.add(node.metadata.name)

    async def _follow(self, resource: Any, labels: dict[str, Any] | None) -> AsyncIterator[Any]:
        """Every object as it changes; a dropped watch starts again (with the current state)."""
        while True:
            try:
                async for _, obj in self.client.watch(resource, labels=labels):
                    yield obj
            except httpx2.HTTPError:
                await asyncio.sleep(0.1)

    async def track_ready(self, namespace: str, stop: asyncio.Event) -> None:
        """The fewest ready web pods seen while ``stop`` is not set (polled every 100 ms)."""
        while not stop.is_set():
            count = sum(1 for p in await web_pods(self.client, namespace) if ready(p))
            self.min_ready = count if self.min_ready is None else min(self.min_ready, count)
            await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def client_for(
    cluster: TestCluster, namespace: str | None = None
) -> AsyncIterator[AsyncClient]:
    client = admin(cluster, namespace)
    try:
        yield client
    finally:
        await client.close()


async def first_node_running_pods(client: AsyncClient, namespace: str, pool_name: str) -> Node:
    async def both_running() -> Node | None:
        for node in await nodes(client, pool_name):
            assert node.metadata is not None and node.metadata.name is not None
            if len(await running_on(client, namespace, node.metadata.name)) == 2:
                return node
        return None

    return await eventually("both pods Running on a launched node", both_running, timeout=120)


# ---------------------------------------------------------------------------------------
# 1. The interruption walk-through


def test_spot_interruption_walk_through(
    test_cluster: TestCluster,
    controller_kubeconfig: Path,
    namespace: str,
    pool: str,
    sqs: MotoSqs,
) -> None:
    apply_workload(test_cluster, namespace, pool, min_available=1)
    args = controller_args(
        controller_kubeconfig, lease=f"lease-{pool}", queue_url=sqs.url, endpoint=sqs.endpoint
    )
    with controllers(test_cluster) as started:
        started.append(Controller(pool, args, test_cluster.log_dir))
        asyncio.run(_walk_through(test_cluster, namespace, pool, sqs, started[0]))


async def _walk_through(
    cluster: TestCluster, namespace: str, pool_name: str, sqs: MotoSqs, controller: Controller
) -> None:
    async with client_for(cluster, namespace) as client, Census(client, pool_name) as census:
        old = await first_node_running_pods(client, namespace, pool_name)
        assert old.metadata is not None and old.metadata.name is not None
        old_name = old.metadata.name
        (old_claim,) = await claims(client, pool_name)
        assert old_claim["status"]["providerID"] == old.spec.providerID  # type: ignore[union-attr]
        assert old_claim["status"]["capacityType"] == "spot"
        assert old.metadata.annotations and old.metadata.annotations["kwok.x-k8s.io/node"] == "fake"
        assert old.metadata.labels and old.metadata.labels["karpenter.sh/capacity-type"] == "spot"
        category = old.metadata.labels["karpenter.k8s.aws/instance-category"]
        assert category in ("c", "m", "r")

        stop = asyncio.Event()
        tracker = asyncio.create_task(census.track_ready(namespace, stop))
        sent_at = time.monotonic()
        sqs.send_spot_interruption(instance_id(old))

        async def tainted_and_cordoned() -> bool:
            node = await client.get(Node, old_name)
            taints = (node.spec.taints if node.spec else None) or []
            return bool(node.spec and node.spec.unschedulable) and any(
                t.key == DISRUPTED and t.effect == "NoSchedule" for t in taints
            )

        await eventually("the interrupted node to be tainted and cordoned", tainted_and_cordoned)
        taint_seconds = time.monotonic() - sent_at

        async def moved() -> Node | None:
            for node in await nodes(client, pool_name):
                assert node.metadata is not None and node.metadata.name is not None
                if node.metadata.name == old_name:
                    continue
                if len(await running_on(client, namespace, node.metadata.name)) == 2:
                    return node
            return None

        new = await eventually("both pods Running on the replacement node", moved, timeout=120)

        async def old_gone() -> bool:
            try:
                await client.get(Node, old_name)
            except ApiError as exc:
                return exc.status.code == 404
            return False

        await eventually("the interrupted node to be deleted", old_gone)
        await eventually(
            "the old NodeClaim to be removed",
            lambda: _absent(client, old_claim["metadata"]["name"]),
        )
        await eventually("the interruption message to be deleted", lambda: _no_messages(sqs))
        stop.set()
        await tracker

        assert census.min_ready is not None and census.min_ready >= 1, (
            "the PodDisruptionBudget (minAvailable 1) was broken during the drain"
        )
        assert len(census.nodes) == 2 and len(census.claims) == 2, (census.nodes, census.claims)
        assert new.metadata is not None and new.metadata.labels is not None
        assert new.metadata.labels["karpenter.sh/capacity-type"] == "spot"
        reasons = {
            e["reason"]
            for e in events(cluster, "default")
            if (e.get("regarding") or {}).get("name") == old_name
        }
        assert {"Cordoned", "Drained", "InstanceInterrupted"} <= reasons, reasons
        evicted = [e for e in events(cluster, namespace) if e["reason"] == "Evicted"]
        assert len(evicted) >= 2
        assert controller.alive(), controller.tail()
        print(f"interruption to taint: {taint_seconds:.2f}s")


def events(cluster: TestCluster, namespace: str) -> list[dict[str, Any]]:
    """events.k8s.io Events as JSON (others' Events may lack fields the typed model needs)."""
    status, body = cluster.request("GET", f"/apis/events.k8s.io/v1/namespaces/{namespace}/events")
    assert status == 200, body
    items: list[dict[str, Any]] = body["items"]
    return items


async def _absent(client: AsyncClient, name: str) -> bool:
    try:
        await client.get(NodeClaimCR, name)
    except ApiError as exc:
        return exc.status.code == 404
    return False


async def _no_messages(sqs: MotoSqs) -> bool:
    return await asyncio.to_thread(sqs.messages_left) == 0


# ---------------------------------------------------------------------------------------
# 2. Leader failover


def test_leader_failover_mid_provisioning(
    test_cluster: TestCluster, controller_kubeconfig: Path, namespace: str, pool: str
) -> None:
    lease = f"lease-{pool}"
    args = controller_args(controller_kubeconfig, lease=lease, boot_seconds=5.0)
    with controllers(test_cluster) as started:
        started.append(Controller(f"{pool}-a", args, test_cluster.log_dir))
        started.append(Controller(f"{pool}-b", args, test_cluster.log_dir))
        asyncio.run(_failover(test_cluster, namespace, pool, lease, started))


async def _failover(
    cluster: TestCluster,
    namespace: str,
    pool_name: str,
    lease: str,
    started: list[Controller],
) -> None:
    by_name = {c.name: c for c in started}
    async with client_for(cluster, namespace) as client, Census(client, pool_name) as census:

        async def holder() -> str | None:
            try:
                found = await client.get(Lease, lease, namespace=NAMESPACE)
            except ApiError:
                return None
            name = found.spec.holderIdentity if found.spec else None
            return name if name in by_name else None

        leader_name = await eventually("a controller to take the Lease", holder)
        standby_name = next(n for n in by_name if n != leader_name)
        # Both replicas must be up (caches synced) before the leader goes.
        await eventually(
            "the standby to wait for leadership",
            lambda: _logged(by_name[standby_name], "waiting for leadership"),
        )
        apply_workload(cluster, namespace, pool_name, min_available=1)
        await eventually("the leader to create a NodeClaim", lambda: claims(client, pool_name))
        killed_at = time.monotonic()
        by_name[leader_name].kill(signal.SIGKILL)
        assert not await nodes(client, pool_name), "killed too late: the node was already up"

        async def standby_leads() -> bool:
            return await holder() == standby_name

        await eventually("the standby to take the Lease", standby_leads, timeout=30)
        takeover = time.monotonic() - killed_at
        await first_node_running_pods(client, namespace, pool_name)
        await asyncio.sleep(3)  # a second launch would show up within a provisioning round
        assert len(census.claims) == 1, f"more than one NodeClaim: {sorted(census.claims)}"
        assert len(census.nodes) == 1, f"more than one instance launched: {sorted(census.nodes)}"
        assert takeover <= 15.5, f"the standby took {takeover:.1f}s to take over"
        print(f"leader killed -> standby leading: {takeover:.2f}s")


async def _logged(controller: Controller, message: str) -> bool:
    return bool(controller.logged(message))


# ---------------------------------------------------------------------------------------
# 3. Restart mid-drain


def test_restart_mid_drain_completes_the_drain(
    test_cluster: TestCluster,
    controller_kubeconfig: Path,
    namespace: str,
    pool: str,
    sqs: MotoSqs,
) -> None:
    # minAvailable 2 of 2: no eviction is allowed until the budget is relaxed, so the drain
    # is reliably still going when the controller is killed.
    apply_workload(test_cluster, namespace, pool, min_available=2)
    args = controller_args(
        controller_kubeconfig,
        lease=f"lease-{pool}",
        queue_url=sqs.url,
        endpoint=sqs.endpoint,
        leader_elect=False,
    )
    with controllers(test_cluster) as started:
        started.append(Controller(f"{pool}-first", args, test_cluster.log_dir))
        asyncio.run(_restart(test_cluster, namespace, pool, sqs, args, started))


async def _restart(
    cluster: TestCluster,
    namespace: str,
    pool_name: str,
    sqs: MotoSqs,
    args: list[str],
    started: list[Controller],
) -> None:
    async with client_for(cluster, namespace) as client, Census(client, pool_name) as census:
        old = await first_node_running_pods(client, namespace, pool_name)
        assert old.metadata is not None and old.metadata.name is not None
        old_name = old.metadata.name
        (claim,) = await claims(client, pool_name)
        claim_name = claim["metadata"]["name"]
        sqs.send_spot_interruption(instance_id(old))

        async def draining() -> bool:
            current = await client.get(NodeClaimCR, claim_name)
            node = await client.get(Node, old_name)
            blocked = started[0].logged("evicted pod") == []
            return bool(
                current["metadata"].get("deletionTimestamp")
                and current["status"].get("drainDeadline")
                and node.spec
                and node.spec.unschedulable
                and blocked
            )

        await eventually("the drain to be under way, held up by the budget", draining)
        # The message stays in flight while the drain is under way.
        assert await asyncio.to_thread(sqs.messages_left) == 1
        started[0].kill(signal.SIGKILL)
        killed_at = time.monotonic()
        assert len(await running_on(client, namespace, old_name)) == 2  # nothing evicted yet
        early: list[str] = []
        watch = asyncio.create_task(_message_outlives_claim(client, sqs, claim_name, early))

        await client.patch(
            PodDisruptionBudget, "web", {"spec": {"minAvailable": 1}}, namespace=namespace
        )
        started.append(Controller(f"{pool_name}-second", args, cluster.log_dir))

        async def old_gone() -> bool:
            try:
                await client.get(Node, old_name)
            except ApiError as exc:
                return exc.status.code == 404
            return False

        await eventually("the restarted controller to finish the drain", old_gone, timeout=120)
        await eventually("the NodeClaim to be removed", lambda: _absent(client, claim_name))
        claim_gone = time.monotonic() - killed_at

        async def all_moved() -> bool:
            pods = await web_pods(client, namespace)
            return len(pods) == 2 and all(
                ready(p) and p.spec is not None and p.spec.nodeName != old_name for p in pods
            )

        await eventually("both pods Running elsewhere", all_moved)
        assert started[1].logged("evicted pod"), started[1].tail()
        assert len(census.nodes) == 2
        # Delivered again to the new process, which waited for the drain (or found it
        # over), then deleted it: never before the NodeClaim was gone.
        await eventually("the message to be deleted", lambda: _no_messages(sqs), timeout=120)
        message_gone = time.monotonic() - killed_at
        watch.cancel()
        assert early == [], early
        assert started[1].logged("deleted message, its action is over") or started[1].logged(
            "node claim already gone, deleting the message"
        ), started[1].tail()
        print(f"after the kill: NodeClaim gone {claim_gone:.1f}s, message {message_gone:.1f}s")


async def _message_outlives_claim(
    client: AsyncClient, sqs: MotoSqs, claim_name: str, early: list[str]
) -> None:
    """Note any moment the message was gone while the NodeClaim was still there.

    The queue is read before the claim: a claim removed in between shows as absent, so a
    message deleted just after its claim never counts as early.
    """
    while True:
        left = await asyncio.to_thread(sqs.messages_left)
        if left == 0 and not await _absent(client, claim_name):
            early.append(f"message deleted while NodeClaim {claim_name} existed")
        await asyncio.sleep(0.2)
