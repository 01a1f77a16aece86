"""The pod template of a workload manifest, reduced to what decides where a pod can run.

A Deployment pasted from a real repository has far more in its pod spec than spotwright
models, so these models ignore unknown fields; what they do read (resources, node
selection, tolerations, affinity, topology spread, overhead) they read strictly and turn
into the plain records of ``model.objects`` that the scheduler works on. The short
workload form shares the pieces it has (tolerations, resource lists).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from spotwright.model import labels as wk
from spotwright.model.errors import show
from spotwright.model.fields import (
    ConfigModel,
    Cpu,
    Effect,
    LabelKey,
    Labels,
    LabelValue,
    LenientModel,
    Memory,
    RequirementValue,
    StrictInt,
    Whole,
    check_operator_values,
)
from spotwright.model.objects import (
    LabelSelector,
    NodeSelectorRequirement,
    PodAffinityTerm,
    PreferredSchedulingTerm,
    Toleration,
    TopologySpreadConstraint,
    WeightedPodAffinityTerm,
)
from spotwright.model.resources import Resources, is_extended, whole

__all__ = [
    "PodSpec",
    "PodTemplate",
    "ResourceList",
    "TolerationSpec",
    "canonical_labels",
    "pod_resources",
]


def canonical_labels(labels: dict[str, str]) -> dict[str, str]:
    """Map deprecated label keys (``beta.kubernetes.io/arch``...) to their current names."""
    return {wk.ALIASES.get(k, k): v for k, v in labels.items()}


def pod_resources(requests: Resources) -> Resources:
    """A pod's requests plus the one pod slot it takes, as the kube-scheduler counts it."""
    return Resources(
        requests.cpu, requests.memory, requests.gpu, 1, requests.ephemeral, requests.extended
    )


def _larger(a: Resources, b: Resources) -> Resources:
    return a.larger(b)


class TolerationSpec(ConfigModel):
    key: str = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = ""
    effect: Effect | None = None
    #: How long a NoExecute taint is tolerated; accepted, not modelled.
    toleration_seconds: StrictInt | None = None

    @model_validator(mode="after")
    def _consistent(self) -> TolerationSpec:
        if self.operator == "Exists" and self.value:
            raise ValueError(f"expected no value with operator Exists, got {show(self.value)}")
        if not self.key and self.operator != "Exists":
            raise ValueError("expected operator Exists for a toleration without a key")
        return self

    def to_toleration(self) -> Toleration:
        return Toleration(self.key, self.operator, self.value, self.effect)


class ResourceList(ConfigModel):
    """The resources a pod can ask for that spotwright schedules on.

    Besides the named fields, any extended resource (``aws.amazon.com/neuron``,
    ``example.com/foo``) is accepted as a whole count; other names are errors.
    """

    cpu: Cpu | None = None
    memory: Memory | None = None
    nvidia_gpu: Whole | None = Field(default=None, alias="nvidia.com/gpu")
    ephemeral_storage: Memory | None = Field(default=None, alias="ephemeral-storage")

    _extended: dict[str, int] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _split_extended(cls, data: Any, handler: ModelWrapValidatorHandler[ResourceList]) -> Any:
        """Extended resources have open-ended names, so they are set aside before the
        fields are validated (any other unknown name stays an error at its own path)."""
        extended: dict[str, int] = {}
        if isinstance(data, dict) and any(isinstance(k, str) and is_extended(k) for k in data):
            extended = {k: whole(k, v) for k, v in data.items() if is_extended(k)}
            data = {k: v for k, v in data.items() if k not in extended}
        model = handler(data)
        if extended:
            model._extended.update(extended)
        return model

    def extended(self) -> dict[str, int]:
        return self._extended

    def to_resources(self, defaults: ResourceList | None = None) -> Resources:
        """Each unset dimension falls back to ``defaults`` (a container's limits)."""

        def pick(name: str) -> int:
            own = getattr(self, name)
            if own is None and defaults is not None:
                own = getattr(defaults, name)
            return int(own or 0)

        extended = (defaults.extended() if defaults is not None else {}) | self.extended()
        return Resources(
            cpu=pick("cpu"),
            memory=pick("memory"),
            gpu=pick("nvidia_gpu"),
            ephemeral=pick("ephemeral_storage"),
            extended=tuple(sorted((k, n) for k, n in extended.items() if n)),
        )


