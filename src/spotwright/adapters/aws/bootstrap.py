"""The user data a node boots with: how its kubelet joins the cluster, per AMI family.

A node must register with its NodePool's labels, taints and startup taints already on it:
added after registration, they leave a window in which kube-scheduler binds pods the
taints were meant to keep away. And an AL2023 node cannot join at all without a nodeadm
``NodeConfig`` naming the cluster. So, as Karpenter does, the launch template's user data
is generated per AMI family from the cluster's coordinates (``ClusterInfo``), what the node
must carry (``NodeSetup``: labels, taints, the EC2NodeClass's kubelet block, max pods) and
the class's own ``userData``, which is kept:

* AL2023: a MIME multipart document whose first part is spotwright's ``NodeConfig``; the
  user's parts follow unchanged, so a NodeConfig of theirs is merged over it by nodeadm.
* AL2: the user's parts first, then a shell script running ``/etc/eks/bootstrap.sh`` with
  ``--kubelet-extra-args``.
* Bottlerocket: the user's TOML with ``settings.kubernetes`` filled in (``bottlerocket_toml``).
* Windows: the user's PowerShell, then ``Start-EKSBootstrap.ps1``.
* Custom: the user's data verbatim; their AMI bootstraps itself.

Everything here is pure (no I/O), so each format is tested by parsing what it produces.
Bad user data raises ``UserDataError``; ``user_data_problem`` says the same as a text for
the class's problem, before anything is launched.
"""

from __future__ import annotations

import email
import email.policy
import ipaddress
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from email.message import Message
from typing import Any, Final

import yaml

from spotwright.adapters.aws.bottlerocket_toml import (
    UserDataError,
    bottlerocket_user_data,
)
from spotwright.model.kubelet import KubeletConfiguration, pod_slots
from spotwright.model.objects import Taint

__all__ = [
    "BOUNDARY",
    "ClusterInfo",
    "NodeSetup",
    "UserDataError",
    "dns_addresses",
    "family_of_parameter",
    "kubelet_labels",
    "max_pods",
    "render_user_data",
    "user_data_problem",
]

#: Fixed, so equal inputs give byte-equal documents (and the same launch template).
BOUNDARY: Final = "//spotwright-user-data//"
NODEADM_TYPE: Final = "application/node.eks.aws"
SHELL_TYPE: Final = "text/x-shellscript"

#: Labels in the kubernetes.io and k8s.io domains the kubelet may set on its own node
#: (the NodeRestriction admission plugin refuses the others, and the kubelet then fails
#: to register); the lifecycle controller adds the refused ones after registration.
_KUBELET_ALLOWED: Final = frozenset(
    {
        "kubernetes.io/hostname",
        "kubernetes.io/arch",
        "kubernetes.io/os",
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "failure-domain.beta.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
    }
)
_KUBELET_ALLOWED_DOMAINS: Final = ("kubelet.kubernetes.io", "node.kubernetes.io")


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    """What a node needs to find and trust the API server (EKS DescribeCluster's answer)."""

    name: str
    endpoint: str
    #: The CA bundle, base64-encoded PEM (as EKS returns it and nodeadm takes it).
    ca_bundle: str
    #: The service CIDR; the cluster DNS address is its tenth address, as on EKS.
    service_cidr: str = ""

    @property
    def dns_ip(self) -> str:
        if not self.service_cidr:
            return ""
        return str(ipaddress.ip_network(self.service_cidr, strict=False)[10])


@dataclass(frozen=True, slots=True)
class NodeSetup:
    """What one node must register with: the same for every node of a claim's launch
    template, so launch templates are shared by claims that agree on it."""

    labels: tuple[tuple[str, str], ...] = ()
    #: Taints and startup taints alike: both must be there from the first moment.
    taints: tuple[Taint, ...] = ()
    max_pods: int | None = None
    kubelet: KubeletConfiguration | None = None


def family_of_parameter(parameter: str) -> str:
    """The AMI family an SSM parameter's images belong to (Custom if unknown)."""
    if "bottlerocket" in parameter:
        return "Bottlerocket"
    if "amazon-linux-2023" in parameter:
        return "AL2023"
    if "amazon-linux-2" in parameter:
        return "AL2"
    if "Windows_Server-2019" in parameter:
        return "Windows2019"
    if "Windows_Server-2022" in parameter:
        return "Windows2022"
    if "Windows_Server-2025" in parameter:
        return "Windows2025"
    return "Custom"


