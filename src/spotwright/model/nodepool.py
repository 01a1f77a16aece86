"""Karpenter's ``karpenter.sh/v1`` NodePool, as spotwright reads it.

Users already have NodePools, so spotwright accepts them unchanged (and under its own
``spotwright.io/v1alpha1`` group) rather than inventing a format. The models mirror
Karpenter's schema and its CEL rules; ``check_nodepool`` adds the checks that need
context (the scenario's zones, the instance-type catalog). The helper methods hand the
provisioner what it consumes: requirements as ``NodeSelectorRequirement`` tuples with
template labels folded in exactly as Karpenter folds them, taints, and limits.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import (
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from spotwright.model import labels as wk
from spotwright.model.durations import Duration, DurationOrNever
from spotwright.model.errors import (
    Problem,
    ScenarioError,
    format_path,
    problems_from_validation,
    show,
)
from spotwright.model.fields import (
    CatalogLike,
    ConfigModel,
    Cpu,
    Effect,
    LabelKey,
    Labels,
    LabelValue,
    Memory,
    ObjectMeta,
    RequirementValue,
    StrictInt,
    Whole,
    check_operator_values,
    unknown_family,
    unknown_instance_type,
    unknown_zone,
)
from spotwright.model.objects import NodeSelectorRequirement, Operator, Taint
from spotwright.model.resources import Resources

__all__ = [
    "UNLIMITED",
    "Budget",
    "Disruption",
    "Limits",
    "NodePool",
    "NodePoolSpec",
    "RequirementSpec",
    "TaintSpec",
    "check_nodepool",
    "check_requirement",
    "parse_nodepool",
]

#: The value ``NodePool.limits()`` puts in a dimension the NodePool does not limit.
UNLIMITED = 2**62


# ---------------------------------------------------------------------------------------
# Taints and requirements (shared with workloads)

NodePoolOperator = Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Gte", "Lte"]


class TaintSpec(ConfigModel):
    key: LabelKey
    value: LabelValue = ""
    effect: Effect
    #: Written by the API server on real nodes; accepted and ignored.
    time_added: str | None = None

    def to_taint(self) -> Taint:
        return Taint(key=self.key, value=self.value, effect=self.effect)


class RequirementSpec(ConfigModel):
    """A node selector requirement; ``minValues`` is Karpenter's flexibility floor."""

    key: LabelKey
    operator: NodePoolOperator
    values: list[RequirementValue] = Field(default_factory=list)
    min_values: StrictInt | None = Field(default=None, ge=1, le=50)

    @field_validator("values")
    @classmethod
    def _values_fit_operator(cls, values: list[str], info: ValidationInfo) -> list[str]:
        operator = info.data.get("operator")
        if operator is not None:
            check_operator_values(operator, values)
        return values

    @field_validator("min_values")
    @classmethod
    def _enough_values(cls, min_values: int | None, info: ValidationInfo) -> int | None:
        listed = len(info.data.get("values") or ())
        if min_values is not None and info.data.get("operator") == "In" and listed < min_values:
            raise ValueError(f"expected at most the {listed} value(s) listed, got {min_values}")
        return min_values

    def to_requirement(self) -> NodeSelectorRequirement:
        """Canonical form: aliased keys mapped, ``Gte n``/``Lte n`` as ``Gt n-1``/``Lt n+1``.

        The scheduler then only knows the six Kubernetes operators, and integer values
        make the rewrite exact.
        """
        key = wk.ALIASES.get(self.key, self.key)
        op = self.operator
        if op == "Gte" or op == "Lte":
            bound = int(self.values[0]) + (-1 if op == "Gte" else 1)
            strict: Operator = "Gt" if op == "Gte" else "Lt"
            return NodeSelectorRequirement(key, strict, (str(bound),), self.min_values)
        return NodeSelectorRequirement(key, op, tuple(self.values), self.min_values)


def check_requirement(
    req: RequirementSpec,
    path: tuple[str | int, ...],
    *,
    zones: Sequence[str] | None = None,
    catalog: CatalogLike | None = None,
) -> list[Problem]:
    """Check a requirement's values against what exists: capacity types, zones, the catalog.

    Only ``In``/``NotIn`` values name things that must exist; the rest is validated
    when the model is built (see ``check_operator_values``).
    """
    problems: list[Problem] = []
    key = wk.ALIASES.get(req.key, req.key)
    if req.operator not in ("In", "NotIn"):
        return problems
    for index, value in enumerate(req.values):
        at = format_path([*path, "values", index])
        if key == wk.CAPACITY_TYPE and value not in wk.CAPACITY_TYPES:
            expected = ", ".join(sorted(wk.CAPACITY_TYPES))
            problems.append(
                Problem(at, f"expected a capacity type ({expected}), got {show(value)}")
            )
        elif key == wk.ZONE and zones is not None and value not in zones:
            problems.append(Problem(at, unknown_zone(value, zones)))
        elif key == wk.INSTANCE_TYPE and catalog is not None and value not in catalog:
            problems.append(Problem(at, unknown_instance_type(value, catalog)))
        elif key == wk.INSTANCE_FAMILY and catalog is not None:
            message = unknown_family(value, catalog)
            if message:
                problems.append(Problem(at, message))
    return problems


