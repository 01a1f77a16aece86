"""The build recipe's pure parts; these run in the default tier (no Go, no cluster)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from spotwright.testing import build as builder
from spotwright.testing import cluster as cluster_module
from spotwright.testing.versions import (
    BINARIES,
    PINS,
    Pins,
    build_dir,
    cache_root,
    missing_artifacts,
    version_key,
)


def test_staging_version_follows_the_kubernetes_release() -> None:
    assert Pins(kubernetes="v1.36.3").staging == "v0.36.3"
    assert Pins(kubernetes="v1.35.4").kube_minor == "35"


def test_every_k8s_placeholder_requirement_and_staging_replace_is_replaced() -> None:
    upstream = {
        "Require": [
            {"Path": "k8s.io/api", "Version": "v0.0.0"},
            {"Path": "k8s.io/klog/v2", "Version": "v2.130.1"},  # a real version: left alone
            {"Path": "github.com/x/y", "Version": "v0.0.0"},  # not k8s.io: left alone
        ],
        "Replace": [
            {"Old": {"Path": "k8s.io/api"}, "New": {"Path": "./staging/src/k8s.io/api"}},
            {
                "Old": {"Path": "k8s.io/sample-cli-plugin"},
                "New": {"Path": "./staging/src/k8s.io/sample-cli-plugin"},
            },
        ],
    }
    assert builder.staging_replaces(upstream) == ["k8s.io/api", "k8s.io/sample-cli-plugin"]


def test_godebug_lines_are_repeated_in_the_wrapper_module() -> None:
    upstream = {"GoDebug": [{"Key": "default", "Value": "go1.26"}]}
    assert builder._godebug_lines(upstream).strip() == "godebug default=go1.26"
    assert builder._godebug_lines({}) == ""


def test_the_cache_is_keyed_by_versions_and_lives_outside_the_tree(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert version_key(PINS) == version_key(Pins())
    assert version_key(PINS) != version_key(dataclasses.replace(PINS, etcd="v3.6.15"))
    monkeypatch.setenv("SPOTWRIGHT_TESTCLUSTER_CACHE", str(tmp_path))
    assert cache_root() == tmp_path
    assert build_dir() == tmp_path / version_key()
    missing = missing_artifacts()
    assert {f"bin/{name}" for name in BINARIES} <= set(missing)
    assert "manifest.json" in missing


def test_without_binaries_or_build_request_the_tier_gives_a_one_line_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SPOTWRIGHT_TESTCLUSTER_CACHE", str(tmp_path))
    monkeypatch.delenv("SPOTWRIGHT_TESTCLUSTER_BUILD", raising=False)
    reason = cluster_module.availability()
    assert reason is not None and "\n" not in reason and "not built" in reason
    with pytest.raises(cluster_module.ClusterUnavailable, match="not built"):
        cluster_module.ensure_binaries()


def test_without_go_a_requested_build_is_unavailable_not_an_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SPOTWRIGHT_TESTCLUSTER_CACHE", str(tmp_path))
    monkeypatch.setenv("SPOTWRIGHT_TESTCLUSTER_BUILD", "1")
    monkeypatch.setenv("PATH", str(tmp_path))  # no `go` here
    reason = cluster_module.availability()
    assert reason is not None and "no Go toolchain" in reason
    assert builder.main(["--if-possible", "--nice", "0"]) == 0
    assert builder.main(["--nice", "0"]) == 2
