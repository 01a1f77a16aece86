"""The user data of launched nodes, on moto: what the launch template holds is what the
node boots with, so it must carry the claim's labels and taints and the class's kubelet
settings, with the cluster's coordinates from the settings or EKS DescribeCluster."""

from __future__ import annotations

import base64
import email
import tomllib
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from awsfakes import CLUSTER_CA, CLUSTER_ENDPOINT, run
from test_nodeclasses import amazon_images, lookup, nodeclass, template_data

from spotwright.adapters.aws.fleet import merge_key
from spotwright.model.objects import Taint
from spotwright.ports.cloud import CloudError, LaunchRequest

MakeCloud = Callable[..., Any]
LABELS = (
    ("karpenter.sh/capacity-type", "spot"),
    ("karpenter.sh/nodepool", "default"),
    ("team", "ml"),
)
TAINTS = (Taint("dedicated", "NoSchedule", "ml"), Taint("cni-not-ready", "NoExecute"))


def labelled(
    cloud: Any,
    node_class: str | None,
    *,
    claim: str = "claim-1",
    types: tuple[str, ...] = ("m5.large",),
    labels: tuple[tuple[str, str], ...] = LABELS,
) -> LaunchRequest:
    offerings = tuple(
        o for o in cloud.offerings() if o.capacity_type == "spot" and o.instance_type in types
    )
    return LaunchRequest(
        node_claim=claim,
        nodepool="default",
        capacity_type="spot",
        offerings=offerings,
        tags=(("karpenter.sh/nodeclaim", claim),),
        node_class=node_class,
        labels=labels,
        taints=TAINTS,
    )


def nodeconfig(data: dict[str, Any]) -> dict[str, Any]:
    document = email.message_from_string(base64.b64decode(data["UserData"]).decode())
    first = document.get_payload()[0]
    assert first.get_content_type() == "application/node.eks.aws"
    return dict(yaml.safe_load(first.get_payload()))


