"""Build the pinned test-cluster binaries from the Go module proxy.

Usage::

    python -m spotwright.testing.build [--if-possible] [--force] [-p N] [--nice N] [--verbose]
    python scripts/testcluster/build.py ...        # the same, without installing spotwright

Produces, in ``<cache>/<version-key>/`` (see :mod:`spotwright.testing.versions`):

* ``bin/``: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok;
* ``stages/``: kwok Stage manifests copied from the kwok module (kwok v0.8 has no built-in
  stages and refuses to start without some);
* ``manifest.json``: pins, Go version and per-step timings. Written last: its presence
  means the build is complete, and a second run returns at once.

How each piece is built, and why, is told in :mod:`spotwright.testing.steps`.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

from spotwright.testing.steps import (
    KUBE_COMMANDS,
    BuildError,
    Log,
    Step,
    _godebug_lines,
    build_etcd,
    build_kube,
    build_kwok,
    copy_stages,
    format_seconds,
    go_env,
    staging_replaces,
)
from spotwright.testing.versions import (
    BINARIES,
    PINS,
    RECIPE_REVISION,
    Pins,
    build_dir,
    go_platform,
    missing_artifacts,
    version_key,
)

# ``_godebug_lines`` and ``staging_replaces`` are the recipe's pure parts, tested from here.
__all__ = [
    "BuildError",
    "Unavailable",
    "_godebug_lines",
    "build",
    "main",
    "preflight",
    "staging_replaces",
]


class Unavailable(RuntimeError):
    """Go or the module proxy is missing; the message is a one-line reason."""


# --- preflight ------------------------------------------------------------------------------


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.lstrip("go").split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def preflight(pins: Pins = PINS, *, timeout: float = 90.0) -> str:
    """Check that Go is new enough and the proxy serves the pins; return ``go env GOVERSION``.

    Raises :class:`Unavailable` with a one-line reason otherwise.
    """
    go = shutil.which("go")
    if go is None:
        raise Unavailable("no Go toolchain on PATH (need go >= " + pins.go_directive + ")")
    env = go_env()
    try:
        goversion = subprocess.run(
            [go, "env", "GOVERSION"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
    except (subprocess.SubprocessError, OSError) as exc:
        raise Unavailable(f"`go env GOVERSION` failed: {exc}") from exc
    if _version_tuple(goversion) < _version_tuple(pins.go_directive):
        raise Unavailable(f"{goversion} is older than the go {pins.go_directive} k8s needs")
    with tempfile.TemporaryDirectory(prefix="spotwright-go-probe-") as probe:
        try:
            proc = subprocess.run(
                [go, "list", "-m", f"k8s.io/kubernetes@{pins.kubernetes}"],
                cwd=probe,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise Unavailable(f"Go module proxy did not answer within {timeout:.0f}s") from exc
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise Unavailable(f"Go module proxy unusable: {last}")
    return goversion


# --- orchestration ----------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(path: Path, log: Log) -> Iterator[None]:
    """An exclusive lock so a fixture and a CI step never build into one directory at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"another build holds {path}; waiting for it")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build(
    pins: Pins = PINS,
    *,
    force: bool = False,
    jobs: int | None = None,
    verbose: bool = False,
    log: Log | None = None,
) -> Path:
    """Build everything missing from the cache; return the ``bin`` directory.

    Idempotent: with a complete cache it returns without running Go at all. After a
    failure, pieces already in ``bin/`` are kept and the next run builds only the rest.
    Raises :class:`Unavailable` when Go or the proxy is missing, :class:`BuildError` when
    a build step fails.
    """
    log = log or Log()
    root = build_dir(pins)
    bin_dir = root / "bin"
    if not force and not missing_artifacts(pins):
        log(f"up to date: {bin_dir}")
        return bin_dir
    goversion = preflight(pins)
    with _locked(root / ".build.lock", log):
        if not force and not missing_artifacts(pins):  # built by whoever held the lock
            log(f"up to date: {bin_dir}")
            return bin_dir
        started = time.monotonic()
        log(
            f"building k8s {pins.kubernetes} (staging {pins.staging}), etcd {pins.etcd}, "
            f"kwok {pins.kwok} with {goversion} into {root}"
        )
        partial = root / "bin.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        bin_dir.mkdir(parents=True, exist_ok=True)
        step = Step(pins, root / "work", partial, go_env(), log, jobs=jobs, verbose=verbose)
        timings: dict[str, float] = {}
        pieces = (
            ("etcd", ("etcd",), build_etcd),
            ("kwok", ("kwok",), build_kwok),
            ("kube", KUBE_COMMANDS, build_kube),
        )
        for piece, produced, function in pieces:
            if not force and all(os.access(bin_dir / name, os.X_OK) for name in produced):
                log(f"{piece}: already built, skipping")
                continue
            step_started = time.monotonic()
            function(step)
            for name in produced:
                built = partial / name
                if not os.access(built, os.X_OK):
                    raise BuildError(f"{piece}: {built} was not produced")
                os.replace(built, bin_dir / name)
            timings[piece] = round(time.monotonic() - step_started, 1)
            log(f"{piece}: built in {format_seconds(timings[piece])}")
        step_started = time.monotonic()
        copy_stages(step, root / "stages")
        timings["stages"] = round(time.monotonic() - step_started, 1)
        shutil.rmtree(partial, ignore_errors=True)
        for name in BINARIES:
            if not os.access(bin_dir / name, os.X_OK):
                raise BuildError(f"{bin_dir / name} is missing after the build")
        goos, goarch = go_platform()
        total = round(time.monotonic() - started, 1)
        manifest = {
            "key": version_key(pins),
            "kubernetes": pins.kubernetes,
            "staging": pins.staging,
            "etcd": pins.etcd,
            "kwok": pins.kwok,
            "go": goversion,
            "goos": goos,
            "goarch": goarch,
            "recipe": RECIPE_REVISION,
            "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "seconds": timings,
            "total_seconds": total,
        }
        tmp = root / "manifest.json.tmp"
        tmp.write_text(json.dumps(manifest, indent=2) + "\n")
        os.replace(tmp, root / "manifest.json")
        log(f"done in {format_seconds(total)} (steps: {timings}); binaries in {bin_dir}")
        return bin_dir


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spotwright.testing.build",
        description="Build the pinned test-cluster binaries (etcd, kube-apiserver, "
        "kube-controller-manager, kube-scheduler, kwok) from the Go module proxy into "
        "the version-keyed cache.",
    )
    parser.add_argument(
        "--if-possible",
        action="store_true",
        help="exit 0 with a one-line reason when Go or the module proxy is unavailable",
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    parser.add_argument(
        "-p",
        "--jobs",
        type=int,
        default=None,
        help="go build -p (default: Go's own, the number of CPUs)",
    )
    parser.add_argument(
        "--nice", type=int, default=10, help="niceness increment for the build (default 10)"
    )
    parser.add_argument("--verbose", action="store_true", help="go build -v (package names)")
    parser.add_argument(
        "--print-dir",
        action="store_true",
        help="print the bin directory for the pins and exit (no build)",
    )
    args = parser.parse_args(argv)
    if args.print_dir:
        print(build_dir(PINS) / "bin")
        return 0
    if args.nice:
        os.nice(args.nice)
    log = Log()
    try:
        bin_dir = build(PINS, force=args.force, jobs=args.jobs, verbose=args.verbose, log=log)
    except Unavailable as exc:
        log(f"cannot build: {exc}")
        return 0 if args.if_possible else 2
    except BuildError as exc:
        log(f"FAILED: {exc}")
        return 1
    print(bin_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
