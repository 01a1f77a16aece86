"""The test cluster's layout and the command line of each component.

Addresses, ranges and identities are fixed here once, because the certificates
(:mod:`spotwright.testing._credentials`) and the command lines must agree on them; the
ports are not, because every cluster takes free ones (:data:`PORT_NAMES` names them). The
flags follow what kubeadm sets up, minus what a throw-away loopback cluster does not want:
leader election, profiling, fsync and request throttling.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from spotwright.testing._errors import ClusterUnavailable

if TYPE_CHECKING:
    from spotwright.testing._credentials import Credentials

#: Annotation (and label) that marks a Node as a kwok fake managed by this cluster's kwok.
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")

SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"
# Not loopback, not routed: the apiserver only publishes it; nothing connects to it.
ADVERTISE_ADDRESS = "10.255.255.254"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
FRONT_PROXY_CLIENT = "front-proxy-client"

#: The listeners each cluster takes a free 127.0.0.1 port for.
PORT_NAMES = ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler")

# Stage files (from the build's stages/ directory) that make up kwok's --config.
_BASE_STAGES = (
    "node-initialize.yaml",
    "node-heartbeat-with-lease.yaml",
    "pod-ready.yaml",
    "pod-complete.yaml",
)


def write_kwok_config(stages_dir: Path, path: Path, *, graceful_pod_delete: bool) -> Path:
    """kwok's ``--config``: the base stages and one of the two pod-delete stages."""
    delete = "pod-delete-graceful.yaml" if graceful_pod_delete else "pod-delete-fast.yaml"
    parts = []
    for name in (*_BASE_STAGES, delete):
        source = stages_dir / name
        if not source.is_file():
            raise ClusterUnavailable(f"kwok stage file {source} is missing; rebuild")
        parts.append(source.read_text().strip() + "\n")
    path.write_text("---\n".join(parts))
    return path


def etcd_args(ports: Mapping[str, int], data_dir: Path) -> list[str]:
    client = f"http://127.0.0.1:{ports['etcd']}"
    peer = f"http://127.0.0.1:{ports['etcd-peer']}"
    return [
        "--name=spotwright",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=spotwright={peer}",
        "--initial-cluster-state=new",
        "--unsafe-no-fsync=true",
        "--auto-compaction-retention=1",
        "--quota-backend-bytes=4294967296",
        "--log-level=warn",
    ]


def apiserver_args(ports: Mapping[str, int], creds: Credentials, cert_dir: Path) -> list[str]:
    return [
        f"--etcd-servers=http://127.0.0.1:{ports['etcd']}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports['apiserver']}",
        f"--advertise-address={ADVERTISE_ADDRESS}",
        "--endpoint-reconciler-type=none",
        f"--cert-dir={cert_dir}",
        f"--tls-cert-file={creds.serving_cert}",
        f"--tls-private-key-file={creds.serving_key}",
        f"--client-ca-file={creds.ca_cert}",
        f"--requestheader-client-ca-file={creds.front_proxy_ca_cert}",
        f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={creds.front_proxy_client_cert}",
        f"--proxy-client-key-file={creds.front_proxy_client_key}",
        f"--token-auth-file={creds.token_file}",
        "--authorization-mode=Node,RBAC",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={creds.sa_pub}",
        f"--service-account-signing-key-file={creds.sa_key}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        "--allow-privileged=true",
        # No request throttling: tests and benchmarks measure spotwright, not APF.
        "--enable-priority-and-fairness=false",
        "--max-requests-inflight=0",
        "--max-mutating-requests-inflight=0",
        "--profiling=false",
    ]


def controller_manager_args(
    ports: Mapping[str, int], creds: Credentials, kubeconfig: Path
) -> list[str]:
    """Per-controller ServiceAccount credentials, and the cluster CA to sign with, as
    kubeadm runs it, so ServiceAccount tokens and RBAC behave as in a real cluster."""
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports['controller-manager']}",
        "--leader-elect=false",
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={creds.sa_key}",
        f"--root-ca-file={creds.ca_cert}",
        f"--cluster-signing-cert-file={creds.ca_cert}",
        f"--cluster-signing-key-file={creds.ca_key}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        "--kube-api-qps=200",
        "--kube-api-burst=400",
        "--profiling=false",
    ]


def scheduler_args(ports: Mapping[str, int], kubeconfig: Path) -> list[str]:
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports['scheduler']}",
        "--leader-elect=false",
        "--profiling=false",
    ]


def kwok_args(kubeconfig: Path, config: Path) -> list[str]:
    """kwok manages only the Nodes annotated :data:`KWOK_NODE_ANNOTATION`, so a test can
    also create Nodes that nothing makes Ready."""
    return [
        f"--kubeconfig={kubeconfig}",
        f"--config={config}",
        "--manage-all-nodes=false",
        "--manage-nodes-with-annotation-selector=" + "=".join(KWOK_NODE_ANNOTATION),
        "--node-lease-duration-seconds=40",
        f"--cidr={POD_CIDR}",
        "--node-ip=10.0.0.1",
    ]