def _restricted_key(key: str) -> str | None:
    """Why a label key may not be used in a NodePool, or None if it may."""
    key = wk.ALIASES.get(key, key)
    if key in wk.WELL_KNOWN:
        return None
    if key == wk.HOSTNAME:
        return "kubernetes.io/hostname is set per node and cannot be required by a NodePool"
    domain = key.partition("/")[0] if "/" in key else ""
    if domain == "karpenter.sh" or domain.endswith(".karpenter.sh"):
        return f"the karpenter.sh domain is restricted (allowed: {wk.NODEPOOL}, {wk.CAPACITY_TYPE})"
    if domain == "karpenter.k8s.aws":
        known = sorted(k for k in wk.WELL_KNOWN if k.startswith("karpenter.k8s.aws/"))
        return f"spotwright knows only these karpenter.k8s.aws labels: {', '.join(known)}"
    return None


# ---------------------------------------------------------------------------------------
# The NodePool


class NodeClassRef(ConfigModel):
    """The EC2NodeClass whose subnets, security groups, AMI and role launch the nodes."""

    group: str = "karpenter.k8s.aws"
    kind: str = "EC2NodeClass"
    name: str


class TemplateMetadata(ConfigModel):
    labels: Labels = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class TemplateSpec(ConfigModel):
    requirements: list[RequirementSpec] = Field(default_factory=list, max_length=100)
    taints: list[TaintSpec] = Field(default_factory=list)
    startup_taints: list[TaintSpec] = Field(default_factory=list)
    node_class_ref: NodeClassRef | None = None
    #: Seconds from NodeClaim creation until it is replaced; ``inf`` for ``Never``.
    expire_after: DurationOrNever = 720 * 3600.0
    #: Longest a drain may take before pods are deleted regardless of PDBs; None: forever.
    termination_grace_period: Duration | None = None


class NodeClaimTemplate(ConfigModel):
    metadata: TemplateMetadata = Field(default_factory=TemplateMetadata)
    spec: TemplateSpec = Field(default_factory=TemplateSpec)


class Limits(ConfigModel):
    """Ceilings on what the pool's nodes have together (allocatable, as Karpenter counts)."""

    # Any resource the packer counts can be limited. Extended resources are not: no
    # instance type in the catalog offers one, so such a limit could never bind; like any
    # other unknown name it is refused at its own path rather than silently ignored.
    cpu: Cpu | None = None
    memory: Memory | None = None
    nodes: Whole | None = None
    nvidia_gpu: Whole | None = Field(default=None, alias="nvidia.com/gpu")
    pods: Whole | None = None
    ephemeral_storage: Memory | None = Field(default=None, alias="ephemeral-storage")


_CRON_MACROS = frozenset(
    {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
)
_BUDGET_NODES = re.compile(r"^((100|[0-9]{1,2})%|[0-9]+)$")


class Budget(ConfigModel):
    """A disruption budget: how many nodes voluntary disruption may take at once."""

    nodes: RequirementValue = "10%"
    schedule: str | None = None
    duration: Duration | None = None
    reasons: list[Literal["Underutilized", "Empty", "Drifted"]] | None = None

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, value: str) -> str:
        if not _BUDGET_NODES.match(value):
            raise ValueError(f"expected a node count or a percentage like 10%, got {show(value)}")
        return value

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, value: str | None) -> str | None:
        if value is not None and value not in _CRON_MACROS and len(value.split()) != 5:
            raise ValueError(f"expected a cron schedule like '0 9 * * 1-5', got {show(value)}")
        return value

    @model_validator(mode="after")
    def _together(self) -> Budget:
        if (self.schedule is None) != (self.duration is None):
            raise ValueError("expected schedule and duration to be set together, got only one")
        return self


class Disruption(ConfigModel):
    """Voluntary disruption settings: accepted and validated now, acted on by consolidation."""

    consolidation_policy: Literal["WhenEmpty", "WhenEmptyOrUnderutilized", "Balanced"] = (
        "WhenEmptyOrUnderutilized"
    )
    consolidate_after: DurationOrNever = 0.0
    budgets: list[Budget] = Field(default_factory=lambda: [Budget()], max_length=50)


class NodePoolSpec(ConfigModel):
    template: NodeClaimTemplate = Field(default_factory=NodeClaimTemplate)
    limits: Limits | None = None
    weight: StrictInt | None = Field(default=None, ge=1, le=100)
    disruption: Disruption = Field(default_factory=Disruption)


