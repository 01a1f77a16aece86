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
* One self-made CA signs the apiserver's serving certificate, so clients verify TLS against
  ``ca.crt`` instead of skipping it (:mod:`spotwright.testing._credentials`).
* Each component authenticates as itself with a static token (kube-controller-manager as
  ``system:kube-controller-manager`` with per-controller ServiceAccount credentials,
  kube-scheduler as ``system:kube-scheduler``), under ``--authorization-mode=Node,RBAC``,
  as kubeadm sets them up; tests use the ``admin`` token (group ``system:masters``) or a
  ServiceAccount token minted through the TokenRequest API, which exercises real RBAC.
* The apiserver is told a non-loopback advertise address and runs without an endpoint
  reconciler: a loopback advertise address is rejected, and with no default route the
  auto-detection fails (the flags are in :mod:`spotwright.testing._control_plane`).
* Each component runs in its own session (process group); :meth:`TestCluster.stop`
  signals the groups in reverse start order, SIGTERM then SIGKILL. When started from the
  main thread on Linux the children also get ``PR_SET_PDEATHSIG``, so a test runner killed
  with SIGKILL does not leave a control plane behind (:mod:`spotwright.testing._supervisor`).

This module and its parts import only the standard library at import time; they never run
Go (building is :mod:`spotwright.testing.build`'s job, which :func:`ensure_binaries` calls
on request).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Self

from spotwright.testing._availability import BUILD_ENV, availability, ensure_binaries, truthy
from spotwright.testing._control_plane import (
    ADVERTISE_ADDRESS,
    FRONT_PROXY_CLIENT,
    KWOK_NODE_ANNOTATION,
    POD_CIDR,
    PORT_NAMES,
    SERVICE_ACCOUNT_ISSUER,
    SERVICE_CLUSTER_IP_RANGE,
    apiserver_args,
    controller_manager_args,
    etcd_args,
    kwok_args,
    scheduler_args,
    write_kwok_config,
)
from spotwright.testing._credentials import Credentials, generate_credentials, write_kubeconfig
from spotwright.testing._errors import ClusterStartError, ClusterUnavailable
from spotwright.testing._supervisor import (
    OWNER_FILE,
    WORKDIR_PREFIX,
    Component,
    free_ports,
    http_ok,
    launch,
    open_url,
    sweep_stale_workdirs,
    terminate,
    wait_until,
)
from spotwright.testing.versions import BINARIES, binary_dir

__all__ = [
    "ADVERTISE_ADDRESS",
    "BUILD_ENV",
    "FRONT_PROXY_CLIENT",
    "KEEP_ENV",
    "KWOK_NODE_ANNOTATION",
    "OWNER_FILE",
    "POD_CIDR",
    "SERVICE_ACCOUNT_ISSUER",
    "SERVICE_CLUSTER_IP_RANGE",
    "WORKDIR_PREFIX",
    "ClusterStartError",
    "ClusterUnavailable",
    "Credentials",
    "TestCluster",
    "availability",
    "ensure_binaries",
    "running_cluster",
    "write_kubeconfig",
]

#: Environment variable that keeps the work directory (logs, certs, kubeconfigs) after stop.
KEEP_ENV = "SPOTWRIGHT_TESTCLUSTER_KEEP"

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
            truthy(os.environ.get(KEEP_ENV)) if keep_workdir is None else keep_workdir
        )
        self.extra_args = dict(extra_args or {})
        self.timings: dict[str, float] = {}
        self.ports: dict[str, int] = {}
        self.credentials: Credentials | None = None
        self._components: list[Component] = []
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
            terminate(component)
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
            with open_url(req, timeout=timeout, context=self._ssl_context()) as r:
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
            sweep_stale_workdirs()
            self.workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
            (self.workdir / OWNER_FILE).write_text(f"{os.getpid()}\n")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        phase = time.monotonic()
        self.credentials = creds = generate_credentials(self.workdir / "pki", self.USERS)
        self.ports = dict(zip(PORT_NAMES, free_ports(len(PORT_NAMES)), strict=True))
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
        kwok_config = write_kwok_config(
            self.stages_dir,
            self.workdir / "kwok.yaml",
            graceful_pod_delete=self.graceful_pod_delete,
        )
        self.timings["credentials"] = round(time.monotonic() - phase, 2)

        phase = time.monotonic()
        self._launch("etcd", etcd_args(self.ports, self.workdir / "etcd"))
        etcd_url = f"http://127.0.0.1:{self.ports['etcd']}/health"
        self._wait("etcd /health", lambda: http_ok(etcd_url, verify=False), "etcd")
        self.timings["etcd"] = round(time.monotonic() - phase, 2)

        phase = time.monotonic()
        self._launch("kube-apiserver", apiserver_args(self.ports, creds, self.workdir / "pki"))
        self._wait(
            "kube-apiserver /readyz",
            lambda: self.request("GET", "/readyz", timeout=5)[0] == 200,
            "kube-apiserver",
        )
        self.timings["kube-apiserver"] = round(time.monotonic() - phase, 2)

        phase = time.monotonic()
        self._launch(
            "kube-controller-manager",
            controller_manager_args(
                self.ports, creds, kubeconfigs["system:kube-controller-manager"]
            ),
        )
        self._launch(
            "kube-scheduler", scheduler_args(self.ports, kubeconfigs["system:kube-scheduler"])
        )
        self._launch("kwok", kwok_args(kubeconfigs["kwok"], kwok_config))
        kcm = f"https://127.0.0.1:{self.ports['controller-manager']}/healthz"
        sched = f"https://127.0.0.1:{self.ports['scheduler']}/healthz"
        self._wait(
            "kube-controller-manager /healthz",
            lambda: http_ok(kcm, verify=False),
            "kube-controller-manager",
        )
        self._wait(
            "kube-scheduler /healthz", lambda: http_ok(sched, verify=False), "kube-scheduler"
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

    def _launch(self, name: str, args: list[str]) -> None:
        argv = [str(self.bin_dir / name), *args, *self.extra_args.get(name, [])]
        self._components.append(launch(name, argv, log_dir=self.log_dir, cwd=self.workdir))

    def _wait(
        self,
        what: str,
        check: Callable[[], bool],
        component: str | None = None,
        *,
        timeout: float | None = None,
    ) -> None:
        wait_until(
            what,
            check,
            self._components,
            timeout=timeout or self.start_timeout,
            log_path=self.log_dir / f"{component}.log" if component else None,
        )

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


@contextlib.contextmanager
def running_cluster(**kwargs: Any) -> Iterator[TestCluster]:
    """``with running_cluster() as c:`` builds on request (see :func:`ensure_binaries`)."""
    with TestCluster(ensure_binaries(), **kwargs) as cluster:
        yield cluster
