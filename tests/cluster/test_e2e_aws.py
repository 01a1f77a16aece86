"""``spotwright controller --cloud aws`` end to end: a real control plane, EC2 and SQS on moto.

The controller runs as its own process and ServiceAccount, bound to the ClusterRole of
``deploy/rbac.yaml`` only (``--cloud aws`` never creates Nodes, so it gets none of the
``--cloud sim`` extra), and talks to EC2 and SQS over HTTP on a moto server, as it would
to AWS: discovery (instance types, spot prices), the NodePool's EC2NodeClass resolved
(subnets by tag in two of the three zones, the security group by name, the AMI by id, an
instance profile made for its role), CreateFleet, CreateTags, DescribeInstances and
TerminateInstances are real boto3 calls. Nothing carries the ``karpenter.sh/discovery``
tag and no ``--ami-id`` is given: what the instances get comes from the class alone.

moto's instances never boot, so ``Kubelets`` plays their kubelet: for every instance moto
runs for the cluster it registers the Node that instance's kubelet would, annotated for
kwok (which then keeps it Ready), with the instance's providerID
``aws:///<zone>/<instance id>`` and the labels and taints of its NodeClaim. It builds the
Node with the same function ``--cloud sim`` uses (``adapters.kube.kwok.fake_node``).

The story: pods are pending; the controller launches a spot instance with CreateFleet; the
instance registers and the pods run on it; a spot interruption warning arrives on the SQS
queue; the node is tainted and cordoned, a replacement is launched and registers, the pods
are evicted to it, the interrupted instance is terminated (moto reports it ``terminated``)
and its Node and NodeClaim are deleted, and the message is deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _e2e import (
    REGION,
    Controller,
    MotoSqs,
    controller_args,
    deployment,
    eventually,
    nodepool,
    pdb,
    remove_pool,
    service_account_with_roles,
)

from spotwright.adapters.kube.kwok import SIMULATED_LABEL, fake_node
from spotwright.adapters.kube.nodeclaims import claim_from_api
from spotwright.catalog import InstanceType, load_catalog
from spotwright.model import labels as wk
from spotwright.ports.cloud import Instance
from spotwright.testing.cluster import TestCluster

pytestmark = pytest.mark.cluster

#: Discovery restricted to a few types the pool accepts (moto lists about 1,300 slowly).
TYPES = ("c5.large", "c5.xlarge", "m5.large", "m5.xlarge", "r5.large")
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")
#: The zones whose subnets the EC2NodeClass selects (by the tag TIER_TAG).
CLASS_ZONES = ZONES[:2]
TIER_TAG = "e2e-tier"
NODECLAIM_TAG = "karpenter.sh/nodeclaim"
DISRUPTED = "karpenter.sh/disrupted"
NODECLAIMS = "/apis/spotwright.io/v1alpha1/nodeclaims"
NODECLASSES = "/apis/spotwright.io/v1alpha1/ec2nodeclasses"


# ---------------------------------------------------------------------------------------
# The test's side of AWS


def tag_network(ec2: Any, cluster_name: str) -> None:
    """Tag the default subnets of CLASS_ZONES for the node class's subnet selector."""
    subnets = [
        s["SubnetId"]
        for s in ec2.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])[
            "Subnets"
        ]
        if s["AvailabilityZone"] in CLASS_ZONES
    ]
    ec2.create_tags(Resources=subnets, Tags=[{"Key": TIER_TAG, "Value": cluster_name}])


def linux_ami(ec2: Any) -> str:
    """An x86_64 Amazon Linux image from moto's catalogue (the EKS SSM parameters are not
    there): the pool asks for amd64, and the class launches only the architectures of its
    images."""
    images = ec2.describe_images(
        Owners=["amazon"],
        Filters=[
            {"Name": "name", "Values": ["amzn*"]},
            {"Name": "architecture", "Values": ["x86_64"]},
        ],
    )
    return str(sorted(i["ImageId"] for i in images["Images"])[0])


def cluster_instances(ec2: Any, cluster_name: str) -> dict[str, dict[str, Any]]:
    """Every instance launched for the cluster, by id, in whatever state."""
    answer = ec2.describe_instances(
        Filters=[{"Name": f"tag:kubernetes.io/cluster/{cluster_name}", "Values": ["owned"]}]
    )
    return {i["InstanceId"]: i for r in answer["Reservations"] for i in r["Instances"]}


