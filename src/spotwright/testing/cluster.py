"""A real, local Kubernetes control plane for tests: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok on 127.0.0.1.

::

    from spotwright.testing.cluster import TestCluster, ensure_binaries

    with TestCluster(ensure_binaries()) as cluster:
        cluster.kubeconfig        # admin (system:masters) kubeconfig, a file path
        cluster.service_account_kubeconfig("spotwright", "controller")

Nodes are simulated by kwok: a Node with the annotation ``kwok.x-k8s.io/node=fake``
(:data:`KWOK_NODE_ANNOTATION`) is made Ready and heart-beaten through its Lease, and pods
the real scheduler binds to it are made Running. Nothing else is faked: deployments,
replica sets, PodDisruptionBudgets, evictions, RBAC, ServiceAccount tokens and garbage
collection are the real controllers'.

Design notes:

* Every listener is on 127.0.0.1 with a free port; no default port (2379, 6443, 10257,
  10259) is assumed, so several clusters (or other engineers' processes) can coexist.
* One self-made CA signs the apiserver's serving certificate (SANs 127.0.0.1, localhost and
  the in-cluster names), so clients verify TLS against ``ca.crt`` instead of skipping it.
  The ServiceAccount signing key is a separate RSA key. Certificates are generated with the
  ``cryptography`` package, imported only when a cluster starts.
* Each component authenticates as itself with a static token (kube-controller-manager as
  ``system:kube-controller-manager`` with per-controller ServiceAccount credentials,
  kube-scheduler as ``system:kube-scheduler``), under ``--authorization-mode=Node,RBAC``,
  as kubeadm sets them up; tests use the ``admin`` token (group ``system:masters``) or a
  ServiceAccount token minted through the TokenRequest API, which exercises real RBAC.
* The apiserver is told a non-loopback advertise address and runs without an endpoint
  reconciler: a loopback advertise address is rejected, and with no default route the
  auto-detection fails.
* Each component runs in its own session (process group); :meth:`TestCluster.stop`
  signals the groups in reverse start order, SIGTERM then SIGKILL. When started from the
  main thread on Linux the children also get ``PR_SET_PDEATHSIG``, so a test runner killed
  with SIGKILL does not leave a control plane behind.

This module imports only the standard library at import time; it never runs Go itself
(building is :mod:`spotwright.testing.build`'s job, which :func:`ensure_binaries` calls on
request).
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as dt
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from spotwright.testing.versions import (
    BINARIES,
    PINS,
    Pins,
    binary_dir,
    build_dir,
    missing_artifacts,
)

#: Annotation (and label) that marks a Node as a kwok fake managed by this cluster's kwok.
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")

#: Environment variable that makes :func:`ensure_binaries` (and the pytest fixture) build.
BUILD_ENV = "SPOTWRIGHT_TESTCLUSTER_BUILD"
#: Environment variable that keeps the work directory (logs, certs, kubeconfigs) after stop.
KEEP_ENV = "SPOTWRIGHT_TESTCLUSTER_KEEP"

SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"
# Not loopback, not routed: the apiserver only publishes it; nothing connects to it.
ADVERTISE_ADDRESS = "10.255.255.254"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
FRONT_PROXY_CLIENT = "front-proxy-client"
WORKDIR_PREFIX = "spotwright-testcluster-"
OWNER_FILE = ".owner-pid"

# Stage files (from the build's stages/ directory) that make up kwok's --config.
_BASE_STAGES = (
    "node-initialize.yaml",
    "node-heartbeat-with-lease.yaml",
    "pod-ready.yaml",
    "pod-complete.yaml",
)


class ClusterUnavailable(RuntimeError):
    """The tier cannot run here; ``str(exc)`` is a one-line reason suitable for a skip."""


class ClusterStartError(RuntimeError):
    """A component failed to start or become healthy; the message carries its log tail."""


# --- binaries ----------------------------------------------------------------------------------


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def ensure_binaries(pins: Pins = PINS, *, build: bool | None = None) -> Path:
    """Return the ``bin`` directory of a complete build of ``pins``.

    With ``build`` true (default: ``$SPOTWRIGHT_TESTCLUSTER_BUILD``) a missing build is made
    first, which takes tens of minutes cold. Raises :class:`ClusterUnavailable` with a one-line
    reason when the binaries are missing and building was not requested, or when it was but
    Go or the module proxy is unavailable. A build that starts and fails raises
    :class:`spotwright.testing.build.BuildError`: that is a bug to fix, not a reason to skip.
    """
    missing = missing_artifacts(pins)
    if not missing:
        return binary_dir(pins)
    if build is None:
        build = _truthy(os.environ.get(BUILD_ENV))
    if not build:
        raise ClusterUnavailable(
            f"test-cluster binaries not built ({build_dir(pins)} lacks {missing[0]}); run "
            f"`python -m spotwright.testing.build` or set {BUILD_ENV}=1"
        )
    from spotwright.testing import build as builder

    try:
        return builder.build(pins)
    except builder.Unavailable as exc:
        raise ClusterUnavailable(f"cannot build the test cluster: {exc}") from exc


# --- small helpers ---------------------------------------------------------------------------


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (held open together, then released)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _pdeathsig() -> Callable[[], None] | None:
    """A preexec function that asks Linux to SIGKILL the child when its parent thread dies.

    Only from the main thread: the signal fires when the *thread* that forked exits, so a
    cluster started from a worker thread would die with that thread.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not (
        threading.main_thread()
    ):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)

    return preexec


