"""A mixed on-demand/spot node group, in eksctl's ``nodeGroups[]`` shape.

Many clusters run their baseline on an Auto Scaling group described in an eksctl
ClusterConfig: some instance types, a size, and an ``instancesDistribution`` that keeps a
base of on-demand instances and buys the rest as spot. spotwright reads that item as it is
written, so the group can be pasted into a scenario (or, later, a NodeGroup object) and
kept by the node group controller the way the Auto Scaling group would keep it.

Fields eksctl uses to build the instances (AMI, volumes, SSH, IAM, tags...) change nothing
spotwright can observe and are accepted and ignored. Fields that would change which
instances run or what fits on them, and that spotwright does not implement, are rejected
by name with the reason, rather than silently ignored.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, StrictBool, ValidationError, field_validator, model_validator

from spotwright.model import labels as wk
from spotwright.model.errors import (
    Problem,
    ScenarioError,
    format_path,
    problems_from_validation,
    read_yaml,
    show,
)
from spotwright.model.fields import (
    CatalogLike,
    ConfigModel,
    Labels,
    ObjectName,
    StrictInt,
    unknown_instance_type,
    unknown_zone,
)
from spotwright.model.nodepool import TaintSpec
from spotwright.model.objects import Taint

__all__ = [
    "DEFAULT_NODE_COUNT",
    "DEFAULT_SPOT_POOLS",
    "IGNORED_FIELDS",
    "NODEGROUP_LABEL",
    "UNSUPPORTED_FIELDS",
    "InstancesDistribution",
    "NodeGroup",
    "SpotAllocationStrategy",
    "check_nodegroup",
    "load_nodegroup_files",
    "parse_cluster_config",
    "parse_nodegroup",
]

#: The label every node of a group carries, with the group's name as value.
NODEGROUP_LABEL = "spotwright.io/nodegroup"
#: eksctl's size for a group that gives none (``DefaultNodeCount``).
DEFAULT_NODE_COUNT = 2
#: Auto Scaling's ``SpotInstancePools`` default, used by ``lowest-price``.
DEFAULT_SPOT_POOLS = 2

#: eksctl nodeGroup fields that only shape the instances themselves: accepted, no effect.
IGNORED_FIELDS = frozenset(
    {
        "ami",
        "amiFamily",
        "asgMetricsCollection",
        "bottlerocket",
        "classicLoadBalancerNames",
        "clusterDNS",
        "containerRuntime",
        "disableIMDSv1",
        "disablePodIMDS",
        "ebsOptimized",
        "enableDetailedMonitoring",
        "iam",
        "instanceName",
        "instancePrefix",
        "overrideBootstrapCommand",
        "preBootstrapCommands",
        "privateNetworking",
        "propagateASGTags",
        "securityGroups",
        "ssh",
        "tags",
        "targetGroupARNs",
        "volumeEncrypted",
        "volumeIOPS",
        "volumeKmsKeyID",
        "volumeName",
        "volumeSize",
        "volumeThroughput",
        "volumeType",
    }
)

#: eksctl fields that would change what runs, and why spotwright refuses them.
UNSUPPORTED_FIELDS = {
    "instanceSelector": "list the instance types in instancesDistribution.instanceTypes",
    "maxPodsPerNode": "pods per node come from the instance type (the catalog's allocatable)",
    "kubeletExtraConfig": "kubelet reservations come from the catalog's allocatable",
    "subnets": "use availabilityZones to restrict the group's zones",
    "asgSuspendProcesses": "the node group controller always launches and replaces instances",
    "updateConfig": "rolling updates of node groups are not modelled",
    "placement": "placement groups are not modelled",
    "efaEnabled": "EFA network cards are not modelled",
    "cpuCredits": "burstable CPU credits are not modelled",
    "spot": "that is a managedNodeGroups field; for a spot group use instancesDistribution "
    "with onDemandPercentageAboveBaseCapacity: 0",
    "instanceTypes": "that is a managedNodeGroups field; use instancesDistribution.instanceTypes",
    "launchTemplate": "that is a managedNodeGroups field; launch templates are not modelled",
}

SpotAllocationStrategy = Literal[
    "lowest-price",
    "capacity-optimized",
    "capacity-optimized-prioritized",
    "price-capacity-optimized",
]

_STRATEGIES_WITHOUT_POOLS = (
    "capacity-optimized",
    "capacity-optimized-prioritized",
    "price-capacity-optimized",
)


def _price(value: object) -> object:
    if value is None:
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a price in USD per hour like 0.05, got {show(value)}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"expected a price greater than 0, got {show(value)}")
    return float(value)


class InstancesDistribution(ConfigModel):
    """eksctl's ``instancesDistribution``: the group's mixed instances policy."""

    instance_types: list[str] = Field(min_length=1, max_length=20)
    #: Highest spot price paid per instance-hour; unset: the type's on-demand price.
    max_price: float | None = None
    on_demand_base_capacity: StrictInt = Field(default=0, ge=0)
    on_demand_percentage_above_base_capacity: StrictInt = Field(default=100, ge=0, le=100)
    #: Only with ``lowest-price``; unset means Auto Scaling's default of 2.
    spot_instance_pools: StrictInt | None = Field(default=None, ge=1, le=20)
    spot_allocation_strategy: SpotAllocationStrategy = "lowest-price"
    capacity_rebalance: StrictBool = False

    @field_validator("max_price", mode="before")
    @classmethod
    def _max_price(cls, value: object) -> object:
        return _price(value)

    @field_validator("instance_types")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        seen: set[str] = set()
        for name in value:
            if name in seen:
                raise ValueError(f"expected each instance type once, got {show(name)} again")
            seen.add(name)
        return value

    @model_validator(mode="after")
    def _pools_need_lowest_price(self) -> InstancesDistribution:
        strategy = self.spot_allocation_strategy
        if self.spot_instance_pools is not None and strategy in _STRATEGIES_WITHOUT_POOLS:
            raise ValueError(
                f"expected spotInstancePools only with spotAllocationStrategy: lowest-price "
                f"(the only strategy Auto Scaling uses it with), got it with {strategy}"
            )
        return self


class NodeGroup(ConfigModel):
    """One item of an eksctl ClusterConfig's ``nodeGroups`` list.

    Sizes default as eksctl defaults them: no size at all is 2 nodes, an unset
    ``desiredCapacity`` is ``minSize``, an unset ``maxSize`` is the desired (or min) size.
    Without ``instancesDistribution`` the group is ``instanceType`` instances, all
    on-demand, as eksctl creates it.
    """

    name: ObjectName
    instance_type: str | None = None
    availability_zones: list[str] | None = Field(default=None, min_length=1)
    min_size: StrictInt | None = Field(default=None, ge=0)
    max_size: StrictInt | None = Field(default=None, ge=0)
    desired_capacity: StrictInt | None = Field(default=None, ge=0)
    labels: Labels = Field(default_factory=dict)
    taints: list[TaintSpec] = Field(default_factory=list)
    instances_distribution: InstancesDistribution | None = None

    @model_validator(mode="before")
    @classmethod
    def _eksctl_fields(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        refused = [key for key in data if key in UNSUPPORTED_FIELDS]
        if refused:
            raise ValueError(
                "; ".join(
                    f"unsupported eksctl field {show(key)}: {UNSUPPORTED_FIELDS[key]}"
                    for key in refused
                )
            )
        return {k: v for k, v in data.items() if k not in IGNORED_FIELDS}

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if key in wk.WELL_KNOWN or key in (wk.HOSTNAME, NODEGROUP_LABEL):
                raise ValueError(
                    f"expected a label key of your own, got {show(key)}: spotwright sets it "
                    "on every node from the instance it runs on"
                )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> NodeGroup:
        distribution = self.instances_distribution
        if distribution is not None and self.instance_type not in (None, "mixed"):
            raise ValueError(
                'expected instanceType to be "mixed" or unset with instancesDistribution, '
                f"got {show(self.instance_type)}"
            )
        if distribution is None and self.instance_type in (None, "mixed"):
            raise ValueError(
                "expected instancesDistribution (or a single instanceType), got neither"
            )
        low, high, want = self.min_size, self.max_size, self.desired_capacity
        if low is not None and high is not None and high < low:
            raise ValueError(f"expected maxSize ≥ minSize ({low}), got {high}")
        if want is not None and low is not None and want < low:
            raise ValueError(f"expected desiredCapacity ≥ minSize ({low}), got {want}")
        if want is not None and high is not None and want > high:
            raise ValueError(f"expected desiredCapacity ≤ maxSize ({high}), got {want}")
        if distribution is not None and distribution.on_demand_base_capacity > self.max:
            raise ValueError(
                f"expected instancesDistribution.onDemandBaseCapacity ≤ maxSize ({self.max}), "
                f"got {distribution.on_demand_base_capacity}: the group could never hold "
                "its on-demand base"
            )
        return self

    # -- what the controller reads ------------------------------------------------------
    @property
    def min(self) -> int:
        if self.min_size is not None:
            return self.min_size
        return self.desired_capacity if self.desired_capacity is not None else DEFAULT_NODE_COUNT

    @property
    def max(self) -> int:
        if self.max_size is not None:
            return self.max_size
        return self.desired_capacity if self.desired_capacity is not None else self.min

    @property
    def desired(self) -> int:
        return self.desired_capacity if self.desired_capacity is not None else self.min

    @property
    def instance_types(self) -> tuple[str, ...]:
        """The group's types in order of preference (first listed first)."""
        if self.instances_distribution is not None:
            return tuple(self.instances_distribution.instance_types)
        assert self.instance_type is not None  # guaranteed by _consistent
        return (self.instance_type,)

    @property
    def on_demand_base(self) -> int:
        d = self.instances_distribution
        return 0 if d is None else d.on_demand_base_capacity

    @property
    def on_demand_percentage(self) -> int:
        d = self.instances_distribution
        return 100 if d is None else d.on_demand_percentage_above_base_capacity

    @property
    def spot_allocation_strategy(self) -> SpotAllocationStrategy:
        d = self.instances_distribution
        return "lowest-price" if d is None else d.spot_allocation_strategy

    @property
    def spot_instance_pools(self) -> int:
        d = self.instances_distribution
        if d is None or d.spot_instance_pools is None:
            return DEFAULT_SPOT_POOLS
        return d.spot_instance_pools

    @property
    def max_price(self) -> float | None:
        d = self.instances_distribution
        return None if d is None else d.max_price

    @property
    def capacity_rebalance(self) -> bool:
        d = self.instances_distribution
        return d is not None and d.capacity_rebalance

    @property
    def zones(self) -> tuple[str, ...] | None:
        """The zones the group may use; None means every zone of the region."""
        return None if self.availability_zones is None else tuple(self.availability_zones)

    def node_labels(self) -> dict[str, str]:
        """Labels every node of the group gets: the group's own plus ``NODEGROUP_LABEL``."""
        return {**self.labels, NODEGROUP_LABEL: self.name}

    def node_taints(self) -> tuple[Taint, ...]:
        return tuple(t.to_taint() for t in self.taints)