def kubelet_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The labels the kubelet may register with itself, sorted by key."""
    out: dict[str, str] = {}
    for key in sorted(labels):
        domain = key.partition("/")[0] if "/" in key else ""
        restricted = domain.endswith("kubernetes.io") or domain.endswith("k8s.io")
        allowed = key in _KUBELET_ALLOWED or any(
            domain == d or domain.endswith("." + d) for d in _KUBELET_ALLOWED_DOMAINS
        )
        if not restricted or allowed:
            out[key] = labels[key]
    return out


def max_pods(catalog_pods: int, vcpu: int, kubelet: KubeletConfiguration | None) -> int:
    """Pods the kubelet admits; the scheduler counts with the same figure
    (``model.kubelet.pod_slots``), so a node never refuses the pods it was planned for."""
    return pod_slots(catalog_pods, vcpu, kubelet)


def dns_addresses(cluster: ClusterInfo, kubelet: KubeletConfiguration | None) -> list[str]:
    """The cluster DNS addresses pods are given: the class's ``clusterDNS`` if it names
    any, else the service CIDR's tenth address (EKS's default for CoreDNS)."""
    if kubelet is not None and kubelet.cluster_dns:
        return list(kubelet.cluster_dns)
    return [cluster.dns_ip] if cluster.dns_ip else []


def _taint_text(taint: Taint) -> str:
    """``key=value:Effect``, or ``key:Effect`` for a taint without a value."""
    return str(taint)


def _map_text(values: Mapping[str, str], sep: str = "=") -> str:
    return ",".join(f"{k}{sep}{v}" for k, v in sorted(values.items()))


def kubelet_flags(node: NodeSetup, *, with_config: bool) -> list[str]:
    """Kubelet command-line flags: labels and taints always; with ``with_config`` also the
    kubelet block (for bootstrap scripts, which take no KubeletConfiguration)."""
    flags: list[str] = []
    labels = kubelet_labels(dict(node.labels))
    if labels:
        flags.append("--node-labels=" + _map_text(labels))
    if node.taints:
        flags.append("--register-with-taints=" + ",".join(_taint_text(t) for t in node.taints))
    if not with_config:
        return flags
    if node.max_pods is not None:
        flags.append(f"--max-pods={node.max_pods}")
    kubelet = node.kubelet
    if kubelet is None:
        return flags
    if kubelet.pods_per_core is not None:
        flags.append(f"--pods-per-core={kubelet.pods_per_core}")
    for flag, values, sep in (
        ("--system-reserved", kubelet.system_reserved, "="),
        ("--kube-reserved", kubelet.kube_reserved, "="),
        ("--eviction-hard", kubelet.eviction_hard, "<"),
        ("--eviction-soft", kubelet.eviction_soft, "<"),
        ("--eviction-soft-grace-period", kubelet.eviction_soft_grace_period, "="),
    ):
        if values:
            flags.append(f"{flag}={_map_text(values, sep)}")
    for flag, value in (
        ("--eviction-max-pod-grace-period", kubelet.eviction_max_pod_grace_period),
        ("--image-gc-high-threshold", kubelet.image_gc_high_threshold_percent),
        ("--image-gc-low-threshold", kubelet.image_gc_low_threshold_percent),
    ):
        if value is not None:
            flags.append(f"{flag}={value}")
    if kubelet.cpu_cfs_quota is not None:
        flags.append(f"--cpu-cfs-quota={str(kubelet.cpu_cfs_quota).lower()}")
    return flags


def kubelet_config(node: NodeSetup, cluster: ClusterInfo) -> dict[str, Any]:
    """The node's KubeletConfiguration fields, in the kubelet's own (camelCase) names:
    Karpenter's names are the kubelet's, so the class's block is written as it reads."""
    config: dict[str, Any] = {}
    if node.max_pods is not None:
        config["maxPods"] = node.max_pods
    dns = dns_addresses(cluster, node.kubelet)
    if dns:
        config["clusterDNS"] = dns
    kubelet = node.kubelet
    if kubelet is None:
        return config
    given = kubelet.model_dump(by_alias=True, exclude_defaults=True)
    for key in sorted(given):
        if key in ("maxPods", "clusterDNS"):
            continue  # maxPods is node.max_pods (already capped); clusterDNS is above
        value = given[key]
        config[key] = dict(sorted(value.items())) if isinstance(value, dict) else value
    return config