def ec2nodeclass(name: str, cluster_name: str, ami: str, tier: str = "") -> dict[str, Any]:
    """The node class a user would write for this cluster: the only source of its network,
    image and role (``tier`` selects other subnets: none, for a class that cannot launch)."""
    return {
        "apiVersion": "spotwright.io/v1alpha1",
        "kind": "EC2NodeClass",
        "metadata": {"name": name},
        "spec": {
            "subnetSelectorTerms": [{"tags": {TIER_TAG: tier or cluster_name}}],
            "securityGroupSelectorTerms": [{"name": "default"}],
            "amiSelectorTerms": [{"id": ami}],
            "amiFamily": "AL2023",
            "role": f"KarpenterNodeRole-{cluster_name}",
            "tags": {"team": "e2e"},
        },
    }


class Kubelets:
    """Registers a kwok Node for every pending or running instance of the cluster."""

    def __init__(self, cluster: TestCluster, ec2: Any, cluster_name: str) -> None:
        self.cluster = cluster
        self.ec2 = ec2
        self.cluster_name = cluster_name
        self.types: dict[str, InstanceType] = {t.name: t for t in load_catalog().types}
        self.registered: dict[str, str] = {}  # instance id -> node name

    async def run(self) -> None:
        while True:
            await self.register_new()
            await asyncio.sleep(0.3)

    async def register_new(self) -> None:
        instances = await asyncio.to_thread(cluster_instances, self.ec2, self.cluster_name)
        booting = [
            row
            for row in instances.values()
            if row["InstanceId"] not in self.registered
            and row["State"]["Name"] in ("pending", "running")
        ]
        if not booting:
            return
        status, body = await asyncio.to_thread(self.cluster.request, "GET", NODECLAIMS)
        assert status == 200, body
        claims = {c["metadata"]["name"]: c for c in body["items"]}
        for row in booting:
            tags = {t["Key"]: t["Value"] for t in row.get("Tags") or ()}
            claim = claims.get(tags.get(NODECLAIM_TAG, ""))
            stored = claim_from_api(claim) if claim is not None else None
            if stored is None:
                continue  # a merged fleet's instances get their claim's tag just after
            instance = Instance(
                id=row["InstanceId"],
                instance_type=row["InstanceType"],
                zone=row["Placement"]["AvailabilityZone"],
                capacity_type=wk.SPOT if row.get("InstanceLifecycle") == "spot" else wk.ON_DEMAND,
                price=0.0,
                launched_at=row["LaunchTime"].timestamp(),
                private_dns=row["PrivateDnsName"],
            )
            node = fake_node(
                instance, self.types[instance.instance_type], stored.claim, region=REGION
            )
            # A kubelet does not call its Node simulated: only kwok's annotation stays.
            node["metadata"]["labels"].pop(SIMULATED_LABEL)
            status, body = await asyncio.to_thread(
                self.cluster.request, "POST", "/api/v1/nodes", node
            )
            assert status == 201, body
            self.registered[instance.id] = node["metadata"]["name"]


# ---------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def aws_kubeconfig(test_cluster: TestCluster, controller_kubeconfig: Path) -> Path:
    """A ServiceAccount of its own, bound to the ClusterRole of deploy/rbac.yaml only."""
    return service_account_with_roles(
        test_cluster, "spotwright-controller-aws", ["spotwright-controller"]
    )


@dataclass(frozen=True)
class Aws:
    """moto's EC2 and SQS, with the network tagged for a cluster named after the test."""

    moto: MotoSqs
    ec2: Any
    cluster_name: str
    ami: str


@pytest.fixture
def aws(namespace: str) -> Iterator[Aws]:
    moto = MotoSqs()
    try:
        ec2 = moto.client("ec2")
        tag_network(ec2, namespace)
        moto.client("iam").create_role(
            RoleName=f"KarpenterNodeRole-{namespace}", AssumeRolePolicyDocument="{}"
        )
        yield Aws(moto, ec2, namespace, linux_ami(ec2))
    finally:
        moto.stop()


@pytest.fixture
def pool(test_cluster: TestCluster, controller_kubeconfig: Path, aws: Aws) -> Iterator[str]:
    """A NodePool and its EC2NodeClass, named after the test's namespace (as the cluster)."""
    name = aws.cluster_name
    for path, body in (
        (NODECLASSES, ec2nodeclass(name, aws.cluster_name, aws.ami)),
        ("/apis/spotwright.io/v1alpha1/nodepools", nodepool(name, nodeclass=name)),
    ):
        status, answer = test_cluster.request("POST", path, body)
        assert status == 201, answer
    try:
        yield name
    finally:
        asyncio.run(remove_pool(test_cluster, name))
        test_cluster.request("DELETE", f"{NODECLASSES}/{name}")


