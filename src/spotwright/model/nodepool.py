"""Karpenter's ``karpenter.sh/v1`` NodePool, as spotwright reads it.

Users already have NodePools, so spotwright accepts them unchanged (and under its own
``spotwright.io/v1alpha1`` group) rather than inventing a format. The models mirror
Karpenter's schema and its CEL rules; ``check_nodepool`` adds the checks that need
context (the scenario's zones, the instance-type catalog). The helper methods hand the
provisioner what it consumes: requirements as ``NodeSelectorRequirement`` tuples with
template labels folded in exactly as Karpenter folds them, taints, and limits.

The shared building blocks for Kubernetes-shaped YAML (the strict base model, label keys,
quantities, taints and requirements) live here too, because the NodePool is where they
first appear; ``workloads`` imports them.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal, Protocol

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from spotwright.model import labels as wk
from spotwright.model.durations import Duration, DurationOrNever
from spotwright.model.errors import Problem, format_path, show
from spotwright.model.objects import NodeSelectorRequirement, Taint
from spotwright.model.resources import Resources, parse_cpu, parse_memory, parse_quantity

__all__ = [
    "UNLIMITED",
    "Budget",
    "CatalogLike",
    "ConfigModel",
    "Disruption",
    "Limits",
    "NodePool",
    "NodePoolSpec",
    "RequirementSpec",
    "TaintSpec",
    "check_nodepool",
    "check_requirement",
]

#: The value ``NodePool.limits()`` puts in a dimension the NodePool does not limit.
UNLIMITED = 2**62


class CatalogLike(Protocol):
    """What configuration checks need from the instance-type catalog: names only."""

    def __contains__(self, name: object, /) -> bool: ...

    def names(self) -> Iterable[str]: ...


class ConfigModel(BaseModel):
    """Base of every user-facing model: unknown keys are errors, keys are camelCase.

    Forbidding extras is what turns a typo such as ``limts`` into an error instead of a
    silently ignored limit; models that mirror third-party manifests relax it locally.
    """

    model_config = ConfigDict(
        extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True
    )


class LenientModel(ConfigModel):
    """For parts of real manifests full of fields spotwright does not model."""

    model_config = ConfigDict(extra="ignore")


# ---------------------------------------------------------------------------------------
# Field types

_NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def _label_key(key: str) -> str:
    prefix, _, name = key.rpartition("/")
    if (
        not name
        or len(name) > 63
        or not _NAME_PART.match(name)
        or (prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)))
        or (not prefix and "/" in key)
    ):
        raise ValueError(f"expected a label key like app or example.com/team, got {show(key)}")
    return key


def _label_value(value: str) -> str:
    if value and (len(value) > 63 or not _NAME_PART.match(value)):
        raise ValueError(
            "expected a label value (at most 63 letters, digits, '-', '_' or '.', "
            f"starting and ending with a letter or digit), got {show(value)}"
        )
    return value


def _object_name(value: str) -> str:
    if len(value) > 63 or not _OBJECT_NAME.match(value):
        raise ValueError(
            "expected a name of lowercase letters, digits, '-' and '.' (at most 63, "
            f"starting and ending with a letter or digit), got {show(value)}"
        )
    return value


def _quantity(parse: Any) -> Any:
    def convert(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ValueError(f"expected a Kubernetes quantity like 500m, 2 or 4Gi, got {show(value)}")
        try:
            return int(parse(value))
        except ValueError:
            raise ValueError(
                f"expected a Kubernetes quantity like 500m, 2 or 4Gi, got {show(value)}"
            ) from None

    return convert


def _whole(value: Any) -> int:
    quantity = parse_quantity(value)
    if quantity != quantity.to_integral_value():
        raise ValueError(f"expected a whole number, got {show(value)}")
    return int(quantity)


def _text_or_int(value: object) -> object:
    # Requirement values are strings in Kubernetes, but ``values: [4]`` is an obvious intent.
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


LabelKey = Annotated[str, AfterValidator(_label_key)]
LabelValue = Annotated[str, AfterValidator(_label_value)]
Labels = dict[LabelKey, LabelValue]
ObjectName = Annotated[str, AfterValidator(_object_name)]
#: CPU in millicores, parsed from ``500m``/``2``/``1.5``.
Cpu = Annotated[int, BeforeValidator(_quantity(parse_cpu))]
#: Memory in bytes, parsed from ``4Gi``/``512Mi``/``1e9``.
Memory = Annotated[int, BeforeValidator(_quantity(parse_memory))]
#: A whole count written as a quantity (``nvidia.com/gpu: 1``, ``nodes: "10"``).
Whole = Annotated[int, BeforeValidator(_quantity(_whole))]
StrictInt = Annotated[int, Strict()]
RequirementValue = Annotated[str, BeforeValidator(_text_or_int)]


# ---------------------------------------------------------------------------------------
# Taints and requirements (shared with workloads)

Effect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
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

    def to_requirement(self) -> NodeSelectorRequirement:
        """Canonical form: aliased keys mapped, ``Gte n``/``Lte n`` as ``Gt n-1``/``Lt n+1``.

        The scheduler then only knows the six Kubernetes operators, and integer values
        make the rewrite exact.
        """
        key = wk.ALIASES.get(self.key, self.key)
        if self.operator in ("Gte", "Lte"):
            bound = int(self.values[0])
            operator: Literal["Gt", "Lt"] = "Gt" if self.operator == "Gte" else "Lt"
            shifted = bound - 1 if self.operator == "Gte" else bound + 1
            return NodeSelectorRequirement(key, operator, (str(shifted),), self.min_values)
        return NodeSelectorRequirement(key, self.operator, tuple(self.values), self.min_values)


_INTEGER = re.compile(r"^-?[0-9]+$")


class RequirementLike(Protocol):
    """The shape NodePool requirements and pod affinity expressions share."""

    @property
    def key(self) -> str: ...
    @property
    def operator(self) -> str: ...
    @property
    def values(self) -> list[str]: ...


def check_requirement(
    req: RequirementLike,
    path: tuple[str | int, ...],
    *,
    zones: Sequence[str] | None = None,
    catalog: CatalogLike | None = None,
) -> list[Problem]:
    """Kubernetes' and Karpenter's rules for one requirement, plus values spotwright can check.

    Used for NodePool requirements and for pods' node affinity, which share the shape.
    """
    problems: list[Problem] = []
    op: str = req.operator
    values: list[str] = list(req.values)
    key = wk.ALIASES.get(req.key, req.key)
    at_values = format_path([*path, "values"])
    if op in ("In", "NotIn") and not values:
        problems.append(Problem(at_values, f"expected at least one value for {op}, got none"))
    if op in ("Exists", "DoesNotExist") and values:
        problems.append(Problem(at_values, f"expected no values for {op}, got {show(values)}"))
    if op in ("Gt", "Lt", "Gte", "Lte") and (len(values) != 1 or not _INTEGER.match(values[0])):
        problems.append(
            Problem(at_values, f"expected exactly one integer value for {op}, got {show(values)}")
        )
    min_values = getattr(req, "min_values", None)
    if min_values is not None and op == "In" and len(values) < min_values:
        problems.append(
            Problem(
                format_path([*path, "minValues"]),
                f"expected at most as many as the {len(values)} value(s) listed, got {min_values}",
            )
        )
    if op not in ("In", "NotIn"):
        return problems
    for index, value in enumerate(values):
        at = format_path([*path, "values", index])
        if key == wk.CAPACITY_TYPE and value not in wk.CAPACITY_TYPES:
            expected = ", ".join(sorted(wk.CAPACITY_TYPES))
            problems.append(Problem(at, f"expected a capacity type ({expected}), got {show(value)}"))
        elif key == wk.ZONE and zones is not None and value not in zones:
            problems.append(
                Problem(at, f"expected one of the scenario's zones ({', '.join(zones)}), got {show(value)}")
            )
        elif key == wk.INSTANCE_TYPE and catalog is not None and value not in catalog:
            problems.append(Problem(at, unknown_instance_type(value, catalog)))
        elif key == wk.INSTANCE_FAMILY and catalog is not None:
            families = {name.partition(".")[0] for name in catalog.names()}
            if value not in families:
                problems.append(Problem(at, _unknown("instance family", value, families)))
    return problems


def unknown_instance_type(name: str, catalog: CatalogLike) -> str:
    """The message for a type the catalog lacks, with the closest names as suggestions."""
    return _unknown("instance type", name, catalog.names())


def _unknown(what: str, value: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(value, list(known), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"expected an {what} from the catalog, got unknown {what} {show(value)}{hint}"


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
    """Accepted for compatibility; the simulated and EC2 worlds use one implicit class."""

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
    cpu: Cpu | None = None
    memory: Memory | None = None
    nodes: Whole | None = None
    nvidia_gpu: Whole | None = Field(default=None, alias="nvidia.com/gpu")


_CRON_MACROS = frozenset(
    {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
)
_BUDGET_NODES = re.compile(r"^((100|[0-9]{1,2})%|[0-9]+)$")


class Budget(ConfigModel):
    """A disruption budget: how many nodes voluntary disruption may take at once."""

    nodes: Annotated[str, BeforeValidator(_text_or_int)] = "10%"
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


class ObjectMeta(LenientModel):
    """Object metadata; server-written fields (uid, resourceVersion...) are ignored."""

    name: ObjectName
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


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

        Dimensions the pool does not limit (and ``pods``/``ephemeral`` always) hold
        ``UNLIMITED``, so ``(in_use + new).fits_in(limits)`` is the whole check.
        """
        limits = self.spec.limits
        if limits is None or (limits.cpu, limits.memory, limits.nvidia_gpu) == (None,) * 3:
            return None
        return Resources(
            cpu=UNLIMITED if limits.cpu is None else limits.cpu,
            memory=UNLIMITED if limits.memory is None else limits.memory,
            gpu=UNLIMITED if limits.nvidia_gpu is None else limits.nvidia_gpu,
            pods=UNLIMITED,
            ephemeral=UNLIMITED,
        )

    def node_limit(self) -> int | None:
        """The most nodes the pool may have at once (``spec.limits.nodes``), if limited."""
        return None if self.spec.limits is None else self.spec.limits.nodes


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
            problems.append(Problem(at, f"expected a label key spotwright may set, got {show(key)}: {reason}"))
    for index, req in enumerate(pool.spec.template.spec.requirements):
        path = (*template, "spec", "requirements", index)
        reason = _restricted_key(req.key)
        if reason:
            problems.append(
                Problem(format_path([*path, "key"]), f"expected a well-known or custom label key, got {show(req.key)}: {reason}")
            )
        problems.extend(check_requirement(req, path, zones=zones, catalog=catalog))
    return problems
