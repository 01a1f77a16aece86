"""Whether the real-cluster tier can run on this host, and getting it the binaries.

The tier needs the pinned binaries in the per-user cache. When they are missing it is
skipped with a one-line reason, unless ``$SPOTWRIGHT_TESTCLUSTER_BUILD`` asks for a build,
which needs Go and the module proxy. :mod:`spotwright.testing.build` is imported only then,
so asking costs nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

from spotwright.testing._errors import ClusterUnavailable
from spotwright.testing.versions import PINS, Pins, binary_dir, build_dir, missing_artifacts

#: Environment variable that makes :func:`ensure_binaries` (and the pytest fixture) build.
BUILD_ENV = "SPOTWRIGHT_TESTCLUSTER_BUILD"


def truthy(value: str | None) -> bool:
    """An environment switch is on for the usual spellings of yes, not merely for "1"."""
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
        build = truthy(os.environ.get(BUILD_ENV))
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


def availability(pins: Pins = PINS) -> str | None:
    """``None`` when a cluster can be started now (binaries cached, or building requested and
    Go and the proxy present); otherwise the one-line reason it cannot. Never builds."""
    if not missing_artifacts(pins):
        return None
    if not truthy(os.environ.get(BUILD_ENV)):
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