def _sweep_stale_workdirs() -> None:
    """Remove work directories left by clusters whose process died without stopping them
    (a test runner killed with SIGKILL, say: its children die with it, its files do not).

    Only directories that still name an owner process, and whose owner is gone, are
    removed; kept directories (start-up failures, ``SPOTWRIGHT_TESTCLUSTER_KEEP``) name none.
    """
    for candidate in Path(tempfile.gettempdir()).glob(WORKDIR_PREFIX + "*"):
        try:
            pid = int((candidate / OWNER_FILE).read_text().strip())
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(candidate, ignore_errors=True)
        except PermissionError:
            continue  # alive, someone else's


def _open(request: urllib.request.Request, *, timeout: float, context: ssl.SSLContext) -> Any:
    """urlopen without proxies: the cluster is on loopback, whatever HTTPS_PROXY says."""
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    return opener.open(request, timeout=timeout)


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _write_private(path: Path, data: bytes | str) -> None:
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    path.chmod(0o600)


@dataclass
class _Component:
    name: str
    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    log_file: Any = None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class Credentials:
    """The PKI and tokens of one cluster, all files in ``pki/`` of its work directory."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    front_proxy_ca_cert: Path
    front_proxy_client_cert: Path
    front_proxy_client_key: Path
    sa_key: Path
    sa_pub: Path
    token_file: Path
    tokens: dict[str, str] = field(default_factory=dict)  # user name -> bearer token


def _generate_credentials(pki: Path, users: Mapping[str, tuple[str, ...]]) -> Credentials:
    """The cluster CA and apiserver serving certificate, a front-proxy CA and client
    certificate (the request-header authentication kube-controller-manager and
    kube-scheduler look up, and the aggregator uses), a ServiceAccount key pair, and
    static tokens."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec, rsa
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError as exc:  # pragma: no cover - cryptography is a test dependency
        raise ClusterUnavailable("the `cryptography` package is not installed") from exc
    import ipaddress

    pki.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    not_before, not_after = now - dt.timedelta(hours=1), now + dt.timedelta(days=2)

    def pem_key(key: Any) -> bytes:
        return bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )

    def pem_cert(cert: Any) -> bytes:
        return bytes(cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        common_name: str,
        issuer: tuple[Any, Any] | None = None,
        *,
        usage: Any = None,
        sans: list[x509.GeneralName] | None = None,
    ) -> tuple[Any, Any]:
        """A (certificate, key) pair: a self-signed CA without ``issuer``, else a leaf."""
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        signer_cert, signer_key = issuer if issuer else (None, key)
        builder = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(signer_cert.subject if signer_cert is not None else name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), True)
        )
        if issuer is None:
            builder = builder.add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            ).add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        else:
            builder = builder.add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(signer_key.public_key()),
                False,
            ).add_extension(x509.ExtendedKeyUsage([usage]), False)
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), False)
        return builder.sign(signer_key, hashes.SHA256()), key

    ca = issue("spotwright-testcluster-ca")
    serving = issue(
        "kube-apiserver",
        ca,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        sans=[
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("10.96.0.1")),  # the `kubernetes` Service
            x509.IPAddress(ipaddress.ip_address(ADVERTISE_ADDRESS)),
            *(
                x509.DNSName(name)
                for name in (
                    "localhost",
                    "kubernetes",
                    "kubernetes.default",
                    "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local",
                )
            ),
        ],
    )
    front_proxy_ca = issue("spotwright-testcluster-front-proxy-ca")
    front_proxy_client = issue(
        FRONT_PROXY_CLIENT, front_proxy_ca, usage=ExtendedKeyUsageOID.CLIENT_AUTH
    )
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    creds = Credentials(
        ca_cert=pki / "ca.crt",
        ca_key=pki / "ca.key",
        serving_cert=pki / "apiserver.crt",
        serving_key=pki / "apiserver.key",
        front_proxy_ca_cert=pki / "front-proxy-ca.crt",
        front_proxy_client_cert=pki / "front-proxy-client.crt",
        front_proxy_client_key=pki / "front-proxy-client.key",
        sa_key=pki / "sa.key",
        sa_pub=pki / "sa.pub",
        token_file=pki / "tokens.csv",
    )
    creds.ca_cert.write_bytes(pem_cert(ca[0]))
    _write_private(creds.ca_key, pem_key(ca[1]))
    creds.serving_cert.write_bytes(pem_cert(serving[0]))
    _write_private(creds.serving_key, pem_key(serving[1]))
    creds.front_proxy_ca_cert.write_bytes(pem_cert(front_proxy_ca[0]))
    creds.front_proxy_client_cert.write_bytes(pem_cert(front_proxy_client[0]))
    _write_private(creds.front_proxy_client_key, pem_key(front_proxy_client[1]))
    _write_private(creds.sa_key, pem_key(sa_key))
    creds.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    rows = []
    for index, (user, groups) in enumerate(users.items()):
        token = secrets.token_urlsafe(32)
        creds.tokens[user] = token
        group_field = '"' + ",".join(groups) + '"' if groups else ""
        rows.append(f"{token},{user},uid-{index},{group_field}".rstrip(","))
    _write_private(creds.token_file, "\n".join(rows) + "\n")
    return creds