def check_nodegroup(
    group: NodeGroup,
    *,
    zones: Sequence[str] | None = None,
    catalog: CatalogLike | None = None,
    prefix: tuple[str | int, ...] = (),
) -> list[Problem]:
    """Checks that need context: instance types in the catalog, zones of the scenario."""
    problems: list[Problem] = []
    if catalog is not None:
        named: list[tuple[str | int, str]]
        if group.instances_distribution is not None:
            at: tuple[str | int, ...] = (*prefix, "instancesDistribution", "instanceTypes")
            named = list(enumerate(group.instances_distribution.instance_types))
        else:
            at, named = prefix, [("instanceType", group.instance_type or "")]
        for key, name in named:
            if name not in catalog:
                problems.append(
                    Problem(format_path([*at, key]), unknown_instance_type(name, catalog))
                )
    if zones is not None:
        for index, zone in enumerate(group.availability_zones or ()):
            if zone not in zones:
                path = format_path([*prefix, "availabilityZones", index])
                problems.append(Problem(path, unknown_zone(zone, zones)))
    return problems


def parse_nodegroup(
    data: Any,
    *,
    source: str,
    zones: Sequence[str] | None = None,
    catalog: CatalogLike | None = None,
) -> NodeGroup:
    """Validate and check one eksctl nodeGroup item; raises ``ScenarioError`` listing problems."""
    if not isinstance(data, dict):
        message = f"expected a nodeGroup mapping (name, minSize, ...), got {show(data)}"
        raise ScenarioError(source, [Problem("", message)])
    try:
        group = NodeGroup.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(source, problems_from_validation(exc, data, NodeGroup)) from None
    problems = check_nodegroup(group, zones=zones, catalog=catalog)
    if problems:
        raise ScenarioError(source, problems)
    return group


