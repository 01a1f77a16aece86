"""EC2NodeClasses on moto: selectors resolved by EC2, SSM and IAM calls, and used by launches.

A NodePool names its class; the launch request carries the name; ``EC2Cloud`` resolves the
class's subnet, security group and AMI selector terms and its role, reports the zones and
architectures it can launch (``node_class``), and launches with its subnets, security
groups, AMI, instance profile, user data, block devices, metadata options and tags.
"""

from __future__ import annotations

import base64
import email
from collections.abc import Callable
from typing import Any

import pytest
from awsfakes import AMIS, ZONES, run

from spotwright.model.nodeclass import EC2NodeClass, parse_nodeclass
from spotwright.ports.cloud import CloudError, Instance, LaunchRequest

MakeCloud = Callable[..., Any]
DISCOVERY = "karpenter.sh/discovery"


def nodeclass(name: str, cluster: str, **spec: Any) -> EC2NodeClass:
    """A class selecting the cluster's tagged network and the AL2023 alias, unless given."""
    selector = [{"tags": {DISCOVERY: cluster}}]
    body: dict[str, Any] = {
        "subnetSelectorTerms": selector,
        "securityGroupSelectorTerms": selector,
        "amiSelectorTerms": [{"alias": "al2023@latest"}],
        "instanceProfile": "test-profile",
        **spec,
    }
    return parse_nodeclass(
        {
            "apiVersion": "spotwright.io/v1alpha1",
            "kind": "EC2NodeClass",
            "metadata": {"name": name},
            "spec": body,
        },
        source="test",
    )


def lookup(*classes: EC2NodeClass) -> Callable[[str], EC2NodeClass | None]:
    known = {c.name: c for c in classes}
    return known.get


def request(
    cloud: Any,
    node_class: str | None,
    *,
    claim: str = "claim-1",
    types: tuple[str, ...] = ("m5.large", "c5.large"),
    capacity_type: str = "spot",
) -> LaunchRequest:
    """A request offering every zone discovery knows: the class must narrow it."""
    offerings = tuple(
        o
        for o in cloud.offerings()
        if o.capacity_type == capacity_type and o.instance_type in types
    )
    assert offerings
    return LaunchRequest(
        node_claim=claim,
        nodepool="default",
        capacity_type=capacity_type,
        offerings=offerings,
        tags=(("karpenter.sh/nodeclaim", claim), ("karpenter.sh/nodepool", "default")),
        node_class=node_class,
    )


def template_data(client: Callable[..., Any], calls: Any, index: int = -1) -> dict[str, Any]:
    """What the launch template of a CreateFleet call holds."""
    config = calls.params["CreateFleet"][index]["LaunchTemplateConfigs"][0]
    template = config["LaunchTemplateSpecification"]["LaunchTemplateId"]
    versions = client("ec2").describe_launch_template_versions(LaunchTemplateId=template)
    return dict(versions["LaunchTemplateVersions"][0]["LaunchTemplateData"])


def instance_tags(client: Callable[..., Any], instance: Instance) -> dict[str, str]:
    raw = client("ec2").describe_instances(InstanceIds=[instance.id])
    row = raw["Reservations"][0]["Instances"][0]
    return {t["Key"]: t["Value"] for t in row["Tags"]}


def amazon_images(client: Callable[..., Any]) -> dict[str, str]:
    """One of moto's Amazon images per architecture (Kubernetes' names)."""
    images = client("ec2").describe_images(Owners=["amazon"])["Images"]
    out: dict[str, str] = {}
    for image in sorted(images, key=lambda i: i["ImageId"]):
        arch = {"x86_64": "amd64", "arm64": "arm64"}.get(image["Architecture"])
        if arch:
            out.setdefault(arch, image["ImageId"])
    return out


# --- subnets and zones -----------------------------------------------------------------------


def test_a_class_selecting_subnets_in_two_zones_launches_only_there(
    make_cloud: MakeCloud, client: Callable[..., Any], cluster: str, network: dict[str, Any]
) -> None:
    chosen = {zone: network["subnets"][zone] for zone in ZONES[:2]}
    client("ec2").create_tags(
        Resources=list(chosen.values()), Tags=[{"Key": "tier", "Value": f"nodes-{cluster}"}]
    )
    cls = nodeclass("nodes", cluster, subnetSelectorTerms=[{"tags": {"tier": f"nodes-{cluster}"}}])

    async def main() -> None:
        cloud, calls = make_cloud(node_classes=lookup(cls))
        calls.watch("CreateFleet").watch("DescribeSubnets")
        await cloud.refresh()
        state = await cloud.node_class("nodes")
        assert state.ready and state.zones == frozenset(ZONES[:2])
        assert state.architectures == frozenset({"amd64", "arm64"})  # both alias variants
        sent = calls.sent["DescribeSubnets"]
        await cloud.node_class("nodes")
        assert calls.sent["DescribeSubnets"] == sent  # cached
        for i in range(3):
            instance = await cloud.launch(request(cloud, "nodes", claim=f"claim-{i}"))
            assert instance.zone in ZONES[:2]
        for params in calls.params["CreateFleet"]:
            overrides = params["LaunchTemplateConfigs"][0]["Overrides"]
            assert {o["SubnetId"] for o in overrides} == set(chosen.values())
        # Without a class the defaults still launch in all three zones.
        state = await cloud.node_class(None)
        assert state.zones == frozenset(ZONES)

    run(main())


