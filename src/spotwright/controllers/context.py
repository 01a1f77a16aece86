"""What every controller is handed: the ports, the shared caches and the settings.

Controllers get the world only through this object, which is how the same code runs live,
against a test cluster, and in the simulator.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from spotwright.catalog import InstanceType
from spotwright.controllers.unavailable import UnavailableOfferings
from spotwright.model.objects import NodeSelectorRequirement, Taint
from spotwright.model.resources import Resources
from spotwright.observability.metrics import Metrics
from spotwright.ports.clock import Clock
from spotwright.ports.cloud import Cloud
from spotwright.ports.cluster import Cluster

__all__ = ["Context", "NodePoolSource", "Settings"]


class NodePoolSource(Protocol):
    """The parts of a NodePool the controllers read (the pydantic model provides them)."""

    @property
    def name(self) -> str: ...

    @property
    def weight(self) -> int: ...

    def requirements(self) -> tuple[NodeSelectorRequirement, ...]: ...

    def labels(self) -> dict[str, str]: ...

    def taints(self) -> tuple[Taint, ...]: ...

    def startup_taints(self) -> tuple[Taint, ...]: ...

    def limits(self) -> Resources | None: ...

    def node_limit(self) -> int | None: ...

    @property
    def node_class(self) -> str | None:
        """The node class the pool's ``nodeClassRef`` names, if any."""
        ...


@dataclass(frozen=True, slots=True)
class Settings:
    batch_idle_seconds: float = 1.0
    batch_max_seconds: float = 10.0
    #: How long a failed offering or closed capacity type is avoided.
    unavailable_ttl_seconds: float = 180.0
    #: Karpenter re-triggers provisioning for still-pending pods this often.
    pending_retry_seconds: float = 10.0
    #: At most this many instance types go into one launch request.
    max_instance_types: int = 60
    #: A claim not launched this long after its creation is given up (Karpenter: 5m).
    launch_timeout_seconds: float = 300.0
    #: A launched claim whose node has not registered by then is given up (Karpenter: 15m).
    registration_timeout_seconds: float = 900.0
    #: How often instances without a claim are looked for, and how old they must be.
    garbage_collection_interval_seconds: float = 120.0
    garbage_collection_grace_seconds: float = 60.0
    interruption_workers: int = 10
    #: Plan provisioning rounds in a worker thread (live); the simulator plans inline so
    #: that virtual time stands still while it plans.
    plan_in_thread: bool = False
    #: Interruption messages in their urgent step (the node's taint) at once, each in its
    #: own task; a worker receives more only while a slot is free.
    interruption_concurrency: int = 100
    #: A message is kept in flight this long at a time (renewed every third of it) until
    #: its action is over; after a crash it is delivered again within this time.
    message_visibility_seconds: float = 60.0
    #: What a rebalance recommendation gets: nothing, a cordon, or a replacement first and
    #: a drain once the replacement is ready (the values of ``ActionPolicy``).
    rebalance_action: Literal["none", "cordon", "replace-then-drain"] = "replace-then-drain"
    #: replace-then-drain drains anyway after this long without the replacement ready.
    replacement_wait_seconds: float = 600.0
    #: At an interruption deadline, delete what is left rather than leave it to die.
    force_at_deadline: bool = True
    eviction_backoff_min: float = 0.1
    eviction_backoff_max: float = 10.0
    #: Evictions and pod deletions in flight at once across all drains, so that a storm of
    #: drains never takes every connection to the API server from taints and claim writes.
    eviction_concurrency: int = 50


@dataclass
class Context:
    cluster: Cluster
    cloud: Cloud
    clock: Clock
    metrics: Metrics
    nodepools: Sequence[NodePoolSource]
    instance_types: Mapping[str, InstanceType]
    settings: Settings = field(default_factory=Settings)
    unavailable: UnavailableOfferings = field(default_factory=UnavailableOfferings)
    #: The configured node groups: their instances carry the group's name where a NodePool's
    #: would be (``karpenter.sh/nodepool``), so they are this cluster's too.
    nodegroup_names: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.unavailable.ttl = self.settings.unavailable_ttl_seconds
