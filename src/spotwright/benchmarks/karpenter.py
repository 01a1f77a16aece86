"""Karpenter's own scheduling benchmark, built from the Go module proxy and run beside ours.

Published figures come from other machines, so the only fair comparison is one run on
the same machine: ``sigs.k8s.io/karpenter``'s ``pkg/controllers/provisioning/scheduling``
package has ``BenchmarkScheduling{1,50,100,500,1000,2000,5000,10000,20000}`` behind the
``test_performance`` build tag. ``KarpenterBench`` compiles that package's test binary
once (a throwaway Go module in a cache directory outside the work tree, so the
``go.mod``/``go.sum`` and the ~90 MB binary never touch the repository) and runs one
benchmark per pod count with ``GOMAXPROCS=1`` on one CPU, the same CPU our side is
pinned to.

Karpenter reports wall-clock pods/s. On a shared machine that mostly measures the other
tenants, so the CPU time the benchmark process used is measured too (it includes the
process start and building the pods, a few percent at most, which favours neither side
by much: ours is measured around ``schedule`` alone).
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BENCH_COUNTS",
    "DEFAULT_VERSION",
    "KarpenterBench",
    "KarpenterResult",
    "NotAvailable",
    "pin_to_one_cpu",
]

#: The pod counts Karpenter's file has a ``BenchmarkScheduling<N>`` for.
BENCH_COUNTS = (1, 50, 100, 500, 1000, 2000, 5000, 10000, 20000)
#: v1.14.1 builds with Go 1.26.8; later releases may need a newer Go.
DEFAULT_VERSION = "v1.14.1"
_MODULE = "sigs.k8s.io/karpenter"
_PACKAGE = f"{_MODULE}/pkg/controllers/provisioning/scheduling"
_LINE = re.compile(
    r"^BenchmarkScheduling(?P<n>\d+)(?:-\d+)?\s+\d+\s+(?P<ns>[\d.]+) ns/op"
    r"(?P<rest>.*)$",
    re.MULTILINE,
)
_METRIC = re.compile(r"([\d.]+) ([\w/]+)")


class NotAvailable(Exception):
    """Karpenter's benchmark cannot run here; the message says why, in one line."""


@dataclass(frozen=True)
class KarpenterResult:
    pods: int
    seconds: float
    pods_per_second: float
    cpu_seconds: float
    pods_per_cpu_second: float
    nodes: int
    version: str


def default_cache() -> Path:
    """``$SPOTWRIGHT_CACHE/karpenter-bench``, else under ``$XDG_CACHE_HOME`` or ``~/.cache``."""
    own = os.environ.get("SPOTWRIGHT_CACHE")
    if own:
        return Path(own) / "karpenter-bench"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "spotwright" / "karpenter-bench"


def pin_to_one_cpu() -> int | None:
    """Restrict this process to one CPU (the first it may use); that CPU, or None."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if not allowed:
        return None
    os.sched_setaffinity(0, {allowed[0]})
    return allowed[0]


class KarpenterBench:
    """Builds (once) and runs Karpenter's scheduling benchmark."""

    def __init__(
        self, version: str = DEFAULT_VERSION, cache: Path | None = None, timeout: float = 3600
    ) -> None:
        self.version = version
        self.cache = cache or default_cache()
        self.timeout = timeout

    @property
    def binary(self) -> Path:
        return self.cache / f"scheduling-{self.version}.test"

    def build(self) -> Path:
        """The test binary, compiled on first use (minutes: downloads and compiles)."""
        if self.binary.exists():
            return self.binary
        go = shutil.which("go")
        if go is None:
            raise NotAvailable("Go is not installed (no go on PATH); install Go to compare")
        module = self.cache / f"module-{self.version}"
        module.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "GOFLAGS": "-mod=mod", "GOWORK": "off"}
        steps = []
        if not (module / "go.mod").exists():
            steps.append([go, "mod", "init", "spotwright.local/karpenter-bench"])
        steps += [
            [go, "get", "-t", f"{_PACKAGE}@{self.version}"],
            [go, "test", "-c", "-tags", "test_performance", "-o", str(self.binary), _PACKAGE],
        ]
        for step in steps:
            try:
                done = subprocess.run(
                    step,
                    cwd=module,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=self.timeout,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise NotAvailable(
                    f"building Karpenter's benchmark took over {self.timeout:.0f}s"
                ) from None
            if done.returncode != 0:
                raise NotAvailable(f"`{' '.join(step[1:3])}` failed: {_last_line(done.stderr)}")
        return self.binary

    def run(self, pods: int, cpu: int | None) -> KarpenterResult:
        """``BenchmarkScheduling<pods>`` once, single-threaded, on ``cpu`` if given."""
        if pods not in BENCH_COUNTS:
            counts = ", ".join(map(str, BENCH_COUNTS))
            raise NotAvailable(f"Karpenter's benchmark has no {pods}-pod case (it has {counts})")
        binary = self.build()
        env = {**os.environ, "GOMAXPROCS": "1"}

        def pin() -> None:
            if cpu is not None and hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(0, {cpu})

        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        try:
            done = subprocess.run(
                [
                    str(binary),
                    "-test.run=^$",
                    f"-test.bench=^BenchmarkScheduling{pods}$",
                    "-test.benchtime=1x",
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=self.timeout,
                preexec_fn=pin,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise NotAvailable(
                f"Karpenter's {pods}-pod benchmark ran over {self.timeout:.0f}s"
            ) from None
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_seconds = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        match = _LINE.search(done.stdout)
        if done.returncode != 0 or match is None:
            raise NotAvailable(
                f"Karpenter's benchmark failed: {_last_line(done.stdout + done.stderr)}"
            )
        metrics = {unit: float(value) for value, unit in _METRIC.findall(match["rest"])}
        seconds = float(match["ns"]) / 1e9
        return KarpenterResult(
            pods=pods,
            seconds=round(seconds, 3),
            pods_per_second=round(metrics.get("pods/sec", pods / seconds if seconds else 0.0), 1),
            cpu_seconds=round(cpu_seconds, 3),
            pods_per_cpu_second=round(pods / cpu_seconds, 1) if cpu_seconds > 0 else 0.0,
            nodes=int(metrics.get("nodes", 0)),
            version=self.version,
        )


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"
