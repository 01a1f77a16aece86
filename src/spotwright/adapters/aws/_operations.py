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

__all__ = [
    "INTERRUPTER_OPERATIONS",
    "INTERRUPTER_TAG",
    "OPERATIONS",
    "Grant",
    "is_declared",
]

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

#: Instance profiles spotwright makes for EC2NodeClass roles (``instance_profiles``).
_PROFILES: Final = f"{_ARN}:iam::${{AWS::AccountId}}:instance-profile/spotwright/*"
_QUEUE: Final = f"{_ARN}:sqs:${{AWS::Region}}:${{AWS::AccountId}}:${{InterruptionQueueName}}"
#: Any Auto Scaling group of the account in the region; the tag condition narrows it down.
_GROUPS: Final = (
    f"{_ARN}:autoscaling:${{AWS::Region}}:${{AWS::AccountId}}"
    ":autoScalingGroup:*:autoScalingGroupName/*"
)


def _lifecycle(action: str) -> tuple[Grant, ...]:
    """Lifecycle hooks of the cluster's own groups only (tagged ``owned``, as EKS does)."""
    return (Grant("ClusterGroupLifecycleActions", (action,), (_GROUPS,), _RESOURCE_TAGGED),)


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
    # the cluster's endpoint, CA and service CIDR for the nodes' user data, unless given
    ("eks", "DescribeCluster"): (
        Grant(
            "ReadOwnCluster",
            ("eks:DescribeCluster",),
            (f"{_ARN}:eks:${{AWS::Region}}:${{AWS::AccountId}}:cluster/${{ClusterName}}",),
        ),
    ),
    # EC2NodeClass amiSelectorTerms that select by id, name, owner or tags
    ("ec2", "DescribeImages"): _read("ec2:DescribeImages"),
    # the AMI parameters AWS publishes for EKS nodes (an EC2NodeClass alias, or the default)
    ("ssm", "GetParameter"): (
        Grant(
            "ReadPublicAmiParameters",
            ("ssm:GetParameter",),
            tuple(
                f"{_ARN}:ssm:${{AWS::Region}}::parameter/aws/service/{path}/*"
                for path in ("eks/optimized-ami", "bottlerocket", "ami-windows-latest")
            ),
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
    # an EC2NodeClass with ``role``: an instance profile for it, made once and tagged
    ("iam", "GetInstanceProfile"): (
        Grant("ReadInstanceProfiles", ("iam:GetInstanceProfile",), (_PROFILES,)),
    ),
    ("iam", "CreateInstanceProfile"): (
        Grant(
            "CreateTaggedInstanceProfiles",
            ("iam:CreateInstanceProfile", "iam:TagInstanceProfile"),
            (_PROFILES,),
            _REQUEST_TAGGED,
        ),
    ),
    ("iam", "AddRoleToInstanceProfile"): (
        Grant(
            "AddNodeRoleToOwnedInstanceProfiles",
            ("iam:AddRoleToInstanceProfile",),
            (_PROFILES,),
            _RESOURCE_TAGGED,
        ),
        _LAUNCH_GRANTS[-1],  # passes the node role
    ),
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
    # Keeping messages in flight while their drain runs; authorized as the single call.
    ("sqs", "ChangeMessageVisibilityBatch"): (
        Grant("InterruptionQueue", ("sqs:ChangeMessageVisibility",), (_QUEUE,)),
    ),
    # Auto Scaling terminate hooks: keep them open while draining, then let the group go on
    ("autoscaling", "RecordLifecycleActionHeartbeat"): _lifecycle(
        "autoscaling:RecordLifecycleActionHeartbeat"
    ),
    ("autoscaling", "CompleteLifecycleAction"): _lifecycle("autoscaling:CompleteLifecycleAction"),
}


# -- interrupter-only -------------------------------------------------------------------
# ``spotwright interrupt --to fis`` (adapters/aws/fis.py) is run by a person or a CI job, not
# by the controller, and the controller never calls FIS or changes IAM; so these operations
# are kept out of OPERATIONS and out of deploy/iam-policy.json. They make their own policy,
# deploy/iam-policy-interrupter.json (``iam_policy --interrupter``).
# ``${FisRoleName}`` is the experiment role the interrupter creates or reuses (--role-name).

#: The tag on everything the interrupter creates (role, templates, experiments).
INTERRUPTER_TAG: Final = ("spotwright.io/managed-by", "spotwright-interrupt")
_FIS: Final = f"{_ARN}:fis:${{AWS::Region}}:${{AWS::AccountId}}"
_FIS_TEMPLATES: Final = f"{_FIS}:experiment-template/*"
_FIS_EXPERIMENTS: Final = f"{_FIS}:experiment/*"
#: FIS's own actions (aws:ec2:send-spot-instance-interruptions...); what the experiments
#: can do is bounded by the role, which only sends spot interruptions.
_FIS_ACTIONS: Final = f"{_ARN}:fis:${{AWS::Region}}:*:action/*"
_FIS_ROLE: Final = f"{_ARN}:iam::${{AWS::AccountId}}:role/${{FisRoleName}}"
_TAGGED_REQUEST: Final = {
    "StringEquals": {f"aws:RequestTag/{INTERRUPTER_TAG[0]}": INTERRUPTER_TAG[1]}
}
_TAGGED_RESOURCE: Final = {
    "StringEquals": {f"aws:ResourceTag/{INTERRUPTER_TAG[0]}": INTERRUPTER_TAG[1]}
}
_FOLLOW: Final = "FollowOwnExperiments"

#: Every (service, operation) the interrupter's FIS target calls: interrupter-only.
INTERRUPTER_OPERATIONS: Final[Mapping[tuple[str, str], tuple[Grant, ...]]] = {
    # every instance must exist, run and be spot before anything is created
    ("ec2", "DescribeInstances"): _read("ec2:DescribeInstances"),
    # the experiment role: looked up, created tagged, its inline policy kept current
    ("iam", "GetRole"): (Grant("ReadFisRole", ("iam:GetRole",), (_FIS_ROLE,)),),
    ("iam", "CreateRole"): (
        Grant(
            "CreateTaggedFisRole", ("iam:CreateRole", "iam:TagRole"), (_FIS_ROLE,), _TAGGED_REQUEST
        ),
    ),
    ("iam", "PutRolePolicy"): (
        Grant("PolicyOfOwnFisRole", ("iam:PutRolePolicy",), (_FIS_ROLE,), _TAGGED_RESOURCE),
    ),
    # the experiment
    ("fis", "CreateExperimentTemplate"): (
        Grant(
            "CreateTaggedTemplates",
            ("fis:CreateExperimentTemplate", "fis:TagResource"),
            (_FIS_TEMPLATES,),
            _TAGGED_REQUEST,
        ),
        Grant("UseFisActions", ("fis:CreateExperimentTemplate",), (_FIS_ACTIONS,)),
        Grant(
            "PassFisRole",
            ("iam:PassRole",),
            (_FIS_ROLE,),
            {"StringEquals": {"iam:PassedToService": "fis.amazonaws.com"}},
        ),
    ),
    ("fis", "StartExperiment"): (
        Grant("StartOwnTemplates", ("fis:StartExperiment",), (_FIS_TEMPLATES,), _TAGGED_RESOURCE),
        Grant(
            "StartTaggedExperiments",
            ("fis:StartExperiment", "fis:TagResource"),
            (_FIS_EXPERIMENTS,),
            _TAGGED_REQUEST,
        ),
    ),
    ("fis", "GetExperiment"): (
        Grant(_FOLLOW, ("fis:GetExperiment",), (_FIS_EXPERIMENTS,), _TAGGED_RESOURCE),
    ),
    ("fis", "StopExperiment"): (
        Grant(_FOLLOW, ("fis:StopExperiment",), (_FIS_EXPERIMENTS,), _TAGGED_RESOURCE),
    ),
    ("fis", "DeleteExperimentTemplate"): (
        Grant(
            "DeleteOwnTemplates",
            ("fis:DeleteExperimentTemplate",),
            (_FIS_TEMPLATES,),
            _TAGGED_RESOURCE,
        ),
    ),
}


def is_declared(service: str, operation: str) -> bool:
    """Whether the adapters may call ``operation`` of ``service`` (see the module docstring).

    The interrupter's operations count too: ``AwsCaller`` serves both, and which policy
    covers which is kept apart by the two tables (and tests/aws/test_fis.py).
    """
    key = (service, operation)
    return key in OPERATIONS or key in INTERRUPTER_OPERATIONS