# ---------------------------------------------------------------------------------------
# The story


def test_controller_on_ec2_launches_and_handles_a_spot_interruption(
    test_cluster: TestCluster,
    aws_kubeconfig: Path,
    namespace: str,
    pool: str,
    aws: Aws,
    tmp_path: Path,
) -> None:
    for path, body in (
        (f"/apis/apps/v1/namespaces/{namespace}/deployments", deployment("web", pool)),
        (f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets", pdb("web", 1)),
    ):
        status, answer = test_cluster.request("POST", path, body)
        assert status == 201, answer
    # what the AL2023 nodes' user data joins (moto has no EKS cluster to describe)
    ca_file = tmp_path / "ca.pem"
    ca_file.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    cloud_options = ["--cluster-name", aws.cluster_name, "--cluster-ca-file", str(ca_file)]
    cloud_options += ["--cluster-endpoint", "https://api.e2e.invalid"]
    cloud_options += ["--service-cidr", "10.100.0.0/16"]
    for pattern in TYPES:
        cloud_options += ["--instance-types", pattern]
    args = controller_args(
        aws_kubeconfig,
        lease=f"lease-{pool}",
        queue_url=aws.moto.url,
        endpoint=aws.moto.endpoint,
        cloud="aws",
        cloud_options=cloud_options,
    )
    controller = Controller(pool, args, test_cluster.log_dir)
    try:
        asyncio.run(_story(test_cluster, namespace, pool, aws, controller))
    finally:
        controller.kill(signal.SIGTERM)


async def _story(
    cluster: TestCluster, namespace: str, pool_name: str, aws: Aws, controller: Controller
) -> None:
    kubelets = Kubelets(cluster, aws.ec2, aws.cluster_name)
    registering = asyncio.create_task(kubelets.run())
    try:
        await _launch_then_interrupt(cluster, namespace, pool_name, aws, kubelets)
    except BaseException:
        print(controller.tail(60))
        raise
    finally:
        registering.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await registering
    assert controller.alive(), controller.tail()


async def _launch_then_interrupt(
    cluster: TestCluster, namespace: str, pool_name: str, aws: Aws, kubelets: Kubelets
) -> None:
    ec2 = aws.ec2
    seen: set[str] = set()  # nodes that already ran the pods

    def get(path: str) -> dict[str, Any] | None:
        status, body = cluster.request("GET", path)
        return body if status == 200 else None

    async def running_on(node_name: str) -> int:
        body = await asyncio.to_thread(
            get, f"/api/v1/namespaces/{namespace}/pods?labelSelector=app%3Dweb"
        )
        assert body is not None
        return sum(
            1
            for p in body["items"]
            if p["spec"].get("nodeName") == node_name
            and not p["metadata"].get("deletionTimestamp")
            and any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in (p.get("status") or {}).get("conditions") or ()
            )
        )

    async def pods_running_on_a_new_node() -> str | None:
        for node in kubelets.registered.values():
            if node not in seen and await running_on(node) == 2:
                return node
        return None

    # 1. Pending pods -> CreateFleet -> an instance -> its Node -> the pods run there.
    first = await eventually(
        "both pods Running on a launched node", pods_running_on_a_new_node, 120
    )
    seen.add(first)
    (first_id,) = kubelets.registered
    row = cluster_instances(ec2, aws.cluster_name)[first_id]
    tags = {t["Key"]: t["Value"] for t in row["Tags"]}
    assert row["InstanceLifecycle"] == "spot" and row["InstanceType"] in TYPES
    assert row["ImageId"] == aws.ami  # the class's amiSelectorTerms
    assert row["Placement"]["AvailabilityZone"] in CLASS_ZONES  # its subnets' zones
    assert tags["team"] == "e2e"  # its tags, with spotwright's own
    assert tags["karpenter.k8s.aws/ec2nodeclass"] == pool_name
    assert tags["karpenter.sh/nodepool"] == pool_name
    claim = get(f"{NODECLAIMS}/{tags[NODECLAIM_TAG]}")
    assert claim is not None
    zone = row["Placement"]["AvailabilityZone"]
    assert claim["status"]["providerID"] == f"aws:///{zone}/{first_id}"
    assert claim["status"]["capacityType"] == "spot"
    assert claim["spec"]["nodeClassRef"]["name"] == pool_name

    # 2. A spot interruption warning on the queue -> taint and cordon at once.
    aws.moto.send_spot_interruption(first_id)

    async def tainted_and_cordoned() -> bool:
        node = await asyncio.to_thread(get, f"/api/v1/nodes/{first}")
        spec = (node or {}).get("spec") or {}
        return bool(spec.get("unschedulable")) and any(
            t["key"] == DISRUPTED and t["effect"] == "NoSchedule" for t in spec.get("taints") or ()
        )

    await eventually("the interrupted node to be tainted and cordoned", tainted_and_cordoned)

    # 3. A replacement launched by CreateFleet; the pods are evicted to it.
    second = await eventually(
        "both pods Running on the replacement", pods_running_on_a_new_node, 120
    )
    assert second != first

    # 4. TerminateInstances; the Node, the NodeClaim and the message go.
    async def terminated() -> bool:
        rows = await asyncio.to_thread(cluster_instances, ec2, aws.cluster_name)
        return rows[first_id]["State"]["Name"] == "terminated"

    await eventually("the interrupted instance to be terminated in EC2", terminated)

    async def gone(path: str) -> bool:
        return await asyncio.to_thread(get, path) is None

    await eventually("the interrupted Node to be deleted", lambda: gone(f"/api/v1/nodes/{first}"))
    await eventually(
        "its NodeClaim to be removed", lambda: gone(f"{NODECLAIMS}/{claim['metadata']['name']}")
    )

    async def no_messages() -> bool:
        return await asyncio.to_thread(aws.moto.messages_left) == 0

    await eventually("the interruption message to be deleted", no_messages)

    rows = cluster_instances(ec2, aws.cluster_name)
    assert {r["Placement"]["AvailabilityZone"] for r in rows.values()} <= set(CLASS_ZONES)
    live = {i for i, r in rows.items() if r["State"]["Name"] in ("pending", "running")}
    assert len(rows) == 2 and live == set(kubelets.registered) - {first_id}, rows.keys()
    status, events = cluster.request("GET", f"/apis/events.k8s.io/v1/namespaces/{namespace}/events")
    assert status == 200
    assert sum(1 for e in events["items"] if e["reason"] == "Evicted") >= 2