def registered_with(config: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    flags = dict(f.removeprefix("--").split("=", 1) for f in config["spec"]["kubelet"]["flags"])
    labels = dict(item.split("=", 1) for item in flags["node-labels"].split(","))
    return labels, flags["register-with-taints"].split(",")


def test_an_al2023_node_joins_with_its_claims_labels_taints_and_kubelet_settings(
    make_cloud: MakeCloud, client: Callable[..., Any], cluster: str
) -> None:
    cls = nodeclass("ml", cluster, kubelet={"systemReserved": {"cpu": "100m"}})

    async def main() -> None:
        cloud, calls = make_cloud(node_classes=lookup(cls))
        calls.watch("CreateFleet")
        await cloud.refresh()
        await cloud.launch(labelled(cloud, "ml"))
        config = nodeconfig(template_data(client, calls))
        assert config["spec"]["cluster"]["apiServerEndpoint"] == CLUSTER_ENDPOINT
        assert config["spec"]["cluster"]["certificateAuthority"] == CLUSTER_CA
        assert config["spec"]["cluster"]["name"] == cluster
        labels, taints = registered_with(config)
        assert labels == dict(LABELS)
        assert taints == ["dedicated=ml:NoSchedule", "cni-not-ready:NoExecute"]
        kubelet = config["spec"]["kubelet"]["config"]
        assert kubelet["systemReserved"] == {"cpu": "100m"}
        assert kubelet["maxPods"] == 29  # m5.large's pod capacity in the catalog
        assert kubelet["clusterDNS"] == ["10.100.0.10"]

    run(main())


def test_launch_templates_are_shared_by_equal_nodes_and_split_by_max_pods(
    make_cloud: MakeCloud, client: Callable[..., Any], cluster: str
) -> None:
    cls = nodeclass("shared", cluster)

    async def main() -> None:
        cloud, calls = make_cloud(node_classes=lookup(cls))
        calls.watch("CreateFleet")
        await cloud.refresh()
        types = ("m5.large", "m5.xlarge")
        await cloud.launch(labelled(cloud, "shared", claim="a", types=types))
        configs = calls.params["CreateFleet"][-1]["LaunchTemplateConfigs"]
        pods: dict[str, int] = {}
        for config in configs:  # 29 and 58 pods: one template each
            template = config["LaunchTemplateSpecification"]["LaunchTemplateId"]
            versions = client("ec2").describe_launch_template_versions(LaunchTemplateId=template)
            data = versions["LaunchTemplateVersions"][0]["LaunchTemplateData"]
            for override in config["Overrides"]:
                config_pods = nodeconfig(data)["spec"]["kubelet"]["config"]["maxPods"]
                pods[override["InstanceType"]] = config_pods
        assert pods == {"m5.large": 29, "m5.xlarge": 58}
        created = cloud.launch_templates.created
        await cloud.launch(labelled(cloud, "shared", claim="b", types=types))
        assert cloud.launch_templates.created == created  # same labels and taints: reused
        other = (*LABELS[:2], ("team", "web"))
        await cloud.launch(labelled(cloud, "shared", claim="c", types=types, labels=other))
        assert cloud.launch_templates.created == created + 2

    run(main())


def test_claims_with_different_labels_are_not_merged_into_one_fleet() -> None:
    base = LaunchRequest("a", "default", "spot", (), labels=LABELS, taints=TAINTS)
    same = LaunchRequest("b", "default", "spot", (), labels=LABELS, taints=TAINTS)
    other = LaunchRequest("c", "default", "spot", (), labels=LABELS[:2], taints=TAINTS)
    untainted = LaunchRequest("d", "default", "spot", (), labels=LABELS)
    assert merge_key(base) == merge_key(same)
    assert merge_key(base) != merge_key(other)
    assert merge_key(base) != merge_key(untainted)


def test_a_bottlerocket_node_gets_its_settings_merged_into_the_users_toml(
    make_cloud: MakeCloud, client: Callable[..., Any], cluster: str
) -> None:
    cls = nodeclass(
        "br",
        cluster,
        amiSelectorTerms=[{"id": amazon_images(client)["amd64"]}],
        amiFamily="Bottlerocket",
        userData="[settings.host-containers.admin]\nenabled = true\n",
        kubelet={"maxPods": 20},
    )

    async def main() -> None:
        cloud, calls = make_cloud(node_classes=lookup(cls))
        calls.watch("CreateFleet")
        await cloud.refresh()
        await cloud.launch(labelled(cloud, "br"))
        data = template_data(client, calls)
        settings = tomllib.loads(base64.b64decode(data["UserData"]).decode())["settings"]
        assert settings["host-containers"]["admin"]["enabled"] is True
        kube = settings["kubernetes"]
        assert kube["cluster-name"] == cluster and kube["api-server"] == CLUSTER_ENDPOINT
        assert kube["node-labels"] == dict(LABELS)
        assert kube["node-taints"] == {
            "dedicated": ["ml:NoSchedule"],
            "cni-not-ready": [":NoExecute"],
        }
        assert kube["max-pods"] == 20

    run(main())


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {"amiSelectorTerms": [{"alias": "bottlerocket@latest"}], "userData": "[settings\n"},
            "not valid TOML",
        ),
        (
            {"userData": 'MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="B"\n\n'},
            "does not parse",
        ),
    ],
)
def test_bad_user_data_makes_the_class_not_ready_with_the_reason(
    make_cloud: MakeCloud, cluster: str, spec: dict[str, Any], expected: str
) -> None:
    cls = nodeclass("bad", cluster, **spec)

    async def main() -> None:
        cloud, _ = make_cloud(node_classes=lookup(cls))
        await cloud.refresh()
        state = await cloud.node_class("bad")
        assert not state.ready and expected in state.problem
        with pytest.raises(CloudError) as raised:
            await cloud.launch(labelled(cloud, "bad"))
        assert raised.value.code == "UserDataInvalid"

    run(main())


def test_the_cluster_is_read_from_eks_when_not_given(
    make_cloud: MakeCloud, client: Callable[..., Any], cluster: str
) -> None:
    eks = client("eks")
    found = eks.create_cluster(
        name=cluster,
        roleArn="arn:aws:iam::123456789012:role/eks",
        resourcesVpcConfig={"subnetIds": []},
    )["cluster"]
    cls = nodeclass("eks", cluster)

    async def main() -> None:
        cloud, calls = make_cloud(
            node_classes=lookup(cls),
            cluster_endpoint=None,
            cluster_ca_bundle=None,
            service_cidr=None,
        )
        calls.watch("CreateFleet")
        await cloud.refresh()
        await cloud.launch(labelled(cloud, "eks"))
        joined = nodeconfig(template_data(client, calls))["spec"]["cluster"]
        assert joined["apiServerEndpoint"] == found["endpoint"]
        assert joined["certificateAuthority"] == found["certificateAuthority"]["data"]

    run(main())


def test_without_the_cluster_launches_fail_saying_which_option_to_pass(
    make_cloud: MakeCloud, cluster: str
) -> None:
    cls = nodeclass("nocluster", cluster)

    async def main() -> None:
        cloud, _ = make_cloud(
            node_classes=lookup(cls),
            cluster_endpoint=None,
            cluster_ca_bundle=None,
            service_cidr=None,
        )
        await cloud.refresh()
        with pytest.raises(CloudError) as raised:
            await cloud.launch(labelled(cloud, "nocluster"))
        assert raised.value.code == "ClusterInfoUnavailable"
        assert "--cluster-endpoint" in raised.value.message

    run(main())
