"""The one list of AWS operations the adapters call, with the permissions each needs.

The adapters' single call path (``_api.AwsCaller``) refuses any operation not listed here,
and ``iam_policy`` generates the shipped IAM policy from this list, so the policy cannot
fall behind the code: a new call fails every test until it is declared together with the
permissions it needs. Resources use CloudFormation-style placeholders (``${AWS::Region}``,
``${ClusterName}``...); ``iam_policy.render_policy`` fills them in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = ["OPERATIONS", "Grant", "is_declared"]

_ARN: Final = "arn:${AWS::Partition}"
_EC2: Final = f"{_ARN}:ec2:${{AWS::Region}}"
_OWN: Final = f"{_EC2}:${{AWS::AccountId}}"  # resources this account creates
_ANY: Final = f"{_EC2}:*"  # subnets and security groups may be shared from another account
_CLUSTER_TAG: Final = "kubernetes.io/cluster/${ClusterName}"
_IN_REGION: Final = {"StringEquals": {"aws:RequestedRegion": "${AWS::Region}"}}
_REQUEST_TAGGED: Final = {"StringEquals": {f"aws:RequestTag/{_CLUSTER_TAG}": "owned"}}
_RESOURCE_TAGGED: Final = {"StringEquals": {f"aws:ResourceTag/{_CLUSTER_TAG}": "owned"}}


@dataclass(frozen=True)
class Grant:
    """IAM actions on resources, under conditions: one piece of a policy statement."""

    sid: str
    actions: tuple[str, ...]
    resources: tuple[str, ...] = ("*",)
    condition: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


_DESCRIBE = "RegionalReadOnly"


def _read(action: str) -> tuple[Grant, ...]:
    return (Grant(_DESCRIBE, (action,), ("*",), _IN_REGION),)


_LAUNCH_GRANTS: Final = (
    # New resources must carry the cluster tag, so nothing else can be created this way.
    Grant(
        "CreateTaggedInstances",
        ("ec2:CreateFleet", "ec2:RunInstances"),
        (f"{_OWN}:fleet/*", f"{_OWN}:instance/*", f"{_OWN}:volume/*"),
        _REQUEST_TAGGED,
    ),
    # Only from launch templates this cluster created.
    Grant(
        "LaunchFromOwnedTemplates",
        ("ec2:CreateFleet", "ec2:RunInstances"),
        (f"{_OWN}:launch-template/*",),
        _RESOURCE_TAGGED,
    ),
    # Existing network, images and the implicit per-launch resources.
    Grant(
        "LaunchIntoNetwork",
        ("ec2:CreateFleet", "ec2:RunInstances"),
        (
            f"{_ANY}:subnet/*",
            f"{_ANY}:security-group/*",
            f"{_EC2}::image/*",
            f"{_OWN}:network-interface/*",
            f"{_OWN}:spot-instances-request/*",
        ),
    ),
    Grant(
        "TagOnCreate",
        ("ec2:CreateTags",),
        (f"{_OWN}:fleet/*", f"{_OWN}:instance/*", f"{_OWN}:volume/*"),
        {
            "StringEquals": {
                f"aws:RequestTag/{_CLUSTER_TAG}": "owned",
                "ec2:CreateAction": ["CreateFleet", "RunInstances"],
            }
        },
    ),
    # The launch template names the node role's instance profile.
    Grant(
        "PassNodeRole",
        ("iam:PassRole",),
        (f"{_ARN}:iam::${{AWS::AccountId}}:role/${{NodeRoleName}}",),
        {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}},
    ),
)

_QUEUE: Final = f"{_ARN}:sqs:${{AWS::Region}}:${{AWS::AccountId}}:${{InterruptionQueueName}}"

#: Every (service, operation) the adapters call, with the permissions each needs.
OPERATIONS: Final[Mapping[tuple[str, str], tuple[Grant, ...]]] = {
    # discovery
    ("ec2", "DescribeInstanceTypes"): _read("ec2:DescribeInstanceTypes"),
    ("ec2", "DescribeInstanceTypeOfferings"): _read("ec2:DescribeInstanceTypeOfferings"),
    ("ec2", "DescribeSpotPriceHistory"): _read("ec2:DescribeSpotPriceHistory"),
    ("ec2", "DescribeSubnets"): _read("ec2:DescribeSubnets"),
    ("ec2", "DescribeSecurityGroups"): _read("ec2:DescribeSecurityGroups"),
    ("ec2", "DescribeLaunchTemplates"): _read("ec2:DescribeLaunchTemplates"),
    ("ec2", "DescribeInstances"): _read("ec2:DescribeInstances"),
    ("ssm", "GetParameter"): (
        Grant(
            "ReadEksOptimizedAmiParameters",
            ("ssm:GetParameter",),
            (f"{_ARN}:ssm:${{AWS::Region}}::parameter/aws/service/eks/optimized-ami/*",),
        ),
    ),
    ("pricing", "GetProducts"): (Grant("ReadPrices", ("pricing:GetProducts",)),),
    # launch
    ("ec2", "CreateLaunchTemplate"): (
        Grant(
            "CreateOwnedLaunchTemplates",
            ("ec2:CreateLaunchTemplate",),
            (f"{_OWN}:launch-template/*",),
            _REQUEST_TAGGED,
        ),
        Grant(
            "TagLaunchTemplatesOnCreate",
            ("ec2:CreateTags",),
            (f"{_OWN}:launch-template/*",),
            {
                "StringEquals": {
                    f"aws:RequestTag/{_CLUSTER_TAG}": "owned",
                    "ec2:CreateAction": "CreateLaunchTemplate",
                }
            },
        ),
    ),
    ("ec2", "CreateFleet"): _LAUNCH_GRANTS,
    # after a merged launch: the node claim tag, on the cluster's own instances only
    ("ec2", "CreateTags"): (
        Grant(
            "TagOwnedInstancesWithNodeClaim",
            ("ec2:CreateTags",),
            (f"{_OWN}:instance/*",),
            {
                "StringEquals": {f"aws:ResourceTag/{_CLUSTER_TAG}": "owned"},
                "ForAllValues:StringEquals": {"aws:TagKeys": ["karpenter.sh/nodeclaim"]},
            },
        ),
    ),
    ("ec2", "TerminateInstances"): (
        Grant(
            "TerminateOwnedInstances",
            ("ec2:TerminateInstances",),
            (f"{_OWN}:instance/*",),
            {
                "StringEquals": {f"aws:ResourceTag/{_CLUSTER_TAG}": "owned"},
                "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"},
            },
        ),
    ),
    # interruption queue
    ("sqs", "ReceiveMessage"): (Grant("InterruptionQueue", ("sqs:ReceiveMessage",), (_QUEUE,)),),
    ("sqs", "DeleteMessage"): (Grant("InterruptionQueue", ("sqs:DeleteMessage",), (_QUEUE,)),),
    ("sqs", "ChangeMessageVisibility"): (
        Grant("InterruptionQueue", ("sqs:ChangeMessageVisibility",), (_QUEUE,)),
    ),
}


def is_declared(service: str, operation: str) -> bool:
    """Whether the adapters may call ``operation`` of ``service`` (see the module docstring)."""
    return (service, operation) in OPERATIONS
