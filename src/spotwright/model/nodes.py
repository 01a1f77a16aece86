"""The Node object a launched instance becomes.

Whoever registers the node (the kubelet live, the simulator's world, the kwok-backed
``--cloud sim`` mode) must give it the same labels and taints: those of its node claim,
the instance type's well-known labels, and its zone, region and capacity type, so that a
pod the provisioner placed on the claim also fits the node.

The capacity type is also written in the vocabulary of EKS managed node groups
(``eks.amazonaws.com/capacityType: SPOT``) and eksctl (``lifecycle: Ec2Spot``): manifests
written for those select nodes that way, and kube-scheduler (unlike spotwright's own
scheduler, see ``scheduling.compat``) only compares labels literally. A label the
NodePool sets itself under either key is left as the NodePool wrote it.
"""

from __future__ import annotations

from spotwright.catalog._types import InstanceType
from spotwright.model import labels as wk
from spotwright.model.kubelet import allocatable
from spotwright.model.objects import Node, NodeClaim

__all__ = [
    "EKSCTL_LIFECYCLE",
    "EKS_CAPACITY_TYPE",
    "compat_labels",
    "node_for_instance",
    "node_labels",
]

EKS_CAPACITY_TYPE = "eks.amazonaws.com/capacityType"
EKSCTL_LIFECYCLE = "lifecycle"

#: Reserved capacity is on-demand capacity to EKS and eksctl.
_COMPAT = {
    wk.SPOT: {EKS_CAPACITY_TYPE: "SPOT", EKSCTL_LIFECYCLE: "Ec2Spot"},
    wk.ON_DEMAND: {EKS_CAPACITY_TYPE: "ON_DEMAND", EKSCTL_LIFECYCLE: "OnDemand"},
    wk.RESERVED: {EKS_CAPACITY_TYPE: "ON_DEMAND", EKSCTL_LIFECYCLE: "OnDemand"},
}


def compat_labels(capacity_type: str) -> dict[str, str]:
    """The EKS and eksctl labels a node of ``capacity_type`` carries (empty if unknown)."""
    return dict(_COMPAT.get(capacity_type, {}))


def node_labels(
    *,
    claim: NodeClaim | None,
    instance_type: InstanceType,
    zone: str,
    region: str,
    capacity_type: str,
    hostname: str,
) -> dict[str, str]:
    labels = dict(claim.labels) if claim is not None else {}
    labels.update(instance_type.labels)
    labels.update(
        {
            wk.ZONE: zone,
            wk.REGION: region,
            wk.CAPACITY_TYPE: capacity_type,
            wk.HOSTNAME: hostname,
        }
    )
    for key, value in compat_labels(capacity_type).items():
        labels.setdefault(key, value)
    return labels


def node_for_instance(
    *,
    name: str,
    provider_id: str,
    claim: NodeClaim | None,
    instance_type: InstanceType,
    zone: str,
    region: str,
    capacity_type: str,
    now: float,
    ready: bool = True,
) -> Node:
    return Node(
        name=name,
        provider_id=provider_id,
        labels=node_labels(
            claim=claim,
            instance_type=instance_type,
            zone=zone,
            region=region,
            capacity_type=capacity_type,
            hostname=name,
        ),
        taints=list(claim.taints) if claim is not None else [],
        # what the scheduler assumed for the claim's class, or pods get overpacked
        allocatable=allocatable(instance_type, claim.kubelet if claim is not None else None),
        ready=ready,
        created_at=now,
    )
