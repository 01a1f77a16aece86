"""The NodeClaim custom resource (``spotwright.io/v1alpha1``), as stored in the API server.

Inside the controllers a claim is the ``model.objects.NodeClaim`` dataclass; on a live
cluster it must survive the controller (a restart, a leader change), so it is persisted as
a custom resource shaped like Karpenter's NodeClaim: the request in ``spec`` (requirements,
candidate instance types, resource requests, taints) and the launch result in ``status``
(provider ID, the chosen offering, allocatable, the node, and conditions Launched,
Registered, Initialized, Ready and Terminating). Deletion is the API's own: the
``spotwright.io/termination`` finalizer keeps a deleted claim until its instance is gone.

This model is the single source of the CRD's schema (``model.crds``) and of the
adapter's parsing, so the two cannot disagree. Quantities are written as Kubernetes
quantities and parsed to integers, like every other resource list in spotwright.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from spotwright.model.fields import (
    ConfigModel,
    Cpu,
    LenientModel,
    Memory,
    ObjectMeta,
    StrictInt,
    Whole,
)
from spotwright.model.nodepool import NodeClassRef, RequirementSpec, TaintSpec

__all__ = [
    "FINALIZER",
    "Condition",
    "NodeClaimResource",
    "NodeClaimSpec",
    "NodeClaimStatus",
    "ResourceQuantities",
]

#: Keeps a deleted NodeClaim until the termination controller has terminated its instance.
FINALIZER = "spotwright.io/termination"

#: ``metav1.Condition.reason``: CamelCase-ish, as the API convention requires (or empty).
REASON_PATTERN = r"^([A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?)?$"
#: RFC 3339 date-time (with optional fraction), as ``metav1.Time`` and ``MicroTime`` render.
TIME_PATTERN = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}"
    r"(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})$"
)


class Condition(ConfigModel):
    """A status condition, shaped as ``metav1.Condition`` so ``kubectl wait`` understands it."""

    type: str = Field(min_length=1, max_length=316)
    status: Literal["True", "False", "Unknown"]
    last_transition_time: str = Field(pattern=TIME_PATTERN)
    reason: str = Field(default="", max_length=1024, pattern=REASON_PATTERN)
    message: str = Field(default="", max_length=32768)
    observed_generation: StrictInt | None = Field(default=None, ge=0)


class ResourceQuantities(ConfigModel):
    """The resources a claim asks for or its instance offers, as Kubernetes quantities."""

    cpu: Cpu | None = None
    memory: Memory | None = None
    pods: Whole | None = None
    nvidia_gpu: Whole | None = Field(default=None, alias="nvidia.com/gpu")
    ephemeral_storage: Memory | None = Field(default=None, alias="ephemeral-storage")


class ResourceRequests(ConfigModel):
    requests: ResourceQuantities = Field(default_factory=ResourceQuantities)


class NodeClaimSpec(ConfigModel):
    """What to launch: immutable once written, like Karpenter's NodeClaim spec."""

    #: The NodePool the claim was made for (also the ``karpenter.sh/nodepool`` label).
    node_pool: str = Field(min_length=1, max_length=253)
    requirements: list[RequirementSpec] = Field(default_factory=list, max_length=100)
    #: Candidate instance types, cheapest first; the launch picks among them.
    instance_types: list[str] = Field(default_factory=list, max_length=600)
    resources: ResourceRequests = Field(default_factory=ResourceRequests)
    taints: list[TaintSpec] = Field(default_factory=list)
    #: Put on the node at registration and removed by an agent; the claim is initialized
    #: once they are gone.
    startup_taints: list[TaintSpec] = Field(default_factory=list)
    #: The EC2NodeClass the instance is launched with (its NodePool's ``nodeClassRef``).
    node_class_ref: NodeClassRef | None = None


class NodeClaimStatus(LenientModel):
    """What happened: the instance launched for the claim and how far it got."""

    provider_id: str = Field(default="", alias="providerID")
    instance_type: str = ""
    zone: str = ""
    capacity_type: str = ""
    #: Hourly price of the offering launched, in USD.
    price: float | None = Field(default=None, ge=0)
    allocatable: ResourceQuantities | None = None
    node_name: str = ""
    #: When the drain must be finished (an interruption's deadline), RFC 3339.
    drain_deadline: str | None = Field(default=None, pattern=TIME_PATTERN)
    #: Why the claim is being deleted (``spot_interruption``, ``registration_timeout``...).
    deletion_reason: str = ""
    conditions: list[Condition] = Field(default_factory=list)


class NodeClaimResource(LenientModel):
    """A whole NodeClaim object; server-written metadata is ignored."""

    api_version: Literal["spotwright.io/v1alpha1"] = "spotwright.io/v1alpha1"
    kind: Literal["NodeClaim"] = "NodeClaim"
    metadata: ObjectMeta
    spec: NodeClaimSpec
    status: NodeClaimStatus = Field(default_factory=NodeClaimStatus)