def write_kubeconfig(
    path: Path, *, server: str, ca_file: Path, token: str, user: str, namespace: str = "default"
) -> Path:
    """Write a token kubeconfig (JSON is valid YAML, so no YAML writer is needed)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "spotwright-test",
                "cluster": {
                    "server": server,
                    "certificate-authority": str(ca_file),
                },
            },
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [
            {
                "name": "spotwright-test",
                "context": {
                    "cluster": "spotwright-test",
                    "user": user,
                    "namespace": namespace,
                },
            },
        ],
        "current-context": "spotwright-test",
    }
    _write_private(path, json.dumps(config, indent=2) + "\n")
    return path


# --- the cluster -------------------------------------------------------------------------------


class TestCluster:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok, on loopback.

    Start with :meth:`start` (or a ``with`` block), stop with :meth:`stop`; a stopped cluster
    cannot be restarted. :attr:`timings` holds seconds per start-up phase and ``total``.
    """

    __test__ = False  # not a test class, whatever pytest thinks of the name

    #: Users in the static token file: name -> groups.
    USERS: Mapping[str, tuple[str, ...]] = {
        "admin": ("system:masters",),
        "system:kube-controller-manager": (),
        "system:kube-scheduler": (),
        "kwok": ("system:masters",),
    }

    def __init__(
        self,
        bin_dir: Path | None = None,
        *,
        workdir: Path | None = None,
        graceful_pod_delete: bool = False,
        start_timeout: float = 120.0,
        keep_workdir: bool | None = None,
        extra_args: Mapping[str, list[str]] | None = None,
    ) -> None:
        """``bin_dir``: the build's ``bin`` (default: the cache for the current pins; use
        :func:`ensure_binaries` to build or get a skip reason). ``graceful_pod_delete``:
        kwok deletes terminating pods only after their grace period (kwok's "general"
        pod-delete stage) instead of at once. ``extra_args``: per component name (``etcd``,
        ``kube-apiserver``, ...), arguments appended to its command line.
        """
        self.bin_dir = Path(bin_dir) if bin_dir is not None else binary_dir()
        self.stages_dir = self.bin_dir.parent / "stages"
        self._own_workdir = workdir is None
        # A temporary directory is made by start(), so an unstarted cluster leaves nothing.
        self.workdir = Path(workdir) if workdir is not None else Path()
        self.graceful_pod_delete = graceful_pod_delete
        self.start_timeout = start_timeout
        self.keep_workdir = (
            _truthy(os.environ.get(KEEP_ENV)) if keep_workdir is None else keep_workdir
        )
        self.extra_args = dict(extra_args or {})
        self.timings: dict[str, float] = {}
        self.ports: dict[str, int] = {}
        self.credentials: Credentials | None = None
        self._components: list[_Component] = []
        self._ssl: ssl.SSLContext | None = None
        self._started = False
        self._stopped = False
        self._failed = False

    # -- public surface --------------------------------------------------------------------

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def kubeconfig(self) -> Path:
        """The admin (``system:masters``) kubeconfig."""
        return self.workdir / "kubeconfig"

    @property
    def ca_file(self) -> Path:
        assert self.credentials is not None, "cluster not started"
        return self.credentials.ca_cert

    @property
    def admin_token(self) -> str:
        assert self.credentials is not None, "cluster not started"
        return self.credentials.tokens["admin"]

    @property
    def log_dir(self) -> Path:
        return self.workdir / "logs"

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        if exc_info[0] is not None:
            self._failed = True
        self.stop()

    def start(self) -> Self:
        """Start every component and wait until each is healthy; raise on failure (after
        stopping whatever did start)."""
        if self._started:
            raise RuntimeError("a TestCluster can only be started once")
        self._started = True
        missing = [name for name in BINARIES if not os.access(self.bin_dir / name, os.X_OK)]
        if missing:
            raise ClusterUnavailable(f"{self.bin_dir} lacks {', '.join(missing)}")
        began = time.monotonic()
        try:
            self._start()
        except BaseException:
            self._failed = True
            self.stop()
            raise
        self.timings["total"] = round(time.monotonic() - began, 2)
        return self

    def stop(self) -> None:
        """Stop every component (reverse start order: SIGTERM, then SIGKILL the process
        group after 10 s) and remove the work directory unless it is to be kept."""
        if self._stopped:
            return
        self._stopped = True
        for component in reversed(self._components):
            self._terminate(component)
        if not (self._own_workdir and self.workdir != Path()):
            return
        if self.keep_workdir or self._failed:
            # Kept on purpose (for its logs): the sweep of later clusters leaves it alone.
            (self.workdir / OWNER_FILE).unlink(missing_ok=True)
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        token: str | None = None,
        timeout: float = 10.0,
    ) -> tuple[int, dict[str, Any]]:
        """A JSON request to the apiserver as admin (or ``token``); returns (status, body).

        A deliberately tiny client for the fixture's own needs (readiness, namespaces,
        ServiceAccount tokens); tests use a real client library.
        """
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {token or self.admin_token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with _open(req, timeout=timeout, context=self._ssl_context()) as r:
                raw = r.read()
                status = r.status
        except urllib.error.HTTPError as exc:
            raw, status = exc.read(), exc.code
        try:
            parsed = json.loads(raw) if raw else {}
        except ValueError:
            parsed = {"raw": raw.decode(errors="replace")}
        return status, parsed if isinstance(parsed, dict) else {"items": parsed}

    def create_namespace(self, name: str, *, wait_for_service_account: bool = True) -> str:
        """Create a namespace (tolerating one that exists) and, by default, wait until its
        ``default`` ServiceAccount exists, without which pod creation is refused."""
        status, body = self.request(
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        )
        if status not in (201, 409):
            raise RuntimeError(f"creating namespace {name}: HTTP {status}: {body}")
        if wait_for_service_account:
            self._wait(
                f"ServiceAccount {name}/default",
                lambda: (
                    self.request("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default")[0]
                    == 200
                ),
                timeout=60,
            )
        return name

    def delete_namespace(self, name: str) -> None:
        self.request("DELETE", f"/api/v1/namespaces/{name}")

    def service_account_token(
        self, namespace: str, name: str, *, create: bool = True, expiration_seconds: int = 86400
    ) -> str:
        """A token for ServiceAccount ``namespace/name`` from the TokenRequest API."""
        if create:
            self.create_namespace(namespace, wait_for_service_account=False)
            status, body = self.request(
                "POST",
                f"/api/v1/namespaces/{namespace}/serviceaccounts",
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
            )
            if status not in (201, 409):
                raise RuntimeError(f"creating ServiceAccount {namespace}/{name}: {status} {body}")
        status, body = self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": expiration_seconds},
            },
        )
        if status != 201:
            raise RuntimeError(f"TokenRequest for {namespace}/{name}: HTTP {status}: {body}")
        return str(body["status"]["token"])

    def service_account_kubeconfig(
        self,
        namespace: str,
        name: str,
        *,
        path: Path | None = None,
        create: bool = True,
        expiration_seconds: int = 86400,
    ) -> Path:
        """Write a kubeconfig that authenticates as ServiceAccount ``namespace/name``.

        The ServiceAccount (and namespace) are created when missing; what it may do is up
        to the RBAC objects the test applies, which is the point.
        """
        token = self.service_account_token(
            namespace, name, create=create, expiration_seconds=expiration_seconds
        )
        path = path or self.workdir / f"kubeconfig-sa-{namespace}-{name}"
        return write_kubeconfig(
            path,
            server=self.server,
            ca_file=self.ca_file,
            token=token,
            user=f"system:serviceaccount:{namespace}:{name}",
            namespace=namespace,
        )

    # -- start-up ------------------------------------------------------------------------------

    def _start(self) -> None:
        if self._own_workdir:
            _sweep_stale_workdirs()
            self.workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
            (self.workdir / OWNER_FILE).write_text(f"{os.getpid()}\n")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        phase = time.monotonic()
        self.credentials = creds = _generate_credentials(self.workdir / "pki", self.USERS)
        names = ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler")
        self.ports = dict(zip(names, _free_ports(len(names)), strict=True))
        kubeconfigs = {
            user: write_kubeconfig(
                self.workdir / f"kubeconfig-{user.replace(':', '-')}",
                server=self.server,
                ca_file=creds.ca_cert,
                token=creds.tokens[user],
                user=user,
            )
            for user in self.USERS
        }
        os.replace(kubeconfigs.pop("admin"), self.kubeconfig)
        kwok_config = self._write_kwok_config()
        self.timings["credentials"] = round(time.monotonic() - phase, 2)

        phase = time.monotonic()
        self._launch("etcd", self._etcd_args())
        etcd_url = f"http://127.0.0.1:{self.ports['etcd']}/health"
        self._wait("etcd /health", lambda: self._http_ok(etcd_url, verify=False), "etcd")
        self.timings["etcd"] = round(time.monotonic() - phase, 2)

        phase = time.monotonic()
        self._launch("kube-apiserver", self._apiserver_args(creds))
        self._wait(
            "kube-apiserver /readyz",
            lambda: self.request("GET", "/readyz", timeout=5)[0] == 200,
            "kube-apiserver",
        )
        self.timings["kube-apiserver"] = round(time.monotonic() - phase, 2)

        phase = time.monotonic()
        kcm_kc = kubeconfigs["system:kube-controller-manager"]
        self._launch(
            "kube-controller-manager",
            [
                f"--kubeconfig={kcm_kc}",
                f"--authentication-kubeconfig={kcm_kc}",
                f"--authorization-kubeconfig={kcm_kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['controller-manager']}",
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
            ],
        )
        sched_kc = kubeconfigs["system:kube-scheduler"]
        self._launch(
            "kube-scheduler",
            [
                f"--kubeconfig={sched_kc}",
                f"--authentication-kubeconfig={sched_kc}",
                f"--authorization-kubeconfig={sched_kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['scheduler']}",
                "--leader-elect=false",
                "--profiling=false",
            ],
        )
        self._launch(
            "kwok",
            [
                f"--kubeconfig={kubeconfigs['kwok']}",
                f"--config={kwok_config}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=" + "=".join(KWOK_NODE_ANNOTATION),
                "--node-lease-duration-seconds=40",
                f"--cidr={POD_CIDR}",
                "--node-ip=10.0.0.1",
            ],
        )
        kcm = f"https://127.0.0.1:{self.ports['controller-manager']}/healthz"
        sched = f"https://127.0.0.1:{self.ports['scheduler']}/healthz"
        self._wait(
            "kube-controller-manager /healthz",
            lambda: self._http_ok(kcm, verify=False),
            "kube-controller-manager",
        )
        self._wait(
            "kube-scheduler /healthz", lambda: self._http_ok(sched, verify=False), "kube-scheduler"
        )
        self._wait(
            "ServiceAccount default/default (token and SA controllers working)",
            lambda: (
                self.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200
            ),
            "kube-controller-manager",
        )
        self.timings["controllers"] = round(time.monotonic() - phase, 2)

        phase = time.monotonic()
        self._probe_kwok()
        self.timings["kwok"] = round(time.monotonic() - phase, 2)

    def _write_kwok_config(self) -> Path:
        delete = "pod-delete-graceful.yaml" if self.graceful_pod_delete else "pod-delete-fast.yaml"
        parts = []
        for name in (*_BASE_STAGES, delete):
            source = self.stages_dir / name
            if not source.is_file():
                raise ClusterUnavailable(f"kwok stage file {source} is missing; rebuild")
            parts.append(source.read_text().strip() + "\n")
        path = self.workdir / "kwok.yaml"
        path.write_text("---\n".join(parts))
        return path

    def _etcd_args(self) -> list[str]:
        client = f"http://127.0.0.1:{self.ports['etcd']}"
        peer = f"http://127.0.0.1:{self.ports['etcd-peer']}"
        return [
            "--name=spotwright",
            f"--data-dir={self.workdir / 'etcd'}",
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

    def _apiserver_args(self, creds: Credentials) -> list[str]:
        return [
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.ports['apiserver']}",
            f"--advertise-address={ADVERTISE_ADDRESS}",
            "--endpoint-reconciler-type=none",
            f"--cert-dir={self.workdir / 'pki'}",
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

    def _launch(self, name: str, args: list[str]) -> None:
        argv = [str(self.bin_dir / name), *args, *self.extra_args.get(name, [])]
        log_path = self.log_dir / f"{name}.log"
        log_file = log_path.open("ab")
        log_file.write(f"$ {' '.join(argv)}\n".encode())
        log_file.flush()
        component = _Component(name=name, argv=argv, log_path=log_path, log_file=log_file)
        component.process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            env={**os.environ, "HOME": str(self.workdir)},  # kwok looks in ~/.kwok
            start_new_session=True,
            preexec_fn=_pdeathsig(),  # prctl only: safe between fork and exec
        )
        self._components.append(component)

    def _wait(
        self,
        what: str,
        check: Callable[[], bool],
        component: str | None = None,
        *,
        timeout: float | None = None,
    ) -> None:
        deadline = time.monotonic() + (timeout or self.start_timeout)
        delay = 0.05
        while True:
            for proc in self._components:
                if not proc.alive():
                    code = proc.process.returncode if proc.process else None
                    raise ClusterStartError(
                        f"{proc.name} exited with code {code} while waiting for {what}; "
                        f"last lines of {proc.log_path}:\n{_tail(proc.log_path)}"
                    )
            with contextlib.suppress(OSError, ValueError, ssl.SSLError):
                if check():
                    return
            if time.monotonic() > deadline:
                hint = ""
                if component:
                    path = self.log_dir / f"{component}.log"
                    hint = f"; last lines of {path}:\n{_tail(path)}"
                raise ClusterStartError(f"timed out waiting for {what}{hint}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def _probe_kwok(self) -> None:
        """Create a throw-away kwok Node, wait for kwok to make it Ready, delete it."""
        name = "spotwright-kwok-probe"
        key, value = KWOK_NODE_ANNOTATION
        status, body = self.request(
            "POST",
            "/api/v1/nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "annotations": {key: value}, "labels": {key: value}},
                "spec": {"taints": [{"key": "spotwright.io/probe", "effect": "NoSchedule"}]},
            },
        )
        if status != 201:
            raise ClusterStartError(f"creating the kwok probe node: HTTP {status}: {body}")

        def ready() -> bool:
            _, node = self.request("GET", f"/api/v1/nodes/{name}")
            conditions = node.get("status", {}).get("conditions") or []
            return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

        self._wait("kwok to make a fake Node Ready", ready, "kwok")
        self.request("DELETE", f"/api/v1/nodes/{name}")

    # -- plumbing ----------------------------------------------------------------------------

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context(cafile=str(self.ca_file))
        return self._ssl

    @staticmethod
    def _http_ok(url: str, *, verify: bool) -> bool:
        context = ssl.create_default_context()
        if not verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        with _open(urllib.request.Request(url), timeout=5, context=context) as response:
            return bool(response.status == 200)

    def _terminate(self, component: _Component, grace: float = 10.0) -> None:
        proc = component.process
        if proc is not None:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=grace)
            # Whatever is left in the group (the leader may have exited already) goes now.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        if component.log_file is not None:
            component.log_file.close()


@contextlib.contextmanager
def running_cluster(**kwargs: Any) -> Iterator[TestCluster]:
    """``with running_cluster() as c:`` builds on request (see :func:`ensure_binaries`)."""
    with TestCluster(ensure_binaries(), **kwargs) as cluster:
        yield cluster


def availability(pins: Pins = PINS) -> str | None:
    """``None`` when a cluster can be started now (binaries cached, or building requested and
    Go and the proxy present); otherwise the one-line reason it cannot. Never builds."""
    if not missing_artifacts(pins):
        return None
    if not _truthy(os.environ.get(BUILD_ENV)):
        return (
            f"test-cluster binaries not built; run `python -m spotwright.testing.build` or set "
            f"{BUILD_ENV}=1"
        )
    from spotwright.testing import build as builder

    try:
        builder.preflight(pins)
    except builder.Unavailable as exc:
        return f"cannot build the test cluster: {exc}"
    return None
