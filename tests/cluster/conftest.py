"""Fixtures of the real-cluster tier: one local control plane for the whole pytest session.

Tests here are marked ``@pytest.mark.cluster`` (deselect the tier with ``-m "not cluster"``).
They skip with a one-line reason when the pinned binaries are not built and building was
not requested (``SPOTWRIGHT_TESTCLUSTER_BUILD=1`` builds them first; see docs/testing.md).
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotwright.testing.cluster import TestCluster, availability, ensure_binaries

_STARTUP_KEY = pytest.StashKey[dict[str, float]]()


@pytest.fixture(scope="session")
def test_cluster(request: pytest.FixtureRequest) -> Iterator[TestCluster]:
    """A running etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok."""
    reason = availability()
    if reason is not None:
        pytest.skip(reason)
    with pytest.MonkeyPatch.context() as patch:
        # Clients that honour HTTPS_PROXY (httpx, hence lightkube) must not send loopback
        # traffic to a proxy; Go clients already exempt loopback.
        for name in ("NO_PROXY", "no_proxy"):
            existing = os.environ.get(name, "")
            patch.setenv(name, ",".join(filter(None, [existing, "127.0.0.1", "localhost"])))
        cluster = TestCluster(ensure_binaries())
        cluster.start()
        request.config.stash[_STARTUP_KEY] = dict(cluster.timings)
        try:
            yield cluster
        finally:
            cluster.stop()


@pytest.fixture(scope="session")
def controller_kubeconfig(test_cluster: TestCluster) -> Path:
    """spotwright installed once per session: the CRDs of deploy/crds and the RBAC of
    deploy/rbac.yaml and rbac-sim.yaml applied; a kubeconfig of the controller's
    ServiceAccount, which holds those ClusterRoles and nothing else."""
    from _e2e import install

    return install(test_cluster)


@pytest.fixture
def namespace(test_cluster: TestCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test (its ``default`` ServiceAccount already exists)."""
    stem = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{stem}-{secrets.token_hex(3)}"
    test_cluster.create_namespace(name)
    try:
        yield name
    finally:
        test_cluster.delete_namespace(name)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Whatever uses the cluster is in the tier, marked or not, so ``-m "not cluster"``
    never starts (or waits for) a control plane."""
    for item in items:
        if "test_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    timings = terminalreporter.config.stash.get(_STARTUP_KEY, None)
    if timings:
        phases = ", ".join(f"{k} {v:.1f}s" for k, v in timings.items() if k != "total")
        terminalreporter.write_line(f"test cluster started in {timings['total']:.1f}s ({phases})")