class ContainerResources(LenientModel):
    requests: ResourceList | None = None
    limits: ResourceList | None = None

    def effective_requests(self) -> Resources:
        """Kubernetes defaults a container's unset requests to its limits."""
        requests = self.requests or ResourceList()
        return requests.to_resources(defaults=self.limits)


class Container(LenientModel):
    name: str = ""
    resources: ContainerResources = Field(default_factory=ContainerResources)
    #: ``Always`` on an init container makes it a sidecar that runs alongside the pod.
    restart_policy: str | None = None


# ---------------------------------------------------------------------------------------
# Node affinity


class MatchExpression(ConfigModel):
    key: LabelKey
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[RequirementValue] = Field(default_factory=list)

    @field_validator("values")
    @classmethod
    def _values_fit_operator(cls, values: list[str], info: ValidationInfo) -> list[str]:
        operator = info.data.get("operator")
        if operator is not None:
            check_operator_values(operator, values)
        return values

    def to_requirement(self) -> NodeSelectorRequirement:
        key = wk.ALIASES.get(self.key, self.key)
        return NodeSelectorRequirement(key, self.operator, tuple(self.values))


class NodeSelectorTerm(ConfigModel):
    match_expressions: list[MatchExpression] = Field(default_factory=list)

    def to_requirements(self) -> tuple[NodeSelectorRequirement, ...]:
        return tuple(expr.to_requirement() for expr in self.match_expressions)


class NodeSelector(ConfigModel):
    node_selector_terms: list[NodeSelectorTerm] = Field(min_length=1)


class PreferredTerm(ConfigModel):
    weight: StrictInt = Field(ge=1, le=100)
    preference: NodeSelectorTerm


class NodeAffinity(ConfigModel):
    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    preferred_during_scheduling_ignored_during_execution: list[PreferredTerm] = Field(
        default_factory=list
    )


# ---------------------------------------------------------------------------------------
# Pod (anti-)affinity and topology spread


class SelectorExpression(ConfigModel):
    key: LabelKey
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[LabelValue] = Field(default_factory=list)

    @field_validator("values")
    @classmethod
    def _values_fit_operator(cls, values: list[str], info: ValidationInfo) -> list[str]:
        operator = info.data.get("operator")
        if operator is not None:
            check_operator_values(operator, values)
        return values


class PodLabelSelector(ConfigModel):
    """A label selector over pods; ``{}`` selects every pod, as in Kubernetes."""

    match_labels: Labels = Field(default_factory=dict)
    match_expressions: list[SelectorExpression] = Field(default_factory=list)

    def to_selector(self) -> LabelSelector:
        return LabelSelector(
            match_labels=tuple(sorted(self.match_labels.items())),
            match_expressions=tuple(
                NodeSelectorRequirement(e.key, e.operator, tuple(e.values))
                for e in self.match_expressions
            ),
        )


class PodAffinityTermSpec(LenientModel):
    """``namespaceSelector`` and ``matchLabelKeys`` are ignored."""

    topology_key: LabelKey
    label_selector: PodLabelSelector | None = None
    namespaces: list[str] = Field(default_factory=list)

    def to_term(self) -> PodAffinityTerm | None:
        # A term without a selector matches no pod, so it constrains nothing.
        if self.label_selector is None:
            return None
        selector = self.label_selector.to_selector()
        return PodAffinityTerm(self.topology_key, selector, tuple(self.namespaces))


class WeightedTermSpec(ConfigModel):
    weight: StrictInt = Field(ge=1, le=100)
    pod_affinity_term: PodAffinityTermSpec


class PodAffinitySpec(ConfigModel):
    required_during_scheduling_ignored_during_execution: list[PodAffinityTermSpec] = Field(
        default_factory=list
    )
    preferred_during_scheduling_ignored_during_execution: list[WeightedTermSpec] = Field(
        default_factory=list
    )

    def required(self) -> tuple[PodAffinityTerm, ...]:
        terms = (t.to_term() for t in self.required_during_scheduling_ignored_during_execution)
        return tuple(t for t in terms if t is not None)

    def preferred(self) -> tuple[WeightedPodAffinityTerm, ...]:
        out = []
        for weighted in self.preferred_during_scheduling_ignored_during_execution:
            term = weighted.pod_affinity_term.to_term()
            if term is not None:
                out.append(WeightedPodAffinityTerm(weighted.weight, term))
        return tuple(out)