def test_a_class_matching_no_subnet_says_so_and_launches_fail_with_that_reason(
    make_cloud: MakeCloud, cluster: str
) -> None:
    cls = nodeclass("nowhere", cluster, subnetSelectorTerms=[{"tags": {"tier": "no-such-tier"}}])

    async def main() -> None:
        cloud, _ = make_cloud(node_classes=lookup(cls))
        await cloud.refresh()
        state = await cloud.node_class("nowhere")
        assert not state.ready
        assert state.problem == (
            'EC2NodeClass nowhere: no available subnet matches [{"tags": {"tier": "no-such-tier"}}]'
        )
        with pytest.raises(CloudError) as caught:
            await cloud.launch(request(cloud, "nowhere"))
        assert caught.value.code == "SubnetsNotFound"
        assert "no-such-tier" in caught.value.message
        missing = await cloud.node_class("absent")
        assert missing.problem == "EC2NodeClass absent not found"
        cloud.node_classes.lookup = {"bad": "invalid: spec: expected amiFamily"}.get
        invalid = await cloud.node_class("bad")
        assert invalid.problem == "EC2NodeClass bad is invalid: spec: expected amiFamily"

    run(main())


def test_an_edited_class_is_resolved_again_at_once(make_cloud: MakeCloud, cluster: str) -> None:
    classes = {"c": nodeclass("c", cluster, subnetSelectorTerms=[{"tags": {"tier": "none"}}])}

    async def main() -> None:
        cloud, _ = make_cloud(node_classes=classes.get)
        await cloud.refresh()
        assert not (await cloud.node_class("c")).ready
        classes["c"] = nodeclass("c", cluster)
        assert (await cloud.node_class("c")).zones == frozenset(ZONES)

    run(main())


# --- security groups, AMIs, role ---------------------------------------------------------------


def test_security_groups_by_name(
    make_cloud: MakeCloud, client: Callable[..., Any], cluster: str, network: dict[str, Any]
) -> None:
    ec2 = client("ec2")
    vpc = ec2.describe_subnets(SubnetIds=[network["subnets"][ZONES[0]]])["Subnets"][0]["VpcId"]
    group = ec2.create_security_group(GroupName=f"nodes-{cluster}", Description="nodes", VpcId=vpc)[
        "GroupId"
    ]
    cls = nodeclass("named", cluster, securityGroupSelectorTerms=[{"name": f"nodes-{cluster}"}])

    async def main() -> None:
        cloud, calls = make_cloud(node_classes=lookup(cls))
        calls.watch("CreateFleet")
        await cloud.refresh()
        await cloud.launch(request(cloud, "named"))
        assert template_data(client, calls)["SecurityGroupIds"] == [group]

    run(main())


def test_amis_by_alias_follow_the_instance_architecture(
    make_cloud: MakeCloud, client: Callable[..., Any], cluster: str
) -> None:
    cls = nodeclass("al2023", cluster)

    async def main() -> None:
        cloud, calls = make_cloud(node_classes=lookup(cls))
        calls.watch("CreateFleet")
        await cloud.refresh()
        await cloud.launch(request(cloud, "al2023", types=("m6g.large",)))
        assert template_data(client, calls)["ImageId"] == AMIS[("arm64", "standard")]
        await cloud.launch(request(cloud, "al2023", claim="claim-2", types=("m5.large",)))
        assert template_data(client, calls)["ImageId"] == AMIS[("x86_64", "standard")]
        unpublished = nodeclass("br", cluster, amiSelectorTerms=[{"alias": "bottlerocket@latest"}])
        cloud.node_classes.lookup = lookup(unpublished)
        state = await cloud.node_class("br")
        assert state.problem == "EC2NodeClass br: no AMI published for alias bottlerocket@latest"

    run(main())


def test_amis_by_tag_pick_one_per_architecture(
    make_cloud: MakeCloud, client: Callable[..., Any], cluster: str
) -> None:
    images = amazon_images(client)
    client("ec2").create_tags(
        Resources=list(images.values()), Tags=[{"Key": "ami-set", "Value": cluster}]
    )
    cls = nodeclass(
        "tagged", cluster, amiSelectorTerms=[{"tags": {"ami-set": cluster}}], amiFamily="AL2023"
    )

    async def main() -> None:
        cloud, calls = make_cloud(node_classes=lookup(cls))
        calls.watch("CreateFleet")
        await cloud.refresh()
        state = await cloud.node_class("tagged")
        assert state.architectures == frozenset({"amd64", "arm64"})
        await cloud.launch(request(cloud, "tagged", types=("m6g.large",)))
        assert template_data(client, calls)["ImageId"] == images["arm64"]
        await cloud.launch(request(cloud, "tagged", claim="claim-2", types=("c5.large",)))
        assert template_data(client, calls)["ImageId"] == images["amd64"]

    run(main())


