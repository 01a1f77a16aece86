"""The nodes' user data per AMI family, checked by parsing what is generated.

No AWS here: ``bootstrap`` is pure. Each family's document is parsed the way the node
parses it (MIME + YAML for nodeadm, the shell words of bootstrap.sh, TOML for
Bottlerocket), and must carry the node's labels, taints and kubelet settings while keeping
the user's own user data.
"""

from __future__ import annotations

import base64
import email
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from spotwright.adapters.aws.bootstrap import (
    ClusterInfo,
    NodeSetup,
    UserDataError,
    kubelet_labels,
    max_pods,
    render_user_data,
    user_data_problem,
)
from spotwright.adapters.aws.bottlerocket_toml import dumps
from spotwright.adapters.aws.cluster_info import cluster_settings, encode_ca_bundle
from spotwright.cli import cli
from spotwright.model.nodeclass import KubeletConfiguration
from spotwright.model.objects import Taint

CLUSTER = ClusterInfo("prod", "https://api.example.com", "Q0EgYnVuZGxl", "10.100.0.0/16")
KUBELET = KubeletConfiguration(
    max_pods=58,
    pods_per_core=10,
    system_reserved={"cpu": "100m", "memory": "200Mi"},
    kube_reserved={"cpu": "80m"},
    eviction_hard={"memory.available": "5%"},
)
NODE = NodeSetup(
    labels=(
        ("karpenter.sh/capacity-type", "spot"),
        ("karpenter.sh/nodepool", "gpu"),
        ("eks.amazonaws.com/capacityType", "SPOT"),
        ("lifecycle", "Ec2Spot"),
        ("team", "ml"),
        ("kubernetes.io/role", "worker"),  # NodeRestriction refuses it from the kubelet
    ),
    taints=(Taint("nvidia.com/gpu", "NoSchedule", "true"), Taint("agent-not-ready", "NoExecute")),
    max_pods=40,
    kubelet=KUBELET,
)
WANT_LABELS = {
    "karpenter.sh/capacity-type": "spot",
    "karpenter.sh/nodepool": "gpu",
    "eks.amazonaws.com/capacityType": "SPOT",
    "lifecycle": "Ec2Spot",
    "team": "ml",
}
WANT_TAINTS = ["nvidia.com/gpu=true:NoSchedule", "agent-not-ready:NoExecute"]
USER_MIME = """MIME-Version: 1.0
Content-Type: multipart/mixed; boundary="USER"

--USER
Content-Type: application/node.eks.aws

apiVersion: node.eks.aws/v1alpha1
kind: NodeConfig
spec:
  kubelet:
    config:
      shutdownGracePeriod: 30s

--USER
Content-Type: text/x-shellscript

#!/bin/bash
echo custom > /etc/marker

--USER--
"""


def mime_parts(text: str) -> list[tuple[str, str]]:
    message = email.message_from_string(text)
    assert message.get_content_type() == "multipart/mixed"
    assert not message.defects
    return [(p.get_content_type(), p.get_payload()) for p in message.get_payload()]


def flag_map(flags: list[str]) -> dict[str, str]:
    return dict(f.removeprefix("--").split("=", 1) for f in flags)


def test_al2023_user_data_is_a_nodeconfig_first_then_the_users_parts_unchanged() -> None:
    text = render_user_data("AL2023", CLUSTER, NODE, USER_MIME)
    assert text is not None
    parts = mime_parts(text)
    assert [kind for kind, _ in parts] == [
        "application/node.eks.aws",
        "application/node.eks.aws",
        "text/x-shellscript",
    ]
    config = yaml.safe_load(parts[0][1])
    assert config["apiVersion"] == "node.eks.aws/v1alpha1" and config["kind"] == "NodeConfig"
    assert config["spec"]["cluster"] == {
        "name": "prod",
        "apiServerEndpoint": "https://api.example.com",
        "certificateAuthority": "Q0EgYnVuZGxl",
        "cidr": "10.100.0.0/16",
    }
    kubelet = config["spec"]["kubelet"]
    assert kubelet["config"]["maxPods"] == 40
    assert kubelet["config"]["clusterDNS"] == ["10.100.0.10"]
    assert kubelet["config"]["podsPerCore"] == 10
    assert kubelet["config"]["systemReserved"] == {"cpu": "100m", "memory": "200Mi"}
    assert kubelet["config"]["kubeReserved"] == {"cpu": "80m"}
    assert kubelet["config"]["evictionHard"] == {"memory.available": "5%"}
    flags = flag_map(kubelet["flags"])
    labels = dict(item.split("=", 1) for item in flags["node-labels"].split(","))
    assert labels == WANT_LABELS
    assert flags["register-with-taints"].split(",") == WANT_TAINTS
    # the user's NodeConfig (merged over ours by nodeadm) and script are kept as written
    assert yaml.safe_load(parts[1][1])["spec"]["kubelet"]["config"] == {
        "shutdownGracePeriod": "30s"
    }
    assert parts[2][1].strip() == "#!/bin/bash\necho custom > /etc/marker"


