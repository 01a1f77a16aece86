"""The command line as a user meets it: exit codes, stdout/stderr, no tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def spotwright(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spotwright", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_simulate_json_prints_exactly_one_object_and_logs_to_stderr() -> None:
    result = spotwright("simulate", str(EXAMPLES / "spot-interruption.yaml"), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    for key in (
        "scenario",
        "seed",
        "simulated_seconds",
        "cost",
        "nodes",
        "launch_failures",
        "interruptions",
        "pods",
        "availability_pct",
    ):
        assert key in summary
    assert "launched nodeclaim" in result.stderr
    assert "interruption received" in result.stderr


def test_simulate_without_a_file_runs_the_default_story_with_a_summary_table() -> None:
    result = spotwright("simulate", "--until", "10m")
    assert result.returncode == 0, result.stderr
    assert "savings" in result.stdout
    assert "batched pods" in result.stdout


def test_json_log_format_gives_one_json_object_per_line() -> None:
    result = spotwright(
        "simulate",
        str(EXAMPLES / "spot-interruption.yaml"),
        "--json",
        "--log-format",
        "json",
        "--until",
        "5m",
    )
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stderr.splitlines() if line.strip()]
    assert lines and all("message" in line and "timestamp" in line for line in lines)


def test_bad_scenario_exits_2_naming_file_and_path(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: spotwright.io/v1alpha1\nkind: Scenario\nmetadata: {name: bad}\n"
        "spec:\n  duration: 10m\n  workloads:\n  - {name: web, replicas: two}\n"
    )
    result = spotwright("simulate", str(bad))
    assert result.returncode == 2
    assert "bad.yaml" in result.stderr
    assert "spec.workloads[0]" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_file_and_bad_flag_values_are_clear_errors(tmp_path: Path) -> None:
    missing = spotwright("simulate", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "nope.yaml" in missing.stderr
    until = spotwright("simulate", "--until", "soon")
    assert until.returncode == 2 and "--until" in until.stderr
    for result in (missing, until):
        assert "Traceback" not in result.stderr


def test_results_do_not_depend_on_the_process_hash_seed() -> None:
    outputs = set()
    for hash_seed in ("1", "2"):
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "spotwright",
                "simulate",
                "--json",
                "--quiet",
                "--seed",
                "3",
                str(EXAMPLES / "spot-interruption.yaml"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
        )
        assert result.returncode == 0, result.stderr
        outputs.add(result.stdout)
    assert len(outputs) == 1


def test_region_without_prices_asks_for_a_refreshed_catalog(tmp_path: Path) -> None:
    scenario = tmp_path / "eu.yaml"
    scenario.write_text(
        "apiVersion: spotwright.io/v1alpha1\nkind: Scenario\nmetadata: {name: eu}\n"
        "spec:\n  region: eu-west-1\n  duration: 10m\n  nodePools:\n"
        "  - apiVersion: karpenter.sh/v1\n    kind: NodePool\n    metadata: {name: default}\n"
        "    spec: {template: {spec: {requirements: []}}}\n"
    )
    result = spotwright("simulate", str(scenario))
    assert result.returncode == 2
    assert "spec.region" in result.stderr and "catalog refresh" in result.stderr


def test_a_catalog_file_can_replace_the_bundled_one(tmp_path: Path) -> None:
    from spotwright.catalog import load_catalog, write_catalog

    bundled = load_catalog()
    small = [t for t in bundled.types if t.family in ("c6i", "m6i", "r6i")]
    path = tmp_path / "small.csv"
    write_catalog(small, path, region=bundled.region)
    result = spotwright(
        "simulate",
        str(EXAMPLES / "spot-interruption.yaml"),
        "--json",
        "--quiet",
        "--catalog",
        str(path),
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["nodes"]["launched"]["spot"] >= 2
