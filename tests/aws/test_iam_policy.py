"""The shipped IAM policy is the generated one, and covers every call the adapters make."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from awsfakes import run

from spotwright.adapters.aws import iam_policy
from spotwright.adapters.aws._api import AwsCaller
from spotwright.adapters.aws._operations import INTERRUPTER_OPERATIONS

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "spotwright" / "adapters" / "aws"


def test_checked_in_policy_matches_the_generator() -> None:
    shipped = (ROOT / "deploy" / "iam-policy.json").read_text(encoding="utf-8")
    assert shipped == iam_policy.policy_json(), (
        "deploy/iam-policy.json is stale: run "
        "python -m spotwright.adapters.aws.iam_policy --out deploy/iam-policy.json"
    )


def test_every_operation_named_in_the_adapters_is_declared() -> None:
    """Each literal first argument of ``.call(...)``/``.collect(...)`` is in OPERATIONS."""
    named: set[str] = set()
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in {"call", "collect"}
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                named.add(node.args[0].value)
    # The interrupter's FIS and IAM calls have a policy of their own.
    declared = {op for _, op in (*iam_policy.OPERATIONS, *INTERRUPTER_OPERATIONS)}
    assert named, "the scan found no calls"
    assert named <= declared
    assert declared <= named, f"declared but never called: {declared - named}"


def test_an_undeclared_operation_is_refused_before_any_request(
    client: object,
) -> None:
    from spotwright.ports.clock import LoopClock

    async def main() -> None:
        caller = AwsCaller(client("ec2"), clock=LoopClock())  # type: ignore[operator]
        with pytest.raises(AssertionError, match="not declared"):
            await caller.call("DeleteVpc", VpcId="vpc-1")

    run(main())


def test_the_policy_is_least_privilege() -> None:
    document = iam_policy.policy_document()
    statements = document["Statement"]
    assert len({s["Sid"] for s in statements}) == len(statements)
    for statement in statements:
        assert statement["Effect"] == "Allow"
        assert all(":" in action and "*" not in action for action in statement["Action"])
        writes = [
            a for a in statement["Action"] if not a.split(":")[1].startswith(("Describe", "Get"))
        ]
        if writes and statement["Sid"] != "InterruptionQueue":
            # Every mutating grant is scoped by resource ARN, and most also by a condition.
            assert statement["Resource"] != "*", statement["Sid"]
    terminate = next(s for s in statements if "ec2:TerminateInstances" in s["Action"])
    assert terminate["Condition"]["StringEquals"] == {
        "aws:ResourceTag/kubernetes.io/cluster/${ClusterName}": "owned"
    }


def test_render_fills_every_placeholder() -> None:
    text = iam_policy.render_policy(
        cluster_name="prod",
        account_id="123456789012",
        region="eu-west-1",
        node_role_name="KarpenterNodeRole-prod",
        interruption_queue_name="prod-interruptions",
    )
    assert "${" not in text
    document = json.loads(text)
    assert any(
        s["Resource"] == "arn:aws:sqs:eu-west-1:123456789012:prod-interruptions"
        for s in document["Statement"]
    )
    without_queue = iam_policy.render_policy(
        cluster_name="prod", account_id="1", region="eu-west-1"
    )
    assert "sqs:" not in without_queue and "iam:PassRole" not in without_queue


def test_the_interrupter_policy_cannot_be_filled_in_for_a_cluster(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--cluster fills the controller's placeholders; silently ignoring it with
    --interrupter would print a policy the user believes is filled in."""
    with pytest.raises(SystemExit) as exit_info:
        iam_policy.main(
            ["--interrupter", "--cluster", "prod", "--account-id", "1", "--region", "eu-west-1"]
        )
    assert exit_info.value.code == 2
    assert "--cluster fills in the controller's policy only" in capsys.readouterr().err
