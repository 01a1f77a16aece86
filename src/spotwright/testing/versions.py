"""Pinned versions of the test-cluster binaries and where their build is cached.

The cache directory is keyed by a hash of everything that determines the binaries (the
pins, the target platform and a recipe revision that is bumped whenever the build recipe
changes in a way that alters its output), so a pin change builds into a fresh directory and
never mixes binaries of two versions. The Go toolchain version is recorded in the manifest
but is not part of the key: a host whose Go was upgraded keeps using binaries it already has,
and a host without Go at all can still find them.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

#: Bump when the recipe changes what ends up in ``bin/`` (flags, tags, stage files).
RECIPE_REVISION = 1

#: The binaries a complete build provides, all in ``<cache>/<key>/bin``.
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")

#: kwok Stage files copied from the kwok module into ``<cache>/<key>/stages``.
STAGE_FILES = {
    "node-initialize.yaml": "kustomize/stage/node/fast/node-initialize.yaml",
    "node-heartbeat-with-lease.yaml": (
        "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml"
    ),
    "pod-ready.yaml": "kustomize/stage/pod/fast/pod-ready.yaml",
    "pod-complete.yaml": "kustomize/stage/pod/fast/pod-complete.yaml",
    "pod-delete-fast.yaml": "kustomize/stage/pod/fast/pod-delete.yaml",
    "pod-delete-graceful.yaml": "kustomize/stage/pod/general/pod-delete.yaml",
}


@dataclass(frozen=True)
class Pins:
    """One consistent set of upstream versions.

    ``kubernetes`` is the k8s.io/kubernetes module version; its staging modules are
    published as ``v0.<minor>.<patch>`` of the same release. kwok v0.8.0 is itself built
    against the 0.36 client libraries, so the pair stays within one minor version.
    """

    kubernetes: str = "v1.36.3"
    etcd: str = "v3.6.16"
    kwok: str = "v0.8.0"
    #: The ``go`` directive written into the wrapper modules (k8s 1.36 requires 1.26.0).
    go_directive: str = "1.26.0"

    @property
    def staging(self) -> str:
        """The staging-module version matching :attr:`kubernetes` (v1.36.3 -> v0.36.3)."""
        major, minor, patch = self.kubernetes.lstrip("v").split(".")
        if major != "1":
            raise ValueError(f"unexpected Kubernetes version {self.kubernetes}")
        return f"v0.{minor}.{patch}"

    @property
    def kube_minor(self) -> str:
        return self.kubernetes.lstrip("v").split(".")[1]


PINS = Pins()


def go_platform() -> tuple[str, str]:
    """GOOS and GOARCH of this host, derived without running ``go``."""
    goos = platform.system().lower()
    machine = platform.machine().lower()
    goarch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(
        machine, machine
    )
    return goos, goarch


def version_key(pins: Pins = PINS) -> str:
    """A short, stable hash of everything that determines the built binaries."""
    goos, goarch = go_platform()
    material = {**asdict(pins), "goos": goos, "goarch": goarch, "recipe": RECIPE_REVISION}
    digest = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()
    return f"k8s{pins.kubernetes}-etcd{pins.etcd}-kwok{pins.kwok}-{digest[:10]}"


def cache_root() -> Path:
    """``$SPOTWRIGHT_TESTCLUSTER_CACHE``, else ``$XDG_CACHE_HOME/spotwright/testcluster``."""
    override = os.environ.get("SPOTWRIGHT_TESTCLUSTER_CACHE")
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "spotwright" / "testcluster"


def build_dir(pins: Pins = PINS) -> Path:
    """The directory holding one versioned build: ``bin/``, ``stages/``, ``manifest.json``."""
    return cache_root() / version_key(pins)


def binary_dir(pins: Pins = PINS) -> Path:
    return build_dir(pins) / "bin"


def missing_artifacts(pins: Pins = PINS) -> list[str]:
    """What a complete build would have that the cache lacks; empty when it is complete."""
    root = build_dir(pins)
    missing = [f"bin/{name}" for name in BINARIES if not os.access(root / "bin" / name, os.X_OK)]
    missing += [f"stages/{name}" for name in STAGE_FILES if not (root / "stages" / name).is_file()]
    if not (root / "manifest.json").is_file():
        missing.append("manifest.json")
    return missing