# --- MIME ------------------------------------------------------------------------------


def _is_mime(text: str) -> bool:
    return text.lstrip().lower().startswith("mime-version:")


def user_parts(text: str | None, *, default_type: str) -> list[tuple[list[tuple[str, str]], str]]:
    """The user's user data as MIME parts (headers, payload); text that is not MIME is
    one part of ``default_type`` (a NodeConfig is recognised as one)."""
    if not text or not text.strip():
        return []
    if not _is_mime(text):
        kind = NODEADM_TYPE if "node.eks.aws/" in text and "NodeConfig" in text else default_type
        return [([("Content-Type", kind)], text)]
    message = email.message_from_string(text.lstrip(), policy=email.policy.compat32)
    defects = [type(d).__name__ for d in message.defects]
    if defects or (message.get_content_maintype() == "multipart" and not message.is_multipart()):
        raise UserDataError(
            f"userData is a MIME document that does not parse ({', '.join(defects)}); "
            "check the boundary in Content-Type and the --boundary lines"
        )
    if not message.is_multipart():
        raise UserDataError(
            "userData starts with MIME-Version but is not a multipart/mixed document "
            f"(Content-Type {message.get_content_type()})"
        )
    parts: list[tuple[list[tuple[str, str]], str]] = []
    for part in message.get_payload():
        assert isinstance(part, Message)
        payload = part.get_payload()
        if not isinstance(payload, str):
            raise UserDataError("userData has a nested multipart part; flatten it")
        if part.get_content_type() == NODEADM_TYPE:
            _check_nodeconfig(payload)
        parts.append(([(k, str(v)) for k, v in part.items()], payload))
    if not parts:
        raise UserDataError("userData is a MIME document without any part")
    return parts


def _check_nodeconfig(payload: str) -> None:
    try:
        documents = list(yaml.safe_load_all(payload))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise UserDataError(f"userData's NodeConfig part is not valid YAML{where}") from None
    for document in documents:
        if document is not None and not isinstance(document, dict):
            raise UserDataError("userData's NodeConfig part is not a YAML mapping")


def mime_document(parts: Sequence[tuple[Sequence[tuple[str, str]], str]]) -> str:
    lines = ["MIME-Version: 1.0", f'Content-Type: multipart/mixed; boundary="{BOUNDARY}"', ""]
    for headers, payload in parts:
        lines.append(f"--{BOUNDARY}")
        lines.extend(f"{k}: {v}" for k, v in headers)
        lines.append("")
        lines.append(payload.rstrip("\n"))
        lines.append("")
    lines.append(f"--{BOUNDARY}--")
    return "\n".join(lines) + "\n"


# --- families ------------------------------------------------------------------------------


def _need(cluster: ClusterInfo | None, family: str) -> ClusterInfo:
    if cluster is None:
        raise UserDataError(f"{family} nodes need the cluster's endpoint and CA to join")
    return cluster


def al2023_user_data(cluster: ClusterInfo, node: NodeSetup, custom: str | None) -> str:
    spec: dict[str, Any] = {
        "cluster": {
            "name": cluster.name,
            "apiServerEndpoint": cluster.endpoint,
            "certificateAuthority": cluster.ca_bundle,
        }
    }
    if cluster.service_cidr:
        spec["cluster"]["cidr"] = cluster.service_cidr
    kubelet: dict[str, Any] = {}
    config = kubelet_config(node, cluster)
    if config:
        kubelet["config"] = config
    flags = kubelet_flags(node, with_config=False)
    if flags:
        kubelet["flags"] = flags
    if kubelet:
        spec["kubelet"] = kubelet
    document = {"apiVersion": "node.eks.aws/v1alpha1", "kind": "NodeConfig", "spec": spec}
    ours = "---\n" + yaml.safe_dump(document, sort_keys=False, default_flow_style=False)
    parts = [([("Content-Type", NODEADM_TYPE)], ours)]
    parts.extend(user_parts(custom, default_type=SHELL_TYPE))
    return mime_document(parts)


