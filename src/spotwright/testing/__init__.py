"""Test support for spotwright: a real, local Kubernetes control plane for the cluster tier.

``spotwright.testing.build`` compiles pinned kube-apiserver, kube-controller-manager,
kube-scheduler, etcd and kwok binaries from the Go module proxy into a per-user cache;
``spotwright.testing.cluster`` starts them on 127.0.0.1 and tears them down. Nothing here
imports Go tooling or a Kubernetes client at import time, so the package is importable on
any host; whether the tier can run is answered by :func:`spotwright.testing.cluster.availability`.
"""

from spotwright.testing.versions import PINS, Pins, binary_dir, cache_root, version_key

__all__ = ["PINS", "Pins", "binary_dir", "cache_root", "version_key"]
