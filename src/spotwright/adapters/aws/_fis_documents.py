"""The documents a ``spotwright interrupt --to fis`` run sends to AWS, and how it reads
the ones it finds: the experiment template, the experiment role's trust and inline
policies, and the checks that tell a role spotwright made from someone else's.

Pure functions of their arguments, so the shape of every request can be tested without
AWS; :mod:`spotwright.adapters.aws.fis` makes the calls.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import unquote

from spotwright.adapters.aws._operations import INTERRUPTER_TAG

ACTION_ID: Final = "aws:ec2:send-spot-instance-interruptions"
RESOURCE_TYPE: Final = "aws:ec2:spot-instance"
#: The name under which the action expects its targets.
ACTION_TARGET: Final = "SpotInstances"
#: FIS's default quota of spot instances per target of this action.
INSTANCES_PER_TARGET: Final = 5
FIS_PRINCIPAL: Final = "fis.amazonaws.com"
#: The tags of everything a run creates (role, templates, experiments).
TAGS: Final = {INTERRUPTER_TAG[0]: INTERRUPTER_TAG[1], "Name": "spotwright-interrupt"}
_DESCRIPTION_LIMIT: Final = 512


@dataclass(frozen=True, slots=True)
class SpotInstance:
    """A running spot instance, as checked before the experiment."""

    instance_id: str
    arn: str
    instance_type: str
    zone: str


def template_request(
    instances: Sequence[SpotInstance], *, role_arn: str, duration: str, client_token: str
) -> dict[str, Any]:
    """CreateExperimentTemplate's parameters: one target and one action per five instances."""
    targets: dict[str, Any] = {}
    actions: dict[str, Any] = {}
    for number, start in enumerate(range(0, len(instances), INSTANCES_PER_TARGET)):
        batch = instances[start : start + INSTANCES_PER_TARGET]
        target = f"spotInstances{number}"
        targets[target] = {
            "resourceType": RESOURCE_TYPE,
            "resourceArns": [instance.arn for instance in batch],
            "selectionMode": "ALL",
        }
        actions[f"interrupt{number}"] = {
            "actionId": ACTION_ID,
            "description": "spot interruption of " + ", ".join(i.instance_id for i in batch),
            "parameters": {"durationBeforeInterruption": duration},
            "targets": {ACTION_TARGET: target},
        }
    description = f"spotwright interrupt: {duration} before interrupting " + ", ".join(
        instance.instance_id for instance in instances
    )
    if len(description) > _DESCRIPTION_LIMIT:
        description = description[: _DESCRIPTION_LIMIT - 3] + "..."
    return {
        "clientToken": client_token,
        "description": description,
        "roleArn": role_arn,
        "stopConditions": [{"source": "none"}],
        "targets": targets,
        "actions": actions,
        "tags": dict(TAGS),
    }


def trust_policy(account_id: str) -> dict[str, Any]:
    """The experiment role's trust: FIS, acting for experiments of this account only."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": FIS_PRINCIPAL},
                "Action": "sts:AssumeRole",
                "Condition": {"StringEquals": {"aws:SourceAccount": account_id}},
            }
        ],
    }


def role_policy(partition: str, account_id: str) -> dict[str, Any]:
    """What the experiment role lets FIS do: send spot interruptions, describe instances.

    The role is reused across runs (and may serve two runs at once), so it names every
    instance of the account rather than this run's; DescribeInstances cannot be scoped.
    """
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "SendSpotInstanceInterruptions",
                "Effect": "Allow",
                "Action": "ec2:SendSpotInstanceInterruptions",
                "Resource": f"arn:{partition}:ec2:*:{account_id}:instance/*",
            },
            {
                "Sid": "DescribeInstances",
                "Effect": "Allow",
                "Action": "ec2:DescribeInstances",
                "Resource": "*",
            },
        ],
    }


def is_ours(tags: Sequence[Mapping[str, str]] | None) -> bool:
    return any(
        tag.get("Key") == INTERRUPTER_TAG[0] and tag.get("Value") == INTERRUPTER_TAG[1]
        for tag in tags or ()
    )


def trusts_fis(document: Any) -> bool:
    if isinstance(document, str):  # the raw API URL-encodes it; boto3 usually decodes it
        try:
            document = json.loads(unquote(document))
        except json.JSONDecodeError:
            return False
    return FIS_PRINCIPAL in json.dumps(document)