def al2_user_data(cluster: ClusterInfo, node: NodeSetup, custom: str | None) -> str:
    args = [
        "/etc/eks/bootstrap.sh",
        cluster.name,
        "--apiserver-endpoint",
        cluster.endpoint,
        "--b64-cluster-ca",
        cluster.ca_bundle,
    ]
    dns = dns_addresses(cluster, node.kubelet)
    if dns:
        args += ["--dns-cluster-ip", dns[0]]
    if node.max_pods is not None:
        args += ["--use-max-pods", "false"]
    extra = kubelet_flags(node, with_config=True)
    if extra:
        args += ["--kubelet-extra-args", " ".join(extra)]
    script = "\n".join(
        [
            "#!/bin/bash -xe",
            "exec > >(tee /var/log/user-data.log | logger -t user-data -s 2>/dev/console) 2>&1",
            " ".join(shlex.quote(a) for a in args),
        ]
    )
    parts = user_parts(custom, default_type=SHELL_TYPE)
    parts.append(([("Content-Type", f'{SHELL_TYPE}; charset="us-ascii"')], script))
    return mime_document(parts)


def _ps(value: str) -> str:
    """A PowerShell single-quoted string."""
    return "'" + value.replace("'", "''") + "'"


def windows_user_data(cluster: ClusterInfo, node: NodeSetup, custom: str | None) -> str:
    body = (custom or "").replace("<powershell>", "").replace("</powershell>", "").strip()
    command = [
        "& $EKSBootstrapScriptFile",
        f"-EKSClusterName {_ps(cluster.name)}",
        f"-APIServerEndpoint {_ps(cluster.endpoint)}",
        f"-Base64ClusterCA {_ps(cluster.ca_bundle)}",
    ]
    extra = kubelet_flags(node, with_config=True)
    if extra:
        command.append(f"-KubeletExtraArgs {_ps(' '.join(extra))}")
    dns = dns_addresses(cluster, node.kubelet)
    if dns:
        command.append(f"-DNSClusterIP {_ps(dns[0])}")
    lines = ["<powershell>"]
    if body:
        lines.append(body)
    lines.append(
        '[string]$EKSBootstrapScriptFile = "$env:ProgramFiles\\Amazon\\EKS\\Start-EKSBootstrap.ps1"'
    )
    lines.append(" ".join(command))
    lines.append("</powershell>")
    return "\n".join(lines) + "\n"


def render_user_data(
    family: str, cluster: ClusterInfo | None, node: NodeSetup, custom: str | None
) -> str | None:
    """The node's user data (None: none at all); raises UserDataError on bad user data."""
    if family == "Custom":
        return custom or None
    if family == "AL2023":
        return al2023_user_data(_need(cluster, family), node, custom)
    if family == "AL2":
        return al2_user_data(_need(cluster, family), node, custom)
    if family == "Bottlerocket":
        info = _need(cluster, family)
        return bottlerocket_user_data(
            custom,
            cluster_name=info.name,
            endpoint=info.endpoint,
            ca_bundle=info.ca_bundle,
            dns_ips=dns_addresses(info, node.kubelet),
            labels=kubelet_labels(dict(node.labels)),
            taints=[(t.key, t.value, t.effect) for t in node.taints],
            max_pods=node.max_pods,
            kubelet=node.kubelet,
        )
    if family.startswith("Windows"):
        return windows_user_data(_need(cluster, family), node, custom)
    raise UserDataError(f"unknown AMI family {family}")


def user_data_problem(family: str, custom: str | None) -> str:
    """Why the class's ``userData`` cannot be used with ``family`` ("" if it can): found
    by rendering it for a stand-in node, so the class says so before any launch."""
    stand_in = ClusterInfo("cluster", "https://cluster.invalid", "Q0E=")
    try:
        render_user_data(family, stand_in, NodeSetup(), custom)
    except UserDataError as exc:
        return str(exc)
    return ""