def test_al2023_takes_a_plain_script_or_a_bare_nodeconfig_as_one_part() -> None:
    script = render_user_data("AL2023", CLUSTER, NodeSetup(), "#!/bin/bash\ntrue\n")
    assert script is not None
    assert mime_parts(script)[1] == ("text/x-shellscript", "#!/bin/bash\ntrue\n")
    bare = "apiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec: {}\n"
    config = render_user_data("AL2023", CLUSTER, NodeSetup(), bare)
    assert config is not None
    assert mime_parts(config)[1][0] == "application/node.eks.aws"


def test_al2_runs_bootstrap_sh_with_the_kubelet_args_after_the_users_script() -> None:
    text = render_user_data("AL2", CLUSTER, NODE, "#!/bin/bash\necho first\n")
    assert text is not None
    parts = mime_parts(text)
    assert parts[0] == ("text/x-shellscript", "#!/bin/bash\necho first\n")
    kind, script = parts[1]
    assert kind == "text/x-shellscript"
    [command] = [line for line in script.splitlines() if "/etc/eks/bootstrap.sh" in line]
    words = shlex.split(command)
    assert words[:2] == ["/etc/eks/bootstrap.sh", "prod"]
    options = dict(zip(words[2::2], words[3::2], strict=True))
    assert options["--apiserver-endpoint"] == "https://api.example.com"
    assert options["--b64-cluster-ca"] == "Q0EgYnVuZGxl"
    assert options["--dns-cluster-ip"] == "10.100.0.10"
    assert options["--use-max-pods"] == "false"
    extra = flag_map(options["--kubelet-extra-args"].split(" "))
    assert dict(item.split("=", 1) for item in extra["node-labels"].split(",")) == WANT_LABELS
    assert extra["register-with-taints"].split(",") == WANT_TAINTS
    assert extra["max-pods"] == "40"
    assert extra["system-reserved"] == "cpu=100m,memory=200Mi"
    assert extra["eviction-hard"] == "memory.available<5%"


def test_bottlerocket_settings_are_merged_into_the_users_toml() -> None:
    user = (
        "[settings.host-containers.admin]\nenabled = true\n"
        '[settings.kubernetes]\ncluster-name = "wrong"\n'
        '[settings.kubernetes.node-labels]\nmine = "yes"\n'
        '[settings.kubernetes.node-taints]\ndedicated = ["db:NoSchedule"]\n'
    )
    text = render_user_data("Bottlerocket", CLUSTER, NODE, user)
    assert text is not None
    settings = tomllib.loads(text)["settings"]
    assert settings["host-containers"]["admin"]["enabled"] is True
    kube = settings["kubernetes"]
    assert kube["cluster-name"] == "prod"
    assert kube["api-server"] == "https://api.example.com"
    assert kube["cluster-certificate"] == "Q0EgYnVuZGxl"
    assert kube["cluster-dns-ip"] == "10.100.0.10"
    assert kube["max-pods"] == 40
    assert kube["node-labels"] == {"mine": "yes", **WANT_LABELS}
    assert kube["node-taints"] == {
        "dedicated": ["db:NoSchedule"],
        "nvidia.com/gpu": ["true:NoSchedule"],
        "agent-not-ready": [":NoExecute"],
    }
    assert kube["system-reserved"] == {"cpu": "100m", "memory": "200Mi"}
    assert kube["eviction-hard"] == {"memory.available": "5%"}


def test_windows_runs_the_eks_bootstrap_after_the_users_powershell() -> None:
    text = render_user_data("Windows2022", CLUSTER, NODE, "<powershell>Write-Host hi</powershell>")
    assert text is not None
    lines = text.strip().splitlines()
    assert lines[0] == "<powershell>" and lines[-1] == "</powershell>"
    assert lines[1] == "Write-Host hi"
    assert "-EKSClusterName 'prod'" in lines[-2]
    assert "--register-with-taints=" + ",".join(WANT_TAINTS) in lines[-2]


def test_custom_user_data_is_passed_verbatim_and_needs_no_cluster() -> None:
    assert render_user_data("Custom", None, NODE, "anything\n") == "anything\n"
    assert render_user_data("Custom", None, NODE, None) is None


def test_families_that_join_by_themselves_need_the_cluster() -> None:
    with pytest.raises(UserDataError, match="endpoint and CA"):
        render_user_data("AL2023", None, NODE, None)


