"""Benchmarks (skipped by default; run with ``pytest --benchmark-only -m bench``)."""

from typing import Any

import pytest

from spotwright.benchmarks.scheduling import run_identical_benchmark, run_scheduling_benchmark


@pytest.mark.bench
def test_scheduling_benchmark(benchmark: Any) -> None:
    result = benchmark.pedantic(run_scheduling_benchmark, args=(500,), rounds=3, iterations=1)
    print(result)
    assert result["scheduled"] == 500


@pytest.mark.bench
def test_identical_benchmark(benchmark: Any) -> None:
    result = benchmark.pedantic(run_identical_benchmark, args=(2000,), rounds=3, iterations=1)
    print(result)
    assert result["scheduled"] == 2000