class NodePool(ConfigModel):
    """A NodePool: which instances the provisioner may launch for pods, and how many."""

    api_version: Literal["karpenter.sh/v1", "spotwright.io/v1alpha1"] = "karpenter.sh/v1"
    kind: Literal["NodePool"] = "NodePool"
    metadata: ObjectMeta
    spec: NodePoolSpec = Field(default_factory=NodePoolSpec)
    #: Present in ``kubectl get -o yaml`` output; ignored.
    status: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def weight(self) -> int:
        """Higher is tried first; an unset weight counts as 0, as in Karpenter."""
        return self.spec.weight or 0

    @property
    def expire_after(self) -> float:
        return self.spec.template.spec.expire_after

    @property
    def termination_grace_period(self) -> float | None:
        return self.spec.template.spec.termination_grace_period

    @property
    def disruption(self) -> Disruption:
        return self.spec.disruption

    def labels(self) -> dict[str, str]:
        """Labels every node of this pool gets: the template's plus ``karpenter.sh/nodepool``."""
        out = dict(self.spec.template.metadata.labels)
        out[wk.NODEPOOL] = self.name
        return out

    def requirements(self) -> tuple[NodeSelectorRequirement, ...]:
        """The pool's requirements, with each node label added as ``key In [value]``.

        Karpenter does the same when it builds a NodeClaim template, which is what lets
        a pod's ``nodeSelector: {team: a}`` steer it to the pool labelled ``team: a``.
        """
        out = [req.to_requirement() for req in self.spec.template.spec.requirements]
        for key, value in self.labels().items():
            extra = NodeSelectorRequirement(wk.ALIASES.get(key, key), "In", (value,))
            if extra not in out:
                out.append(extra)
        return tuple(out)

    def taints(self) -> tuple[Taint, ...]:
        return tuple(t.to_taint() for t in self.spec.template.spec.taints)

    def startup_taints(self) -> tuple[Taint, ...]:
        """Taints removed by a daemon after start; not considered when choosing a pool."""
        return tuple(t.to_taint() for t in self.spec.template.spec.startup_taints)

    def limits(self) -> Resources | None:
        """The resource ceiling for the pool's nodes together, or None if it has none.

        Dimensions the pool does not limit hold
        ``UNLIMITED``, so ``(in_use + new).fits_in(limits)`` is the whole check.
        """
        limits = self.spec.limits
        if limits is None:
            return None
        dims = (limits.cpu, limits.memory, limits.nvidia_gpu, limits.pods, limits.ephemeral_storage)
        if dims == (None,) * 5:
            return None
        return Resources(
            cpu=UNLIMITED if limits.cpu is None else limits.cpu,
            memory=UNLIMITED if limits.memory is None else limits.memory,
            gpu=UNLIMITED if limits.nvidia_gpu is None else limits.nvidia_gpu,
            pods=UNLIMITED if limits.pods is None else limits.pods,
            ephemeral=UNLIMITED if limits.ephemeral_storage is None else limits.ephemeral_storage,
        )

    def node_limit(self) -> int | None:
        """The most nodes the pool may have at once (``spec.limits.nodes``), if limited."""
        return None if self.spec.limits is None else self.spec.limits.nodes

    @property
    def node_class(self) -> str | None:
        """The name in ``nodeClassRef``, if the pool names a class."""
        ref = self.spec.template.spec.node_class_ref
        return ref.name if ref is not None else None


def check_nodepool(
    pool: NodePool,
    *,
    zones: Sequence[str] | None = None,
    catalog: CatalogLike | None = None,
    prefix: tuple[str | int, ...] = (),
) -> list[Problem]:
    """Checks that span fields or need context; paths are prefixed with ``prefix``.

    ``zones`` (the scenario's) and ``catalog`` are optional so a NodePool read from a live
    cluster can be checked with whatever is known.
    """
    problems: list[Problem] = []
    template = (*prefix, "spec", "template")
    for key in pool.spec.template.metadata.labels:
        reason = _restricted_key(key)
        if reason:
            at = format_path([*template, "metadata", "labels", key])
            problems.append(
                Problem(at, f"expected a label key spotwright may set, got {show(key)}: {reason}")
            )
    for index, req in enumerate(pool.spec.template.spec.requirements):
        path = (*template, "spec", "requirements", index)
        reason = _restricted_key(req.key)
        if reason:
            problems.append(
                Problem(
                    format_path([*path, "key"]),
                    f"expected a well-known or custom label key, got {show(req.key)}: {reason}",
                )
            )
        problems.extend(check_requirement(req, path, zones=zones, catalog=catalog))
    return problems


def parse_nodepool(
    data: Any,
    *,
    source: str,
    zones: Sequence[str] | None = None,
    catalog: CatalogLike | None = None,
) -> NodePool:
    """Validate and check one NodePool document; raises ``ScenarioError`` listing problems."""
    if not isinstance(data, dict):
        raise ScenarioError(source, [Problem("", f"expected a NodePool mapping, got {show(data)}")])
    try:
        pool = NodePool.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(source, problems_from_validation(exc, data, NodePool)) from None
    problems = check_nodepool(pool, zones=zones, catalog=catalog)
    if problems:
        raise ScenarioError(source, problems)
    return pool
