"""The least-privilege IAM policy of the AWS adapters, generated from the calls they make.

``_operations.OPERATIONS`` is the one list of AWS API operations spotwright calls, each with
the grants it needs; the adapters' single call path refuses anything not in it, so the
policy generated here cannot fall behind the code. Grants with the same sid, resources and
conditions are merged into one statement.

The checked-in ``deploy/iam-policy.json`` carries CloudFormation-style placeholders
(``${AWS::Partition}``, ``${AWS::Region}``, ``${AWS::AccountId}``, ``${ClusterName}``,
``${NodeRoleName}``, ``${InterruptionQueueName}``), so it can be used with ``Fn::Sub`` as it
is; ``render_policy`` fills them in for other tools. Regenerate it with::

    python -m spotwright.adapters.aws.iam_policy --out deploy/iam-policy.json

and print a filled-in copy with ``--cluster NAME --account-id ID --region R ...``.

``spotwright interrupt --to fis`` is run by a person or a CI job, not by the controller, so
its operations (``_operations.INTERRUPTER_OPERATIONS``) make a separate policy, generated
the same way with ``--interrupter`` and checked in as ``deploy/iam-policy-interrupter.json``.
Its placeholders are ``${AWS::Partition}``, ``${AWS::Region}``, ``${AWS::AccountId}`` and
``${FisRoleName}`` (the experiment role, ``--role-name``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from spotwright.adapters.aws._operations import (
    INTERRUPTER_OPERATIONS,
    OPERATIONS,
    Grant,
    is_declared,
)

__all__ = [
    "OPERATIONS",
    "Grant",
    "interrupter_policy_json",
    "is_declared",
    "policy_document",
    "policy_json",
    "render_policy",
]


def policy_document(
    operations: Mapping[tuple[str, str], Sequence[Grant]] = OPERATIONS,
) -> dict[str, Any]:
    """The policy for ``operations``: one statement per distinct (sid, resources, condition)."""
    merged: dict[tuple[str, str, str], dict[str, Any]] = {}
    for grants in operations.values():
        for grant in grants:
            resources = sorted(grant.resources)
            key = (
                grant.sid,
                json.dumps(resources),
                json.dumps(grant.condition, sort_keys=True),
            )
            statement = merged.get(key)
            if statement is None:
                statement = {"Sid": grant.sid, "Effect": "Allow", "Action": [], "Resource": []}
                statement["Resource"] = resources[0] if len(resources) == 1 else resources
                if grant.condition:
                    statement["Condition"] = json.loads(json.dumps(grant.condition))
                merged[key] = statement
            for action in grant.actions:
                if action not in statement["Action"]:
                    statement["Action"].append(action)
    statements = sorted(merged.values(), key=lambda s: (s["Sid"], json.dumps(s["Resource"])))
    sids: dict[str, int] = {}
    for statement in statements:
        statement["Action"] = sorted(statement["Action"])
        count = sids.get(statement["Sid"], 0) + 1
        sids[statement["Sid"]] = count
        if count > 1:  # Sids must be unique within a policy
            statement["Sid"] = f"{statement['Sid']}{count}"
    return {"Version": "2012-10-17", "Statement": statements}


def policy_json() -> str:
    """The text of ``deploy/iam-policy.json``: stable key order, two-space indent."""
    return json.dumps(policy_document(), indent=2) + "\n"


def interrupter_policy_json() -> str:
    """The text of ``deploy/iam-policy-interrupter.json``: the policy of ``spotwright
    interrupt --to fis``, kept apart from the controller's, which grants no FIS or IAM
    writes."""
    return json.dumps(policy_document(INTERRUPTER_OPERATIONS), indent=2) + "\n"


def render_policy(
    *,
    cluster_name: str,
    account_id: str,
    region: str,
    node_role_name: str = "",
    interruption_queue_name: str = "",
    partition: str = "aws",
) -> str:
    """The policy with every placeholder filled in, for tools without ``Fn::Sub``.

    An empty node role or queue name drops the statements that need it.
    """
    document = policy_document()
    if not node_role_name:
        document["Statement"] = [
            s for s in document["Statement"] if "${NodeRoleName}" not in json.dumps(s)
        ]
    if not interruption_queue_name:
        document["Statement"] = [
            s for s in document["Statement"] if "${InterruptionQueueName}" not in json.dumps(s)
        ]
    text = json.dumps(document, indent=2) + "\n"
    for placeholder, value in (
        ("${AWS::Partition}", partition),
        ("${AWS::Region}", region),
        ("${AWS::AccountId}", account_id),
        ("${ClusterName}", cluster_name),
        ("${NodeRoleName}", node_role_name),
        ("${InterruptionQueueName}", interruption_queue_name),
    ):
        text = text.replace(placeholder, value)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spotwright.adapters.aws.iam_policy",
        description="Print or write the IAM policy the spotwright AWS adapters need.",
    )
    parser.add_argument("--out", type=Path, help="write here instead of stdout")
    parser.add_argument(
        "--interrupter",
        action="store_true",
        help=(
            "the policy of `spotwright interrupt --to fis` instead of the controller's "
            "(placeholders: ${AWS::Partition}, ${AWS::Region}, ${AWS::AccountId}, "
            "${FisRoleName})"
        ),
    )
    parser.add_argument("--cluster", help="fill in the placeholders for this cluster")
    parser.add_argument("--account-id", default="")
    parser.add_argument("--region", default="")
    parser.add_argument("--node-role", default="")
    parser.add_argument("--queue", default="", help="interruption queue name")
    parser.add_argument("--partition", default="aws")
    args = parser.parse_args(argv)
    if args.interrupter:
        if args.cluster:
            parser.error(
                "--cluster fills in the controller's policy only; fill in the "
                "--interrupter policy's placeholders as docs/interrupt.md shows"
            )
        text = interrupter_policy_json()
    elif args.cluster:
        if not (args.account_id and args.region):
            parser.error("--cluster needs --account-id and --region")
        text = render_policy(
            cluster_name=args.cluster,
            account_id=args.account_id,
            region=args.region,
            node_role_name=args.node_role,
            interruption_queue_name=args.queue,
            partition=args.partition,
        )
    else:
        text = policy_json()
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
