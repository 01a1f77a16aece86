"""CreateFleet requests: building them, merging identical ones, reading the answer.

One launch request of the port (one node claim) becomes one instant-type CreateFleet with
``TotalTargetCapacity`` 1 and one override per acceptable offering: instance type x the
subnet chosen for its zone, at most ``MAX_OVERRIDES``, in the claim's preference order.
EC2 then picks the pool: price-capacity-optimized for spot (the lowest-priced of the pools
least likely to be interrupted), lowest-price for on-demand. Types needing different AMIs
(arm64, NVIDIA) go in separate launch template configs of the same fleet.

Requests whose ``merge_key`` is equal (same capacity type, same offerings in the same order,
same NodePool and node class, same node labels and taints, same tags apart from the node
claim's own) are sent as one fleet of N, and
the N instances are handed back one per request (``split``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from spotwright.model import labels as wk
from spotwright.ports.cloud import LaunchRequest

__all__ = [
    "MAX_OVERRIDES",
    "NODECLAIM_TAG",
    "NODECLASS_TAG",
    "NODEPOOL_TAG",
    "FleetPlan",
    "Launched",
    "MergeKey",
    "Override",
    "cluster_tag",
    "fleet_request",
    "launched_instances",
    "merge_key",
    "request_tags",
    "shared_tags",
]

#: Overrides sent in one CreateFleet (Karpenter sends its 60 cheapest types).
MAX_OVERRIDES: Final = 60
NODEPOOL_TAG: Final = "karpenter.sh/nodepool"
NODECLAIM_TAG: Final = "karpenter.sh/nodeclaim"
NODECLASS_TAG: Final = "karpenter.k8s.aws/ec2nodeclass"
#: Resources tagged at launch: the instances, their volumes and the fleet itself.
TAGGED_RESOURCES: Final = ("instance", "volume", "fleet")


def cluster_tag(cluster_name: str) -> str:
    """The tag key whose value ``owned`` marks what this cluster launched."""
    return f"kubernetes.io/cluster/{cluster_name}"


#: (capacity type, nodepool, ((type, zone), ...), tags other than the node claim's,
#: node class, the node's labels, its taints).
MergeKey = tuple[
    str,
    str,
    tuple[tuple[str, str], ...],
    tuple[tuple[str, str], ...],
    str,
    tuple[tuple[str, str], ...],
    tuple[str, ...],
]


def merge_key(request: LaunchRequest) -> MergeKey:
    """Equal keys launch identically, so their requests may share one CreateFleet (the
    labels and taints are in the user data, so they must agree too)."""
    pools = tuple((o.instance_type, o.zone) for o in request.offerings)
    tags = tuple(sorted((k, v) for k, v in request.tags if k != NODECLAIM_TAG))
    return (
        request.capacity_type,
        request.nodepool,
        pools,
        tags,
        request.node_class or "",
        tuple(sorted(request.labels)),
        tuple(str(t) for t in request.taints),
    )


def request_tags(request: LaunchRequest) -> dict[str, str]:
    """The tags an instance launched for ``request`` gets, apart from the cluster's: its
    NodePool and node claim, then the request's own tags (which win)."""
    return {NODEPOOL_TAG: request.nodepool, NODECLAIM_TAG: request.node_claim, **dict(request.tags)}


def shared_tags(requests: Sequence[LaunchRequest]) -> dict[str, str]:
    """The tags every request carries with the same value (all of them for one request)."""
    first = request_tags(requests[0])
    rest = [request_tags(r) for r in requests[1:]]
    return {k: v for k, v in first.items() if all(tags.get(k) == v for tags in rest)}


@dataclass(frozen=True, slots=True)
class Override:
    instance_type: str
    subnet_id: str
    zone: str


@dataclass(frozen=True, slots=True)
class FleetPlan:
    """What to send for one merge key: launch template id -> its overrides."""

    capacity_type: str
    configs: tuple[tuple[str, tuple[Override, ...]], ...]

    @property
    def zone_of_subnet(self) -> dict[str, str]:
        return {o.subnet_id: o.zone for _, overrides in self.configs for o in overrides}


def fleet_request(
    plan: FleetPlan, *, count: int, tags: Mapping[str, str], client_token: str
) -> dict[str, Any]:
    """The CreateFleet parameters for ``count`` instances of ``plan``.

    ``client_token`` makes the call idempotent, so a retry after a lost answer cannot launch
    the instances twice.
    """
    if count < 1:
        raise ValueError("a fleet needs at least one instance")
    request: dict[str, Any] = {
        "Type": "instant",
        "ClientToken": client_token,
        "TargetCapacitySpecification": {
            "TotalTargetCapacity": count,
            "DefaultTargetCapacityType": plan.capacity_type,
        },
        "LaunchTemplateConfigs": [
            {
                "LaunchTemplateSpecification": {"LaunchTemplateId": template, "Version": "$Latest"},
                "Overrides": [
                    {"InstanceType": o.instance_type, "SubnetId": o.subnet_id} for o in overrides
                ],
            }
            for template, overrides in plan.configs
        ],
        "TagSpecifications": [
            {
                "ResourceType": resource,
                "Tags": [{"Key": k, "Value": v} for k, v in sorted(tags.items())],
            }
            for resource in TAGGED_RESOURCES
        ],
    }
    if plan.capacity_type == wk.SPOT:
        request["SpotOptions"] = {"AllocationStrategy": "price-capacity-optimized"}
    else:
        request["OnDemandOptions"] = {"AllocationStrategy": "lowest-price"}
    return request


@dataclass(frozen=True, slots=True)
class Launched:
    instance_id: str
    instance_type: str
    zone: str
    capacity_type: str


def launched_instances(
    response: Mapping[str, Any], *, capacity_type: str, zone_of_subnet: Mapping[str, str]
) -> list[Launched]:
    """Every instance a CreateFleet answer reports, in the order it lists them."""
    out: list[Launched] = []
    for group in response.get("Instances") or ():
        override = (group.get("LaunchTemplateAndOverrides") or {}).get("Overrides") or {}
        instance_type = str(group.get("InstanceType") or override.get("InstanceType") or "")
        zone = str(
            override.get("AvailabilityZone")
            or zone_of_subnet.get(str(override.get("SubnetId") or ""))
            or ""
        )
        lifecycle = group.get("Lifecycle") or capacity_type
        kind = wk.SPOT if lifecycle == wk.SPOT else wk.ON_DEMAND
        for instance_id in group.get("InstanceIds") or ():
            out.append(Launched(str(instance_id), instance_type, zone, kind))
    return out
