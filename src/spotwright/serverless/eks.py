"""The Kubernetes side of serverless mode: an EKS token, and a drain-only Cluster port.

EKS accepts as a bearer token ``k8s-aws-v1.`` followed by the unpadded base64url of a
presigned STS GetCallerIdentity URL, as ``aws eks get-token`` makes it; the URL's signature
covers the header ``x-k8s-aws-id: <cluster name>``, which ties the token to one cluster. EKS
forwards the URL to STS, which answers with the caller's identity (the function's role),
and maps it to Kubernetes users and groups (an access entry, or aws-auth). The signing is
botocore's request signer, with whatever credentials the session has; nothing is sent.

``connect_cluster`` builds the adapters' ``KubeCluster`` from the endpoint, the CA and the
token, caching only nodes and pods: the cluster need not have spotwright's CRDs, and the
function needs no more RBAC than a drain does.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

import boto3  # type: ignore[import-untyped]
from botocore.signers import RequestSigner  # type: ignore[import-untyped]
from lightkube import AsyncClient, KubeConfig

from spotwright.adapters.kube.client import FIELD_MANAGER, Api, ApiKind
from spotwright.adapters.kube.cluster import KubeCluster
from spotwright.adapters.kube.informer import Informer
from spotwright.ports.cloud import CloudError

__all__ = [
    "CLUSTER_ID_HEADER",
    "PRESIGN_EXPIRES_SECONDS",
    "TOKEN_LIFETIME_SECONDS",
    "TOKEN_PREFIX",
    "EksToken",
    "connect_cluster",
    "disconnect_cluster",
    "eks_token",
    "kube_config",
]

TOKEN_PREFIX: Final = "k8s-aws-v1."
#: The header the presigned URL signs; EKS checks it names the cluster the token is for.
CLUSTER_ID_HEADER: Final = "x-k8s-aws-id"
#: X-Amz-Expires of the presigned URL. STS honours a presigned GetCallerIdentity for 15
#: minutes after its X-Amz-Date whatever this says; EKS expects 60 here.
PRESIGN_EXPIRES_SECONDS: Final = 60
#: How long a token is used: its 15 minutes of validity, less a minute of clock skew.
TOKEN_LIFETIME_SECONDS: Final = 14 * 60


@dataclass(frozen=True, slots=True)
class EksToken:
    """A bearer token for the EKS API server; ``expires_at`` is in epoch seconds."""

    value: str
    expires_at: float
    #: The presigned STS URL inside the token (for logs and tests; a credential, too).
    url: str


def eks_token(
    cluster_name: str,
    *,
    region: str,
    session: Any = None,
    sts_endpoint: str | None = None,
) -> EksToken:
    """Presign STS GetCallerIdentity for ``cluster_name`` with the session's credentials.

    The signature covers the ``x-k8s-aws-id`` header, so the token is good for that
    cluster only. ``sts_endpoint`` defaults to the region's STS endpoint (what EKS
    expects; a test may point it elsewhere).
    """
    if not cluster_name:
        raise ValueError("an EKS token needs the cluster name")
    session = session or boto3.session.Session(region_name=region)
    credentials = session.get_credentials()
    if credentials is None:
        raise CloudError("NoCredentials", "no AWS credentials to sign the EKS token with")
    # The client is only a source of the endpoint (regional, partition-aware), the service
    # id and the event hooks; no request is sent.
    sts = session.client("sts", region_name=region, endpoint_url=sts_endpoint)
    endpoint = str(sts.meta.endpoint_url).rstrip("/")
    signer = RequestSigner(
        sts.meta.service_model.service_id, region, "sts", "v4", credentials, sts.meta.events
    )
    url = signer.generate_presigned_url(
        {
            "method": "GET",
            "url": f"{endpoint}/?Action=GetCallerIdentity&Version=2011-06-15",
            "body": {},
            "headers": {CLUSTER_ID_HEADER: cluster_name},
            "context": {},
        },
        region_name=region,
        expires_in=PRESIGN_EXPIRES_SECONDS,
        operation_name="",
    )
    encoded = base64.urlsafe_b64encode(str(url).encode()).decode().rstrip("=")
    signed = parse_qs(urlsplit(url).query).get("X-Amz-Date", [""])[0]
    signed_at = (
        datetime.strptime(signed, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()
        if signed
        else time.time()
    )
    return EksToken(TOKEN_PREFIX + encoded, signed_at + TOKEN_LIFETIME_SECONDS, str(url))


def kube_config(endpoint: str, certificate_authority: str, token: str) -> KubeConfig:
    """A one-cluster kubeconfig: the API server, its CA (base64 PEM, as EKS gives it), a token."""
    if not endpoint.startswith("https://"):
        raise ValueError(f"the cluster endpoint must be an https:// URL, not {endpoint!r}")
    return KubeConfig.from_dict(
        {
            "clusters": [
                {
                    "name": "eks",
                    "cluster": {
                        "server": endpoint,
                        "certificate-authority-data": certificate_authority,
                    },
                }
            ],
            "users": [{"name": "spotwright", "user": {"token": token}}],
            "contexts": [{"name": "eks", "context": {"cluster": "eks", "user": "spotwright"}}],
            "current-context": "eks",
        }
    )


class _TrackingApi(Api):
    """The adapter's API calls, counting the creates in flight (Events, evictions aside)."""

    def __init__(self, client: AsyncClient) -> None:
        super().__init__(client)
        self.creating = 0

    async def create(
        self, kind: ApiKind, obj: Mapping[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        self.creating += 1
        try:
            return await super().create(kind, obj, namespace)
        finally:
            self.creating -= 1


class _NodeDrainCluster(KubeCluster):
    """A KubeCluster that caches only what a drain reads: nodes and pods.

    No NodeClaim cache (the cluster need not have spotwright's CRDs) and no
    PodDisruptionBudget cache (the Eviction API enforces budgets), hence less RBAC. Its
    ``flush_events`` also waits for the Events being sent, not only for the queued ones:
    the function's process is frozen as soon as it returns, and the last Event of a drain
    would be lost.
    """

    def __init__(self, api: _TrackingApi) -> None:
        super().__init__(api, identity="spotwright-serverless")
        self._tracking = api

    @property
    def informers(self) -> tuple[Informer[Any], ...]:
        return (self.pods_cache, self.nodes_cache)

    async def flush_events(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        await super().flush_events(timeout)
        while self._tracking.creating and time.monotonic() < deadline:
            await asyncio.sleep(0.02)


async def connect_cluster(
    endpoint: str, certificate_authority: str, token: str, *, timeout: float = 30.0
) -> KubeCluster:
    """The Cluster port on the API server at ``endpoint``, caches filled.

    Only nodes and pods are cached (``_NodeDrainCluster``), so the RBAC the drain needs is
    get/list/watch/patch nodes (a conflicting taint patch re-reads the node),
    list/watch/delete pods, create pods/eviction and events (docs/serverless.md).
    """
    api = _TrackingApi(
        AsyncClient(
            config=kube_config(endpoint, certificate_authority, token),
            field_manager=FIELD_MANAGER,
        )
    )
    cluster = _NodeDrainCluster(api)
    try:
        await cluster.start(timeout=timeout)
    except BaseException:
        await cluster.close()
        await api.close()
        raise
    return cluster


async def disconnect_cluster(cluster: KubeCluster) -> None:
    """Send the Events still queued, stop the caches, close the connections."""
    await cluster.flush_events()
    await cluster.close()
    await cluster.api.close()
