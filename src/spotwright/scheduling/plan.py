"""The scheduler's inputs and outputs as plain records.

The provisioner builds ``NodePoolTemplate`` and ``ExistingCapacity`` from cluster state and
turns each ``ClaimPlan`` into a NodeClaim; the scheduler never sees the cluster itself,
which keeps it synchronous, deterministic and easy to test with hand-made inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from spotwright.model.objects import NodeSelectorRequirement, Pod, Taint
from spotwright.model.resources import Resources

__all__ = ["ClaimPlan", "ExistingCapacity", "NodePoolTemplate", "Plan"]


@dataclass(frozen=True)
class NodePoolTemplate:
    """What a NodePool lets the scheduler create, and how much it still may.

    ``remaining`` is the capacity (allocatable) left under ``spec.limits``, on every
    dimension (cpu, memory, GPUs, pods, ephemeral storage; one the pool does not limit
    holds a huge value such as ``model.nodepool.UNLIMITED``); None means no limit.
    ``nodes_remaining`` bounds how many new claims may be opened.
    """

    name: str
    weight: int = 0
    requirements: tuple[NodeSelectorRequirement, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    remaining: Resources | None = None
    nodes_remaining: int | None = None
    #: Placed on new nodes at registration and removed by an agent later: pods need not
    #: tolerate them, so the scheduler never looks at them; they ride along to the claim.
    startup_taints: tuple[Taint, ...] = ()


@dataclass
class ExistingCapacity:
    """A node, or a claim launched but not yet a ready node, that pods may still use.

    ``free`` is allocatable minus the requests of pods bound to it. ``pods`` are those
    bound pods, needed only so topology spread and pod (anti-)affinity can count them.
    """

    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...] = ()
    free: Resources = field(default_factory=Resources)
    in_flight: bool = False
    instance_type: str | None = None
    pods: tuple[Pod, ...] = ()


@dataclass
class ClaimPlan:
    """One node to create: its pods, and every instance type that can hold them.

    ``instance_types`` is ordered by the cheapest available offering; ``requirements``
    is narrowed (instance types, capacity types and, where the pods chose one, zones).
    """

    nodepool: str
    pods: list[Pod]
    requests: Resources
    instance_types: tuple[str, ...]
    requirements: tuple[NodeSelectorRequirement, ...]
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    #: The cheapest available offering's hourly price for the first instance type.
    price: float = 0.0
    startup_taints: tuple[Taint, ...] = ()


@dataclass
class Plan:
    """Where every pod goes: existing capacity, a new claim, or nowhere (with a reason)."""

    existing: dict[str, str] = field(default_factory=dict)
    new_claims: list[ClaimPlan] = field(default_factory=list)
    unschedulable: dict[str, str] = field(default_factory=dict)

    @property
    def cost_per_hour(self) -> float:
        return sum(c.price for c in self.new_claims)