def parse_cluster_config(
    data: Any,
    *,
    source: str,
    zones: Sequence[str] | None = None,
    catalog: CatalogLike | None = None,
) -> list[NodeGroup]:
    """The ``nodeGroups`` of an eksctl ClusterConfig; everything else in it is not ours.

    Every problem of every group is collected before raising one ``ScenarioError``.
    ``managedNodeGroups`` are EKS's to run and are left alone.
    """
    if not isinstance(data, dict) or data.get("kind") != "ClusterConfig":
        what = "an empty file" if data is None else show(data)
        message = f"expected an eksctl ClusterConfig (kind: ClusterConfig), got {what}"
        raise ScenarioError(source, [Problem("", message)])
    items = data.get("nodeGroups")
    if not isinstance(items, list) or not items:
        message = f"expected a list of at least one node group, got {show(items)}"
        raise ScenarioError(source, [Problem("nodeGroups", message)])
    groups: list[NodeGroup] = []
    problems: list[Problem] = []
    for index, item in enumerate(items):
        prefix: tuple[str | int, ...] = ("nodeGroups", index)
        if not isinstance(item, dict):
            message = f"expected a nodeGroup mapping (name, minSize, ...), got {show(item)}"
            problems.append(Problem(format_path(prefix), message))
            continue
        try:
            group = NodeGroup.model_validate(item)
        except ValidationError as exc:
            problems += problems_from_validation(exc, item, NodeGroup, prefix)
            continue
        problems += check_nodegroup(group, zones=zones, catalog=catalog, prefix=prefix)
        if group.name in {g.name for g in groups}:
            message = f"expected a name no other node group has, got {show(group.name)}"
            problems.append(Problem(format_path([*prefix, "name"]), message))
        groups.append(group)
    if problems:
        raise ScenarioError(source, problems)
    return groups


def load_nodegroup_files(
    paths: Iterable[Path], *, catalog: CatalogLike | None = None
) -> list[NodeGroup]:
    """The node groups of eksctl ClusterConfig files; names must be unique across them."""
    groups: list[NodeGroup] = []
    for path in paths:
        found = parse_cluster_config(read_yaml(path), source=str(path), catalog=catalog)
        seen = {g.name for g in groups}
        for group in found:
            if group.name in seen:
                message = f"expected a name no other file's node group has, got {show(group.name)}"
                raise ScenarioError(str(path), [Problem("nodeGroups", message)])
        groups += found
    return groups
