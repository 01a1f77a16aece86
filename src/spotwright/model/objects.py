"""The Kubernetes objects the controllers reason about, as small mutable records.

These are the shapes that cross the Cluster port. They hold only what provisioning and
draining need; the real-cluster adapter converts API objects into them and back. They are
dataclasses rather than pydantic models because the simulator creates and inspects many
thousands of them per simulated hour.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from spotwright.model.kubelet import KubeletConfiguration
from spotwright.model.resources import Resources

__all__ = [
    "Deployment",
    "Effect",
    "LabelSelector",
    "Node",
    "NodeClaim",
    "NodeSelectorRequirement",
    "Operator",
    "Pod",
    "PodAffinityTerm",
    "PodDisruptionBudget",
    "PreferredSchedulingTerm",
    "Taint",
    "Toleration",
    "TopologySpreadConstraint",
    "WeightedPodAffinityTerm",
]

Effect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
Operator = Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    effect: Effect
    value: str = ""

    def __str__(self) -> str:
        return (
            f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"
        )


@dataclass(frozen=True, slots=True)
class Toleration:
    """A pod's toleration; an empty key with operator Exists tolerates everything."""

    key: str = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = ""
    effect: Effect | None = None


@dataclass(frozen=True, slots=True)
class NodeSelectorRequirement:
    """One term of a node selector; ``min_values`` is Karpenter's flexibility floor."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()
    min_values: int | None = None


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A pod label selector: ``match_labels`` pairs AND ``match_expressions``.

    Pairs rather than a dict so the selector is hashable: the scheduler groups identical
    pods by their constraints. Expressions use In, NotIn, Exists and DoesNotExist.
    """

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[NodeSelectorRequirement, ...] = ()

    @classmethod
    def of(cls, labels: dict[str, str]) -> LabelSelector:
        return cls(match_labels=tuple(sorted(labels.items())))


@dataclass(frozen=True, slots=True)
class TopologySpreadConstraint:
    """``spec.topologySpreadConstraints[]``; ``min_domains`` only with DoNotSchedule."""

    topology_key: str
    max_skew: int = 1
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"] = "DoNotSchedule"
    selector: LabelSelector = field(default_factory=LabelSelector)
    min_domains: int | None = None


@dataclass(frozen=True, slots=True)
class PodAffinityTerm:
    """One pod (anti-)affinity term; empty ``namespaces`` means the pod's own namespace."""

    topology_key: str
    selector: LabelSelector = field(default_factory=LabelSelector)
    namespaces: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class WeightedPodAffinityTerm:
    """A preferredDuringScheduling pod (anti-)affinity term."""

    weight: int
    term: PodAffinityTerm


@dataclass(frozen=True, slots=True)
class PreferredSchedulingTerm:
    """A preferredDuringScheduling node affinity term: an AND of requirements."""

    weight: int
    requirements: tuple[NodeSelectorRequirement, ...]


@dataclass(slots=True, eq=False)
class Pod:
    """A pod as the scheduler and the drainer see it.

    ``required_affinity`` holds the OR-ed terms of requiredDuringScheduling node affinity,
    each an AND of requirements. ``owner`` names the Deployment that recreates it.
    """

    name: str
    namespace: str = "default"
    uid: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    requests: Resources = field(default_factory=Resources)
    node_selector: dict[str, str] = field(default_factory=dict)
    required_affinity: tuple[tuple[NodeSelectorRequirement, ...], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    priority: int = 0
    priority_class: str = ""
    owner: str | None = None
    daemon: bool = False
    mirror: bool = False
    grace_seconds: float = 30.0
    startup_seconds: float = 0.0
    created_at: float = 0.0
    #: ``status.startTime``: when the kubelet took the pod on (None until then, or unknown).
    started_at: float | None = None
    node_name: str | None = None
    #: Set when the scheduler tried the pod and found no node (PodScheduled=False, Unschedulable).
    unschedulable: bool = False
    ready: bool = False
    ready_at: float | None = None
    #: Set when deletion (eviction or delete) started; the pod is terminating from then on.
    deleting_since: float | None = None
    evicted: bool = False
    annotations: dict[str, str] = field(default_factory=dict)
    # Scheduling constraints beyond node selection (all optional, used by ``scheduling``).
    topology_spread: tuple[TopologySpreadConstraint, ...] = ()
    pod_affinity: tuple[PodAffinityTerm, ...] = ()
    pod_anti_affinity: tuple[PodAffinityTerm, ...] = ()
    preferred_affinity: tuple[PreferredSchedulingTerm, ...] = ()
    preferred_pod_affinity: tuple[WeightedPodAffinityTerm, ...] = ()
    preferred_pod_anti_affinity: tuple[WeightedPodAffinityTerm, ...] = ()
    #: RuntimeClass overhead, added to ``requests`` when fitting the pod.
    overhead: Resources = field(default_factory=Resources)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def terminating(self) -> bool:
        return self.deleting_since is not None


@dataclass(slots=True, eq=False)
class Node:
    name: str
    provider_id: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[Taint] = field(default_factory=list)
    unschedulable: bool = False
    allocatable: Resources = field(default_factory=Resources)
    ready: bool = False
    created_at: float = 0.0
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class NodeClaim:
    """A request for one instance: Karpenter's NodeClaim, and spotwright's unit of capacity.

    Deleting a claim (setting ``deleting_since``) is the single "terminate" signal: the
    termination controller then drains the node, terminates the instance and forgets it.
    """

    name: str
    nodepool: str
    requirements: tuple[NodeSelectorRequirement, ...] = ()
    #: Candidate instance types, cheapest first; narrowed to one at launch.
    instance_types: tuple[str, ...] = ()
    requests: Resources = field(default_factory=Resources)
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    #: Put on the node at registration, removed by an agent; pods need not tolerate them.
    startup_taints: tuple[Taint, ...] = ()
    created_at: float = 0.0
    #: The EC2NodeClass its NodePool names (how to launch it); empty: the cloud's defaults.
    node_class: str = ""
    #: That class's kubelet block: it decides what the node's pods may use.
    kubelet: KubeletConfiguration | None = None
    # status
    provider_id: str = ""
    instance_type: str = ""
    zone: str = ""
    capacity_type: str = ""
    price: float = 0.0
    allocatable: Resources | None = None
    node_name: str = ""
    launched_at: float | None = None
    registered_at: float | None = None
    initialized_at: float | None = None
    deleting_since: float | None = None
    #: When the drain must be finished (an interruption's deadline), if any.
    drain_deadline: float | None = None
    deletion_reason: str = ""


@dataclass(slots=True, eq=False)
class Deployment:
    name: str
    namespace: str = "default"
    replicas: int = 1
    template: Pod = field(default_factory=lambda: Pod(name=""))
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class PodDisruptionBudget:
    name: str
    namespace: str = "default"
    selector: dict[str, str] = field(default_factory=dict)
    min_available: int | str | None = None
    max_unavailable: int | str | None = None