def test_a_node_class_matching_no_subnet_keeps_pods_pending_with_its_reason(
    test_cluster: TestCluster, aws_kubeconfig: Path, namespace: str, aws: Aws
) -> None:
    name = aws.cluster_name
    for path, body in (
        (NODECLASSES, ec2nodeclass(name, name, aws.ami, tier="no-such-tier")),
        ("/apis/spotwright.io/v1alpha1/nodepools", nodepool(name, nodeclass=name)),
        (f"/apis/apps/v1/namespaces/{namespace}/deployments", deployment("web", name, 1)),
    ):
        status, answer = test_cluster.request("POST", path, body)
        assert status == 201, answer
    args = controller_args(
        aws_kubeconfig,
        lease=f"lease-{name}",
        endpoint=aws.moto.endpoint,
        cloud="aws",
        cloud_options=["--cluster-name", name, "--instance-types", "m5.large"],
    )
    controller = Controller(name, args, test_cluster.log_dir)

    def events(where: str, reason: str) -> list[dict[str, Any]]:
        status, body = test_cluster.request(
            "GET", f"/apis/events.k8s.io/v1/namespaces/{where}/events"
        )
        assert status == 200, body
        return [e for e in body["items"] if e["reason"] == reason]

    async def story() -> None:
        async def class_event() -> dict[str, Any] | None:
            found = await asyncio.to_thread(events, "default", "NodeClassNotReady")
            mine = [e for e in found if e["regarding"]["name"] == name]
            return mine[0] if mine else None

        event = await eventually("a NodeClassNotReady Event on the EC2NodeClass", class_event)
        assert event["regarding"]["kind"] == "EC2NodeClass" and event["type"] == "Warning"
        assert "no available subnet matches" in event["note"] and "no-such-tier" in event["note"]

        async def pod_reason() -> str | None:
            found = await asyncio.to_thread(events, namespace, "FailedScheduling")
            notes = [e["note"] for e in found if "left out" in e["note"]]
            return notes[0] if notes else None

        note = await eventually("a FailedScheduling Event naming the class's problem", pod_reason)
        assert f"NodePool {name} left out: EC2NodeClass {name}: no available subnet" in note
        assert cluster_instances(aws.ec2, name) == {}
        assert controller.alive(), controller.tail()

    try:
        asyncio.run(story())
    except BaseException:
        print(controller.tail(60))
        raise
    finally:
        controller.kill(signal.SIGTERM)
        asyncio.run(remove_pool(test_cluster, name))
        test_cluster.request("DELETE", f"{NODECLASSES}/{name}")
