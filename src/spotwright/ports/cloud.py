"""The cloud port: what the provisioner and the termination controller need from EC2.

Availability is data: ``offerings()`` lists every (type, zone, capacity type) with its price
and whether it can be launched now. Launch errors are classified into the two kinds the
provisioner acts on: an offering that is out of capacity, and a whole capacity type that
is closed (quota).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from spotwright.catalog._types import InstanceType
from spotwright.model.kubelet import KubeletConfiguration
from spotwright.model.objects import Taint

__all__ = [
    "Cloud",
    "CloudError",
    "Instance",
    "InsufficientCapacityError",
    "LaunchRequest",
    "NodeClassResolver",
    "NodeClassState",
    "Offering",
    "OfferingError",
    "QuotaExceededError",
    "node_class_state",
]


@dataclass(frozen=True, slots=True)
class Offering:
    instance_type: str
    zone: str
    capacity_type: str
    price: float
    available: bool = True

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.capacity_type, self.instance_type, self.zone)


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    """One instance wanted, for one node claim.

    ``offerings`` are the acceptable (type, zone) pairs of a single capacity type, in the
    claim's preference order (cheapest first); the cloud picks among them with its own
    allocation strategy, as CreateFleet does with its overrides.
    """

    node_claim: str
    nodepool: str
    capacity_type: str
    offerings: tuple[Offering, ...]
    tags: tuple[tuple[str, str], ...] = ()
    #: The node class (EC2NodeClass) the claim's NodePool names: how to launch (subnets,
    #: security groups, AMI, role, tags...). None: the cloud's own defaults.
    node_class: str | None = None
    #: What the node must register with, so it never joins without them: its labels
    #: (the NodePool's, capacity type...) and taints (startup taints included).
    labels: tuple[tuple[str, str], ...] = ()
    taints: tuple[Taint, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeClassState:
    """What a node class allows, as data the provisioner folds into a NodePool's template.

    ``zones`` are those of the class's subnets and ``architectures`` those of its images
    (None: no restriction). A class that cannot launch at all (no subnet matches its
    selectors, no image, a missing role) says why in ``problem``; its NodePools are left
    out of scheduling and their pods stay pending with that reason.
    """

    name: str | None
    zones: frozenset[str] | None = None
    architectures: frozenset[str] | None = None
    problem: str = ""
    #: The class's kubelet block: its nodes offer pods what it leaves (``model.kubelet``).
    kubelet: KubeletConfiguration | None = None

    @property
    def ready(self) -> bool:
        return not self.problem


@dataclass(slots=True)
class Instance:
    id: str
    instance_type: str
    zone: str
    capacity_type: str
    price: float
    launched_at: float
    private_dns: str = ""
    state: str = "pending"
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def provider_id(self) -> str:
        return f"aws:///{self.zone}/{self.id}"


class CloudError(Exception):
    """Any failure of a cloud call; ``code`` is the EC2 error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class OfferingError:
    offering: Offering
    code: str
    message: str


class InsufficientCapacityError(CloudError):
    """No offering of the request could be launched; each failed offering is listed."""

    def __init__(self, errors: Sequence[OfferingError]) -> None:
        codes = sorted({e.code for e in errors})
        super().__init__(
            codes[0] if codes else "InsufficientInstanceCapacity",
            "; ".join(f"{e.code}: {e.message}" for e in errors[:3]),
        )
        self.errors = tuple(errors)


class QuotaExceededError(CloudError):
    """A limit closed the whole capacity type (MaxSpotInstanceCountExceeded, VcpuLimitExceeded)."""

    def __init__(self, code: str, capacity_type: str, message: str) -> None:
        super().__init__(code, message)
        self.capacity_type = capacity_type


class Cloud(Protocol):
    region: str

    def instance_types(self) -> Sequence[InstanceType]: ...

    def offerings(self) -> Sequence[Offering]:
        """Every offering with its current price; unavailable ones are included, flagged."""
        ...

    async def launch(self, request: LaunchRequest) -> Instance: ...

    async def terminate(self, instance_id: str) -> None: ...

    async def describe(self, instance_ids: Sequence[str]) -> list[Instance]: ...

    async def list_owned(self) -> list[Instance]:
        """Live instances tagged as launched by this cluster, for garbage collection."""
        ...


@runtime_checkable
class NodeClassResolver(Protocol):
    """A cloud whose launches depend on node classes (EC2 does; the simulated worlds may)."""

    async def node_class(self, name: str | None) -> NodeClassState:
        """The class's state, resolved (and cached) by the cloud; None: its defaults."""
        ...


async def node_class_state(cloud: object, name: str | None) -> NodeClassState:
    """``cloud.node_class(name)`` for a cloud that resolves classes; unrestricted otherwise."""
    if isinstance(cloud, NodeClassResolver):
        return await cloud.node_class(name)
    return NodeClassState(name)
