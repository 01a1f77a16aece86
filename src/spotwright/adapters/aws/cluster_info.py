"""Where the nodes' user data gets the cluster's coordinates: options, else EKS.

A node needs the API server's endpoint and CA bundle to join, and the service CIDR to
know the cluster DNS address. The controller takes them from its options
(``--cluster-endpoint``, ``--cluster-ca-file``, ``--service-cidr``) and asks EKS
DescribeCluster, once, only for what is missing; if neither has the endpoint and CA, a
launch fails with a ``ClusterInfoUnavailable`` error that says which option to pass.
``node_template`` then renders a launch's user data (``bootstrap``) with them.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import ipaddress
from collections.abc import Callable

from spotwright.adapters.aws._api import AwsCaller
from spotwright.adapters.aws.bootstrap import (
    ClusterInfo,
    NodeSetup,
    UserDataError,
    max_pods,
    render_user_data,
)
from spotwright.adapters.aws.launch_templates import TemplateSettings
from spotwright.adapters.aws.nodeclasses import LaunchSpec
from spotwright.adapters.aws.settings import EC2Settings
from spotwright.catalog._types import InstanceType
from spotwright.observability.logs import get_logger
from spotwright.ports.cloud import CloudError, LaunchRequest

__all__ = ["ClusterSource", "cluster_settings", "encode_ca_bundle"]

log = get_logger("aws.cluster")


def encode_ca_bundle(raw: bytes) -> str:
    """A CA file's content as nodes take it (base64 PEM): a PEM file is encoded, a file
    already holding base64 (as ``aws eks describe-cluster`` prints it) is kept."""
    text = raw.strip()
    if text.startswith(b"-----BEGIN CERTIFICATE-----"):
        return base64.b64encode(text + b"\n").decode()
    try:
        decoded = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        decoded = b""
    if b"-----BEGIN CERTIFICATE-----" not in decoded:
        raise ValueError("expected a PEM certificate bundle or its base64 encoding")
    return text.decode()


def cluster_settings(
    endpoint: str | None, ca_file: bytes | None, service_cidr: str | None
) -> tuple[str | None, str | None, str | None]:
    """The options checked: (endpoint, base64 CA bundle, service CIDR); ValueError names
    the option that is wrong."""
    if endpoint and not endpoint.startswith("https://"):
        raise ValueError(f"--cluster-endpoint: expected an https:// URL, got {endpoint!r}")
    ca_bundle = None
    if ca_file is not None:
        try:
            ca_bundle = encode_ca_bundle(ca_file)
        except ValueError as exc:
            raise ValueError(f"--cluster-ca-file: {exc}") from None
    if service_cidr:
        try:
            ipaddress.ip_network(service_cidr, strict=False)
        except ValueError:
            raise ValueError(
                f"--service-cidr: expected a CIDR such as 10.100.0.0/16, got {service_cidr!r}"
            ) from None
    return endpoint or None, ca_bundle, service_cidr or None


class ClusterSource:
    """The cluster's ``ClusterInfo``, resolved on first use and kept."""

    def __init__(self, settings: EC2Settings, eks: Callable[[], AwsCaller]) -> None:
        self._settings = settings
        self._eks = eks
        self._info: ClusterInfo | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> ClusterInfo:
        if self._info is not None:
            return self._info
        async with self._lock:
            if self._info is None:
                self._info = await self._resolve()
        return self._info

    async def node_template(
        self, spec: LaunchSpec, request: LaunchRequest, itype: InstanceType
    ) -> TemplateSettings:
        """The class's template settings with the user data of a node of ``itype`` for
        ``request``: types differ in it only by max pods, so those agreeing share a template."""
        cluster = await self.get() if spec.family != "Custom" else None
        node = NodeSetup(
            labels=request.labels,
            taints=request.taints,
            max_pods=max_pods(itype.allocatable.pods, itype.vcpu, spec.kubelet),
            kubelet=spec.kubelet,
        )
        try:
            user_data = render_user_data(spec.family, cluster, node, spec.template.user_data)
        except UserDataError as exc:
            raise CloudError("UserDataInvalid", str(exc)) from None
        return dataclasses.replace(spec.template, user_data=user_data)

    async def _resolve(self) -> ClusterInfo:
        settings = self._settings
        endpoint, ca_bundle = settings.cluster_endpoint, settings.cluster_ca_bundle
        cidr = settings.service_cidr
        if not (endpoint and ca_bundle and cidr):
            try:
                answer = await self._eks().call("DescribeCluster", name=settings.cluster_name)
                found = answer.get("cluster") or {}
            except CloudError as exc:
                if not (endpoint and ca_bundle):
                    raise CloudError(
                        "ClusterInfoUnavailable",
                        "nodes need the cluster's endpoint and CA to join: pass "
                        "--cluster-endpoint and --cluster-ca-file, or allow "
                        f"eks:DescribeCluster on {settings.cluster_name} ({exc.code}: "
                        f"{exc.message})",
                    ) from exc
                # only the service CIDR is missing: nodes then use the AMI's DNS default
                log.warning("EKS DescribeCluster failed", error=str(exc))
                found = {}
            network = found.get("kubernetesNetworkConfig") or {}
            endpoint = endpoint or str(found.get("endpoint") or "")
            ca_bundle = ca_bundle or str((found.get("certificateAuthority") or {}).get("data", ""))
            cidr = cidr or str(
                network.get("serviceIpv4Cidr") or network.get("serviceIpv6Cidr") or ""
            )
            if not (endpoint and ca_bundle):
                raise CloudError(
                    "ClusterInfoUnavailable",
                    f"EKS cluster {settings.cluster_name} has no endpoint or CA yet",
                )
        log.info("cluster for node bootstrap", endpoint=endpoint, service_cidr=cidr or None)
        return ClusterInfo(settings.cluster_name, endpoint, ca_bundle, cidr or "")