class Affinity(ConfigModel):
    node_affinity: NodeAffinity | None = None
    pod_affinity: PodAffinitySpec | None = None
    pod_anti_affinity: PodAffinitySpec | None = None


class TopologySpreadSpec(LenientModel):
    """``matchLabelKeys``, ``nodeAffinityPolicy`` and ``nodeTaintsPolicy`` are ignored."""

    max_skew: StrictInt = Field(ge=1)
    topology_key: LabelKey
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"]
    label_selector: PodLabelSelector | None = None
    min_domains: StrictInt | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _min_domains(self) -> TopologySpreadSpec:
        if self.min_domains is not None and self.when_unsatisfiable != "DoNotSchedule":
            raise ValueError("expected minDomains only with whenUnsatisfiable: DoNotSchedule")
        return self

    def to_constraint(self) -> TopologySpreadConstraint | None:
        if self.label_selector is None:  # counts no pods, so never skewed
            return None
        return TopologySpreadConstraint(
            topology_key=wk.ALIASES.get(self.topology_key, self.topology_key),
            max_skew=self.max_skew,
            when_unsatisfiable=self.when_unsatisfiable,
            selector=self.label_selector.to_selector(),
            min_domains=self.min_domains,
        )


# ---------------------------------------------------------------------------------------
# The pod spec


class PodSpec(LenientModel):
    containers: list[Container] = Field(min_length=1)
    init_containers: list[Container] = Field(default_factory=list)
    node_selector: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    affinity: Affinity | None = None
    tolerations: list[TolerationSpec] = Field(default_factory=list)
    topology_spread_constraints: list[TopologySpreadSpec] = Field(default_factory=list)
    termination_grace_period_seconds: StrictInt = Field(default=30, ge=0)
    priority_class_name: str = ""
    overhead: ResourceList | None = None

    def requests(self) -> Resources:
        """The pod's effective request, as the scheduler computes it.

        Init containers run one at a time before the app containers, so the pod needs
        the larger of the biggest init container and the sum of the app containers.
        Sidecars (init containers with ``restartPolicy: Always``) keep running, so they
        add to every later init container and to the app containers.
        """
        sidecars = Resources()
        peak = Resources()
        for init in self.init_containers:
            own = init.resources.effective_requests()
            if init.restart_policy == "Always":
                sidecars = sidecars + own
                peak = _larger(peak, sidecars)
            else:
                peak = _larger(peak, sidecars + own)
        main = Resources()
        for container in self.containers:
            main = main + container.resources.effective_requests()
        return pod_resources(_larger(peak, main + sidecars))

    def scheduling_fields(self) -> dict[str, Any]:
        """The ``Pod`` fields that constrain placement, beyond requests and tolerations."""
        affinity = self.affinity or Affinity()
        node = affinity.node_affinity or NodeAffinity()
        required = node.required_during_scheduling_ignored_during_execution
        pod_affinity = affinity.pod_affinity or PodAffinitySpec()
        anti = affinity.pod_anti_affinity or PodAffinitySpec()
        spread = (c.to_constraint() for c in self.topology_spread_constraints)
        return {
            "node_selector": canonical_labels(self.node_selector),
            "required_affinity": tuple(
                t.to_requirements() for t in (required.node_selector_terms if required else ())
            ),
            "preferred_affinity": tuple(
                PreferredSchedulingTerm(p.weight, p.preference.to_requirements())
                for p in node.preferred_during_scheduling_ignored_during_execution
            ),
            "pod_affinity": pod_affinity.required(),
            "pod_anti_affinity": anti.required(),
            "preferred_pod_affinity": pod_affinity.preferred(),
            "preferred_pod_anti_affinity": anti.preferred(),
            "topology_spread": tuple(c for c in spread if c is not None),
            "overhead": self.overhead.to_resources() if self.overhead else Resources(),
        }


class PodMeta(LenientModel):
    labels: Labels = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class PodTemplate(LenientModel):
    metadata: PodMeta = Field(default_factory=PodMeta)
    spec: PodSpec
