"""``spotwright controller``'s options reach the command: bad input fails cleanly, before any
connection is attempted. Every option passes through ``Options``, so an option added
without its field would fail these tests rather than a user's first run."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from spotwright.cli import cli


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["controller", *args])
    return result.exit_code, result.output


def test_aws_without_a_cluster_name_is_refused_with_the_reason() -> None:
    code, output = run("--cloud", "aws", "--instance-types", "m5.*", "--ami-id", "ami-1")
    assert code == 2
    assert "--cloud aws needs --cluster-name" in output
    assert "Traceback" not in output


def test_an_invalid_nodepool_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "pool.yaml"
    bad.write_text("apiVersion: spotwright.io/v1alpha1\nkind: NodePool\nspec: 3\n")
    code, output = run("--cloud", "sim", "--nodepools", str(bad))
    assert code == 2
    assert "pool.yaml" in output
    assert "Traceback" not in output