@pytest.mark.parametrize(
    ("family", "user_data", "expected"),
    [
        ("AL2023", "MIME-Version: 1.0\nContent-Type: text/plain\n\nhello\n", "not a multipart"),
        (
            "AL2023",
            'MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="B"\n\n--X\n\nhi\n',
            "does not parse",
        ),
        (
            "AL2",
            'MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="B"\n\n--B\n'
            "Content-Type: application/node.eks.aws\n\nspec: [unclosed\n--B--\n",
            "not valid YAML",
        ),
        ("Bottlerocket", "[settings.kubernetes\nmax-pods = 3\n", "not valid TOML"),
        ("Bottlerocket", 'settings = "flat"\n', "TOML table"),
    ],
)
def test_bad_user_data_is_a_problem_in_words(family: str, user_data: str, expected: str) -> None:
    assert expected in user_data_problem(family, user_data)
    with pytest.raises(UserDataError, match=expected):
        render_user_data(family, CLUSTER, NODE, user_data)


def test_good_user_data_has_no_problem() -> None:
    assert user_data_problem("AL2023", USER_MIME) == ""
    assert user_data_problem("Bottlerocket", "[settings.kubernetes]\nmax-pods = 3\n") == ""
    assert user_data_problem("Custom", "MIME-Version: broken") == ""


def test_the_kubelet_registers_only_labels_noderestriction_allows() -> None:
    labels = {
        "team": "ml",
        "kubernetes.io/role": "x",
        "node-role.kubernetes.io/worker": "",
        "k8s.io/thing": "y",
        "node.kubernetes.io/lifecycle": "spot",
        "topology.kubernetes.io/zone": "us-east-1a",
        "kubelet.kubernetes.io/x": "1",
    }
    assert kubelet_labels(labels) == {
        "kubelet.kubernetes.io/x": "1",
        "node.kubernetes.io/lifecycle": "spot",
        "team": "ml",
        "topology.kubernetes.io/zone": "us-east-1a",
    }


def test_max_pods_is_the_catalogs_unless_the_class_says_otherwise() -> None:
    assert max_pods(29, 2, None) == 29
    assert max_pods(29, 2, KubeletConfiguration(max_pods=110)) == 110
    assert max_pods(29, 2, KubeletConfiguration(pods_per_core=4)) == 8
    assert max_pods(29, 16, KubeletConfiguration(max_pods=20, pods_per_core=4)) == 20


def test_dns_address_is_the_tenth_of_the_service_cidr() -> None:
    assert ClusterInfo("c", "e", "ca", "172.20.0.0/16").dns_ip == "172.20.0.10"
    assert ClusterInfo("c", "e", "ca", "fd00:10:96::/112").dns_ip == "fd00:10:96::a"
    assert ClusterInfo("c", "e", "ca").dns_ip == ""


def test_toml_writer_round_trips() -> None:
    document: dict[str, Any] = {
        "top": 1,
        "settings": {
            "a b": {"x": 'quote " and \\ and\nnewline', "flag": False, "n": 1.5},
            "list": [1, 2],
            "inline": [{"k": "v"}],
        },
    }
    assert tomllib.loads(dumps(document)) == document


# --- the controller's options for the cluster -------------------------------------------------

PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_a_ca_file_may_be_pem_or_base64_and_nodes_get_base64() -> None:
    encoded = encode_ca_bundle(PEM)
    assert base64.b64decode(encoded).startswith(b"-----BEGIN CERTIFICATE-----")
    assert encode_ca_bundle(encoded.encode() + b"\n") == encoded
    with pytest.raises(ValueError, match="PEM certificate"):
        encode_ca_bundle(b"not a certificate")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--service-cidr", "10.100.0.0/99"], "--service-cidr: expected a CIDR"),
        (["--cluster-endpoint", "api.example.com"], "--cluster-endpoint: expected an https://"),
        (["--cluster-ca-file", "{bad}"], "--cluster-ca-file: expected a PEM"),
    ],
)
def test_bad_cluster_options_are_refused_before_connecting(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    bad = tmp_path / "ca.txt"
    bad.write_text("hello\n")
    args = [a.replace("{bad}", str(bad)) for a in args]
    result = CliRunner().invoke(
        cli, ["controller", "--cloud", "aws", "--cluster-name", "prod", *args]
    )
    assert result.exit_code == 2
    assert expected in result.output
    assert "Traceback" not in result.output


def test_cluster_options_are_passed_on_checked() -> None:
    endpoint, ca_bundle, cidr = cluster_settings("https://api", PEM, "10.0.0.0/16")
    assert (endpoint, cidr) == ("https://api", "10.0.0.0/16")
    assert ca_bundle == encode_ca_bundle(PEM)
    assert cluster_settings(None, None, None) == (None, None, None)


#: Every setting of Karpenter's v1 ``spec.kubelet``, with cluster DNS of the class's own.
FULL = KubeletConfiguration.model_validate(
    {
        "podsPerCore": 2,
        "maxPods": 20,
        "systemReserved": {"cpu": "100m", "memory": "100Mi"},
        "kubeReserved": {"cpu": "200m", "ephemeral-storage": "3Gi"},
        "evictionHard": {"memory.available": "5%", "nodefs.available": "10%"},
        "evictionSoft": {"memory.available": "500Mi"},
        "evictionSoftGracePeriod": {"memory.available": "1m30s"},
        "evictionMaxPodGracePeriod": 60,
        "imageGCHighThresholdPercent": 85,
        "imageGCLowThresholdPercent": 80,
        "cpuCFSQuota": False,
        "clusterDNS": ["10.0.1.100"],
    }
)
FULL_NODE = NodeSetup(max_pods=20, kubelet=FULL)


def test_al2023_nodeconfig_carries_every_kubelet_setting_and_the_classs_dns() -> None:
    text = render_user_data("AL2023", CLUSTER, FULL_NODE, None)
    assert text is not None
    config = yaml.safe_load(mime_parts(text)[0][1])["spec"]["kubelet"]["config"]
    assert config == {
        "maxPods": 20,
        "clusterDNS": ["10.0.1.100"],
        "podsPerCore": 2,
        "systemReserved": {"cpu": "100m", "memory": "100Mi"},
        "kubeReserved": {"cpu": "200m", "ephemeral-storage": "3Gi"},
        "evictionHard": {"memory.available": "5%", "nodefs.available": "10%"},
        "evictionSoft": {"memory.available": "500Mi"},
        "evictionSoftGracePeriod": {"memory.available": "1m30s"},
        "evictionMaxPodGracePeriod": 60,
        "imageGCHighThresholdPercent": 85,
        "imageGCLowThresholdPercent": 80,
        "cpuCFSQuota": False,
    }


def test_al2_bootstrap_args_carry_every_kubelet_setting_and_the_classs_dns() -> None:
    text = render_user_data("AL2", CLUSTER, FULL_NODE, None)
    assert text is not None
    [command] = [
        line for line in mime_parts(text)[0][1].splitlines() if "/etc/eks/bootstrap.sh" in line
    ]
    words = shlex.split(command)
    options = dict(zip(words[2::2], words[3::2], strict=True))
    assert options["--dns-cluster-ip"] == "10.0.1.100"
    extra = flag_map(options["--kubelet-extra-args"].split(" "))
    assert extra["max-pods"] == "20"
    assert extra["pods-per-core"] == "2"
    assert extra["kube-reserved"] == "cpu=200m,ephemeral-storage=3Gi"
    assert extra["eviction-hard"] == "memory.available<5%,nodefs.available<10%"
    assert extra["eviction-soft"] == "memory.available<500Mi"
    assert extra["eviction-soft-grace-period"] == "memory.available=1m30s"
    assert extra["eviction-max-pod-grace-period"] == "60"
    assert extra["image-gc-high-threshold"] == "85"
    assert extra["image-gc-low-threshold"] == "80"
    assert extra["cpu-cfs-quota"] == "false"


def test_bottlerocket_gets_the_kubelet_settings_it_has_keys_for() -> None:
    text = render_user_data("Bottlerocket", CLUSTER, FULL_NODE, None)
    assert text is not None
    kube = tomllib.loads(text)["settings"]["kubernetes"]
    assert kube["cluster-dns-ip"] == "10.0.1.100"
    assert kube["max-pods"] == 20
    assert kube["kube-reserved"] == {"cpu": "200m", "ephemeral-storage": "3Gi"}
    assert kube["eviction-hard"] == {"memory.available": "5%", "nodefs.available": "10%"}
    assert kube["image-gc-high-threshold-percent"] == 85
    assert kube["image-gc-low-threshold-percent"] == 80
    assert kube["cpu-cfs-quota-enforced"] is False
    # Bottlerocket has no soft eviction settings and refuses unknown ones at boot
    assert not {k for k in kube if k.startswith("eviction-soft") or "max-pod-grace" in k}


def test_windows_uses_the_classs_cluster_dns() -> None:
    text = render_user_data("Windows2022", CLUSTER, FULL_NODE, None)
    assert text is not None
    assert "-DNSClusterIP '10.0.1.100'" in text
    assert "--eviction-soft=memory.available<500Mi" in text
