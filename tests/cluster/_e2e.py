"""Support for the end-to-end tests: install spotwright, run controllers, feed SQS, poll.

The controller under test runs as a separate process (``python -m spotwright controller``)
authenticated as the ``spotwright/spotwright-controller`` ServiceAccount, which holds only
the ClusterRoles shipped in ``deploy/``; the test itself acts as cluster admin. Interruption
messages go through a moto server's SQS, the same HTTP API the controller would use on AWS.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import boto3  # type: ignore[import-untyped]
import pytest
import yaml
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.generic_resource import create_global_resource
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from spotwright.testing.cluster import TestCluster

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
NAMESPACE = "spotwright"
SERVICE_ACCOUNT = "spotwright-controller"
REGION = "us-east-1"

NodePoolCR = create_global_resource("spotwright.io", "v1alpha1", "NodePool", "nodepools")
NodeClaimCR = create_global_resource("spotwright.io", "v1alpha1", "NodeClaim", "nodeclaims")


async def eventually(
    what: str, probe: Callable[[], Awaitable[T | None]], timeout: float = 90.0
) -> T:
    """Poll ``probe`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = await probe()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.2)


def admin(cluster: TestCluster, namespace: str | None = None) -> AsyncClient:
    return AsyncClient(
        KubeConfig.from_file(cluster.kubeconfig), namespace=namespace, field_manager="e2e"
    )


# ---------------------------------------------------------------------------------------
# Installing spotwright


def _documents(*names: str) -> Iterator[dict[str, Any]]:
    for name in names:
        for path in sorted(DEPLOY.glob(name)):
            yield from (d for d in yaml.safe_load_all(path.read_text()) if d)


def install(cluster: TestCluster) -> Path:
    """Apply the CRDs and the RBAC manifests (idempotent); the controller's kubeconfig.

    Its ServiceAccount holds the ClusterRoles of ``rbac.yaml`` and ``rbac-sim.yaml``: what
    ``--cloud sim`` needs. For ``--cloud aws`` see :func:`service_account_with_roles`.
    """
    apply_manifests(cluster, "crds/*.yaml", "rbac.yaml", "rbac-sim.yaml")
    return cluster.service_account_kubeconfig(NAMESPACE, SERVICE_ACCOUNT)


def service_account_with_roles(cluster: TestCluster, name: str, roles: Sequence[str]) -> Path:
    """A kubeconfig of ServiceAccount ``spotwright/<name>``, bound to ``roles`` only.

    The ClusterRoles must exist (``install`` applies the shipped ones); the bindings are
    named after the ServiceAccount and role, so calling this again changes nothing.
    """
    path = cluster.service_account_kubeconfig(NAMESPACE, name)
    for role in roles:
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{name}-{role}"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}],
        }
        status, body = cluster.request("POST", _collection_path(binding), binding)
        if status not in (201, 409):
            raise RuntimeError(f"binding {name} to {role}: {body}")
    return path


def apply_manifests(cluster: TestCluster, *patterns: str) -> None:
    """Create the objects of the deploy/ files matching ``patterns``; CRDs are replaced
    when they exist (a schema may have changed) and waited for until Established."""
    for doc in _documents(*patterns):
        path = _collection_path(doc)
        status, body = cluster.request("POST", path, doc)
        if status == 409 and doc["kind"] == "CustomResourceDefinition":
            name = doc["metadata"]["name"]
            current = cluster.request("GET", f"{path}/{name}")[1]
            doc = {**doc, "metadata": {**doc["metadata"], **_version_of(current)}}
            status, body = cluster.request("PUT", f"{path}/{name}", doc)
        if status not in (200, 201, 409):
            raise RuntimeError(f"applying {doc['kind']} {doc['metadata']['name']}: {body}")
    for doc in _documents(*patterns):
        if doc["kind"] != "CustomResourceDefinition":
            continue
        name = doc["metadata"]["name"]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            crd = cluster.request("GET", f"{_collection_path(doc)}/{name}")[1]
            conditions = (crd.get("status") or {}).get("conditions") or []
            if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"CRD {name} never became Established")


def _version_of(obj: dict[str, Any]) -> dict[str, str]:
    return {"resourceVersion": obj["metadata"]["resourceVersion"]}


def _collection_path(doc: dict[str, Any]) -> str:
    group_version = doc["apiVersion"]
    plural = {
        "Namespace": "namespaces",
        "ServiceAccount": "serviceaccounts",
        "ClusterRole": "clusterroles",
        "ClusterRoleBinding": "clusterrolebindings",
        "CustomResourceDefinition": "customresourcedefinitions",
    }[doc["kind"]]
    base = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
    namespace = doc["metadata"].get("namespace")
    return f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"


async def crds_established(client: AsyncClient) -> bool:
    crd = await client.get(CustomResourceDefinition, "nodeclaims.spotwright.io")
    return any(
        c.type == "Established" and c.status == "True"
        for c in (crd.status.conditions if crd.status else None) or []
    )


async def remove_pool(cluster: TestCluster, pool_name: str) -> None:
    """Delete a NodePool with its NodeClaims (finalizers dropped: no controller is left to
    drop them) and its Nodes, so a test leaves nothing for the next one's controller."""
    client = admin(cluster)
    try:
        with contextlib.suppress(ApiError):
            await client.delete(NodePoolCR, pool_name)
        async for claim in client.list(NodeClaimCR):
            if claim["spec"].get("nodePool") != pool_name:
                continue
            name = claim["metadata"]["name"]
            with contextlib.suppress(ApiError):
                await client.patch(
                    NodeClaimCR,
                    name,
                    {"metadata": {"finalizers": None}},
                    patch_type=PatchType.MERGE,
                )
                await client.delete(NodeClaimCR, name)
        async for node in client.list(Node, labels={"e2e": pool_name}):
            if node.metadata is not None and node.metadata.name is not None:
                with contextlib.suppress(ApiError):
                    await client.delete(Node, node.metadata.name)
    finally:
        await client.close()


# ---------------------------------------------------------------------------------------
# The controller process


class Controller:
    """``spotwright controller`` in its own process, logging JSON lines to a file."""

    def __init__(self, name: str, args: Sequence[str], log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"controller-{name}.log"
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": REGION,
            "PYTHONUNBUFFERED": "1",
        }
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "spotwright", "controller", "--identity", name, *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self, sig: int = signal.SIGKILL, *, grace: float = 10.0) -> None:
        """Send ``sig``; SIGKILL after ``grace`` seconds (an SQS long poll in flight can
        hold a clean exit back for up to 20 s)."""
        if self.alive():
            os.killpg(self.process.pid, sig)
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        self._log.close()

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"message": line})
        return out

    def logged(self, message: str) -> list[dict[str, Any]]:
        return [line for line in self.lines() if line.get("message") == message]

    def tail(self, count: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-count:])


def controller_args(
    kubeconfig: Path,
    *,
    lease: str,
    queue_url: str | None = None,
    endpoint: str | None = None,
    leader_elect: bool = True,
    boot_seconds: float = 2.0,
    cloud: str = "sim",
    cloud_options: Sequence[str] = (),
) -> list[str]:
    """A controller's command line; ``boot_seconds`` is for ``--cloud sim`` only, and
    ``cloud_options`` are the chosen cloud's own (``--cluster-name`` and so on)."""
    args = [
        "--kubeconfig",
        str(kubeconfig),
        "--cloud",
        cloud,
        *cloud_options,
        "--leader-elect-namespace",
        NAMESPACE,
        "--leader-elect-name",
        lease,
        "--metrics-port",
        "0",
        *(["--sim-boot-seconds", str(boot_seconds)] if cloud == "sim" else []),
        "--log-format",
        "json",
        "--region",
        REGION,
        "--leader-elect" if leader_elect else "--no-leader-elect",
    ]
    if queue_url:
        args += ["--interruption-queue", queue_url]
    if endpoint:
        args += ["--aws-endpoint-url", endpoint]
    return args


# ---------------------------------------------------------------------------------------
# SQS on a moto server


class MotoSqs:
    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.sqs = self.client("sqs")
        name = f"interruptions-{uuid.uuid4().hex[:8]}"
        self.url: str = self.sqs.create_queue(QueueName=name)["QueueUrl"]

    def client(self, service: str) -> Any:
        """A boto3 client of another service (EC2, SSM, ...) on the same moto server."""
        return boto3.client(
            service,
            region_name=REGION,
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def send_spot_interruption(self, instance_id: str) -> dict[str, Any]:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "version": "0",
            "id": str(uuid.uuid4()),
            "detail-type": "EC2 Spot Instance Interruption Warning",
            "source": "aws.ec2",
            "account": "123456789012",
            "time": now,
            "region": REGION,
            "resources": [f"arn:aws:ec2:{REGION}:123456789012:instance/{instance_id}"],
            "detail": {"instance-id": instance_id, "instance-action": "terminate"},
        }
        self.sqs.send_message(QueueUrl=self.url, MessageBody=json.dumps(event))
        return event

    def messages_left(self) -> int:
        """Visible plus in flight (received, not yet deleted)."""
        attributes = self.sqs.get_queue_attributes(
            QueueUrl=self.url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return int(attributes["ApproximateNumberOfMessages"]) + int(
            attributes["ApproximateNumberOfMessagesNotVisible"]
        )

    def stop(self) -> None:
        self.server.stop()


# ---------------------------------------------------------------------------------------
# Workloads


def nodepool(name: str, nodeclass: str = "default") -> dict[str, Any]:
    """The walk-through's pool (spot; c, m and r; amd64), tainted so only its pods land."""
    return {
        "apiVersion": "spotwright.io/v1alpha1",
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": {
            "template": {
                "metadata": {"labels": {"e2e": name}},
                "spec": {
                    "requirements": [
                        {
                            "key": "karpenter.k8s.aws/instance-category",
                            "operator": "In",
                            "values": ["c", "m", "r"],
                        },
                        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
                        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]},
                    ],
                    "taints": [{"key": "e2e", "value": name, "effect": "NoSchedule"}],
                    "nodeClassRef": {"name": nodeclass},
                },
            }
        },
    }


def deployment(name: str, pool: str, replicas: int = 2) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"e2e": pool},
                    "tolerations": [
                        {"key": "e2e", "operator": "Equal", "value": pool, "effect": "NoSchedule"}
                    ],
                    "terminationGracePeriodSeconds": 5,
                    "containers": [
                        {
                            "name": "app",
                            "image": "registry.invalid/app:1",
                            "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}},
                        }
                    ],
                },
            },
        },
    }


def pdb(name: str, min_available: int) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": name}}},
    }