def test_an_ami_by_id_limits_the_class_to_its_architecture(
    make_cloud: MakeCloud, client: Callable[..., Any], cluster: str
) -> None:
    arm = amazon_images(client)["arm64"]
    cls = nodeclass("arm", cluster, amiSelectorTerms=[{"id": arm}], amiFamily="AL2023")

    async def main() -> None:
        cloud, calls = make_cloud(node_classes=lookup(cls))
        calls.watch("CreateFleet")
        await cloud.refresh()
        assert (await cloud.node_class("arm")).architectures == frozenset({"arm64"})
        await cloud.launch(request(cloud, "arm", types=("m6g.large", "m5.large")))
        overrides = calls.params["CreateFleet"][-1]["LaunchTemplateConfigs"]
        assert len(overrides) == 1
        assert {o["InstanceType"] for o in overrides[0]["Overrides"]} == {"m6g.large"}
        assert template_data(client, calls)["ImageId"] == arm
        with pytest.raises(CloudError) as caught:
            await cloud.launch(request(cloud, "arm", claim="claim-2", types=("m5.large",)))
        assert caught.value.code == "NoLaunchableOffering"

    run(main())


def test_a_role_gets_an_instance_profile_of_the_cluster(
    make_cloud: MakeCloud, client: Callable[..., Any], cluster: str
) -> None:
    iam = client("iam")
    iam.create_role(RoleName=f"node-{cluster}", AssumeRolePolicyDocument="{}")
    with_role = nodeclass("role", cluster, role=f"node-{cluster}", instanceProfile=None)
    no_role = nodeclass("norole", cluster, role=f"missing-{cluster}", instanceProfile=None)

    async def main() -> None:
        cloud, calls = make_cloud(node_classes=lookup(with_role, no_role))
        calls.watch("CreateFleet")
        await cloud.refresh()
        await cloud.launch(request(cloud, "role"))
        profile = template_data(client, calls)["IamInstanceProfile"]["Name"]
        found = iam.get_instance_profile(InstanceProfileName=profile)["InstanceProfile"]
        assert [r["RoleName"] for r in found["Roles"]] == [f"node-{cluster}"]
        assert found["Path"] == "/spotwright/"
        state = await cloud.node_class("norole")
        assert not state.ready and "NoSuchEntity" in state.problem
        assert f"missing-{cluster}" in state.problem

    run(main())


# --- what the launch template and the instance get ----------------------------------------------


def test_user_data_devices_metadata_and_merged_tags(
    make_cloud: MakeCloud, client: Callable[..., Any], cluster: str
) -> None:
    cls = nodeclass(
        "full",
        cluster,
        userData="#!/bin/bash\necho hello\n",
        tags={"team": "ml", "Name": "ml-node"},
        blockDeviceMappings=[
            {
                "deviceName": "/dev/xvda",
                "rootVolume": True,
                "ebs": {"volumeSize": "100Gi", "volumeType": "gp3", "encrypted": True},
            }
        ],
        metadataOptions={"httpPutResponseHopLimit": 2, "httpTokens": "required"},
    )
    # A class read without validation must still not take over spotwright's own tags.
    cls.spec.tags["karpenter.sh/nodepool"] = "someone-else"

    async def main() -> Instance:
        cloud, calls = make_cloud(node_classes=lookup(cls))
        calls.watch("CreateFleet")
        await cloud.refresh()
        instance = await cloud.launch(request(cloud, "full"))
        data = template_data(client, calls)
        # AL2023: the user's script is kept, after the NodeConfig that joins the node
        document = email.message_from_string(base64.b64decode(data["UserData"]).decode())
        parts = [(p.get_content_type(), p.get_payload()) for p in document.get_payload()]
        assert parts[0][0] == "application/node.eks.aws"
        assert parts[1] == ("text/x-shellscript", "#!/bin/bash\necho hello\n")
        assert data["IamInstanceProfile"] == {"Name": "test-profile"}
        [device] = data["BlockDeviceMappings"]
        assert device["DeviceName"] == "/dev/xvda"
        assert device["Ebs"]["VolumeSize"] == 100 and device["Ebs"]["VolumeType"] == "gp3"
        assert data["MetadataOptions"]["HttpPutResponseHopLimit"] == 2
        assert data["MetadataOptions"]["HttpTokens"] == "required"
        return instance

    instance = run(main())
    tags = instance_tags(client, instance)
    assert tags["team"] == "ml" and tags["Name"] == "ml-node"
    assert tags["karpenter.sh/nodepool"] == "default"
    assert tags["karpenter.sh/nodeclaim"] == "claim-1"
    assert tags["karpenter.k8s.aws/ec2nodeclass"] == "full"
    assert tags[f"kubernetes.io/cluster/{cluster}"] == "owned"
