"""The workloads of a scenario: Kubernetes manifests as they are, or a short form.

People will paste the Deployments and PodDisruptionBudgets they run, so those are read
in their real shape. Real manifests carry many fields spotwright does not model (image,
ports, env, probes, volumes), so manifests ignore unknown fields; only the parts that
decide where a pod can run and how it may be disrupted are read, and those strictly
(the pod spec is in ``podspec``).
The short form is for writing scenarios by hand, and because nothing else is there to
hide a typo in, its unknown keys are errors. Both forms produce the same ``Deployment``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Discriminator,
    Field,
    Tag,
    model_validator,
)

from spotwright.model.durations import Duration, parse_duration
from spotwright.model.errors import Problem, format_path, show
from spotwright.model.fields import (
    ConfigModel,
    LabelKey,
    Labels,
    LabelValue,
    LenientModel,
    ObjectMeta,
    ObjectName,
    StrictInt,
)
from spotwright.model.objects import Deployment, Pod, PodDisruptionBudget
from spotwright.model.podspec import (
    PodTemplate,
    ResourceList,
    TolerationSpec,
    canonical_labels,
    pod_resources,
)
from spotwright.model.resources import Resources

__all__ = [
    "DEFAULT_STARTUP_SECONDS",
    "STARTUP_ANNOTATION",
    "DeploymentManifest",
    "PdbManifest",
    "ShortWorkload",
    "Workload",
    "check_workloads",
]

#: Seconds from a pod being scheduled to it being ready, when a workload does not say.
DEFAULT_STARTUP_SECONDS = 10.0
#: Deployment annotation that sets the startup time of a manifest's pods.
STARTUP_ANNOTATION = "spotwright.io/startup-seconds"
#: Priorities of the built-in PriorityClasses; other names have no object to look up.
_BUILTIN_PRIORITIES = {
    "system-cluster-critical": 2_000_000_000,
    "system-node-critical": 2_000_001_000,
}


def _int_or_percent(value: object) -> int | str:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and re.fullmatch(r"(100|[0-9]{1,2})%", value):
        return value
    raise ValueError(f"expected a count or a percentage like 50%, got {show(value)}")


IntOrPercent = Annotated[int | str, BeforeValidator(_int_or_percent)]


def _exactly_one_bound(min_available: object, max_unavailable: object) -> None:
    if min_available is None and max_unavailable is None:
        raise ValueError("expected one of minAvailable or maxUnavailable, got neither")
    if min_available is not None and max_unavailable is not None:
        raise ValueError("expected only one of minAvailable or maxUnavailable, got both")


# ---------------------------------------------------------------------------------------
# Short form


class PdbShort(ConfigModel):
    min_available: IntOrPercent | None = None
    max_unavailable: IntOrPercent | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> PdbShort:
        _exactly_one_bound(self.min_available, self.max_unavailable)
        return self


class ShortWorkload(ConfigModel):
    """``{name, replicas, requests, ...}``: one Deployment and, with ``pdb``, its budget."""

    name: ObjectName
    namespace: str = "default"
    replicas: StrictInt = Field(default=1, ge=0)
    #: Pod labels, which also select the pods; ``{app: name}`` when not given.
    labels: Labels | None = None
    requests: ResourceList = Field(default_factory=ResourceList)
    node_selector: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    tolerations: list[TolerationSpec] = Field(default_factory=list)
    priority_class_name: str = ""
    pdb: PdbShort | None = None
    startup_seconds: Duration = DEFAULT_STARTUP_SECONDS
    termination_grace_period_seconds: StrictInt = Field(default=30, ge=0)

    def pod_labels(self) -> dict[str, str]:
        return dict(self.labels) if self.labels is not None else {"app": self.name}

    def deployment(self) -> Deployment:
        labels = self.pod_labels()
        template = _pod(
            name=self.name,
            namespace=self.namespace,
            labels=labels,
            requests=pod_resources(self.requests.to_resources()),
            tolerations=self.tolerations,
            grace_seconds=self.termination_grace_period_seconds,
            startup_seconds=self.startup_seconds,
            priority_class=self.priority_class_name,
            node_selector=canonical_labels(self.node_selector),
        )
        return Deployment(self.name, self.namespace, self.replicas, template, dict(labels))

    def pod_disruption_budget(self) -> PodDisruptionBudget | None:
        if self.pdb is None:
            return None
        return PodDisruptionBudget(
            name=self.name,
            namespace=self.namespace,
            selector=self.pod_labels(),
            min_available=self.pdb.min_available,
            max_unavailable=self.pdb.max_unavailable,
        )


# ---------------------------------------------------------------------------------------
# Manifests


class LabelSelector(ConfigModel):
    """Only ``matchLabels``: a ``matchExpressions`` selector is reported as unsupported."""

    match_labels: Labels = Field(min_length=1)


class DeploymentSpec(LenientModel):
    replicas: StrictInt = Field(default=1, ge=0)
    selector: LabelSelector
    template: PodTemplate


class DeploymentManifest(ConfigModel):
    api_version: Literal["apps/v1"]
    kind: Literal["Deployment"]
    metadata: ObjectMeta
    spec: DeploymentSpec
    status: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.metadata.name

    def startup_seconds(self) -> float:
        text = self.metadata.annotations.get(STARTUP_ANNOTATION)
        return DEFAULT_STARTUP_SECONDS if text is None else parse_duration(text)

    def deployment(self) -> Deployment:
        pod = self.spec.template
        namespace = self.metadata.namespace or "default"
        template = _pod(
            name=self.name,
            namespace=namespace,
            labels=dict(pod.metadata.labels),
            requests=pod.spec.requests(),
            tolerations=pod.spec.tolerations,
            grace_seconds=pod.spec.termination_grace_period_seconds,
            startup_seconds=self.startup_seconds(),
            priority_class=pod.spec.priority_class_name,
            **pod.spec.scheduling_fields(),
        )
        selector = dict(self.spec.selector.match_labels)
        return Deployment(self.name, namespace, self.spec.replicas, template, selector)


class PdbSpec(LenientModel):
    min_available: IntOrPercent | None = None
    max_unavailable: IntOrPercent | None = None
    selector: LabelSelector

    @model_validator(mode="after")
    def _exactly_one(self) -> PdbSpec:
        _exactly_one_bound(self.min_available, self.max_unavailable)
        return self


class PdbManifest(ConfigModel):
    api_version: Literal["policy/v1"]
    kind: Literal["PodDisruptionBudget"]
    metadata: ObjectMeta
    spec: PdbSpec
    status: dict[str, Any] | None = None

    def pod_disruption_budget(self) -> PodDisruptionBudget:
        return PodDisruptionBudget(
            name=self.metadata.name,
            namespace=self.metadata.namespace or "default",
            selector=dict(self.spec.selector.match_labels),
            min_available=self.spec.min_available,
            max_unavailable=self.spec.max_unavailable,
        )


class UnsupportedManifest(LenientModel):
    """Stands in for any other kind, so the error names the kinds that are supported."""

    api_version: str | None = None
    kind: Literal["Deployment", "PodDisruptionBudget"]


def _workload_kind(value: Any) -> str:
    """Route a workload item: manifests have a ``kind``, the short form does not."""
    if isinstance(value, dict):
        kind, version = value.get("kind"), value.get("apiVersion")
    else:
        kind, version = getattr(value, "kind", None), getattr(value, "api_version", None)
    if kind is None and version is None:
        return "short"
    if kind == "Deployment":
        return "deployment"
    if kind == "PodDisruptionBudget":
        return "pdb"
    return "unsupported"


Workload = Annotated[
    Annotated[ShortWorkload, Tag("short")]
    | Annotated[DeploymentManifest, Tag("deployment")]
    | Annotated[PdbManifest, Tag("pdb")]
    | Annotated[UnsupportedManifest, Tag("unsupported")],
    Discriminator(_workload_kind),
]


def _pod(
    *,
    name: str,
    namespace: str,
    labels: dict[str, str],
    requests: Resources,
    tolerations: Sequence[TolerationSpec],
    grace_seconds: int,
    startup_seconds: float,
    priority_class: str,
    **scheduling: Any,
) -> Pod:
    """The Deployment's pod template; its pods are named after it and owned by it."""
    return Pod(
        name=name,
        namespace=namespace,
        labels=labels,
        requests=requests,
        tolerations=tuple(t.to_toleration() for t in tolerations),
        priority=_BUILTIN_PRIORITIES.get(priority_class, 0),
        priority_class=priority_class,
        owner=name,
        grace_seconds=float(grace_seconds),
        startup_seconds=startup_seconds,
        **scheduling,
    )


def check_workloads(items: Sequence[Any], prefix: tuple[str | int, ...]) -> list[Problem]:
    """Rules across fields and items: unique names, selectors that match, annotations."""
    problems: list[Problem] = []
    deployments: set[tuple[str, str]] = set()
    budgets: set[tuple[str, str]] = set()
    for index, item in enumerate(items):
        at = (*prefix, index)
        if isinstance(item, ShortWorkload):
            problems += _unique(deployments, (item.namespace, item.name), (*at, "name"), "workload")
            if item.pdb is not None:
                problems += _unique(budgets, (item.namespace, item.name), (*at, "name"), "PDB")
        elif isinstance(item, DeploymentManifest):
            key = (item.metadata.namespace or "default", item.name)
            problems += _unique(deployments, key, (*at, "metadata", "name"), "workload")
            problems += _check_manifest(item, at)
        elif isinstance(item, PdbManifest):
            key = (item.metadata.namespace or "default", item.metadata.name)
            problems += _unique(budgets, key, (*at, "metadata", "name"), "PDB")
    return problems


def _unique(
    seen: set[tuple[str, str]], key: tuple[str, str], at: tuple[str | int, ...], what: str
) -> list[Problem]:
    if key in seen:
        return [
            Problem(format_path(at), f"expected a unique {what} name, got {show(key[1])} again")
        ]
    seen.add(key)
    return []


def _check_manifest(item: DeploymentManifest, at: tuple[str | int, ...]) -> list[Problem]:
    problems: list[Problem] = []
    text = item.metadata.annotations.get(STARTUP_ANNOTATION)
    if text is not None:
        try:
            parse_duration(text)
        except ValueError as exc:
            path = format_path([*at, "metadata", "annotations", STARTUP_ANNOTATION])
            problems.append(Problem(path, str(exc)))
    selector = item.spec.selector.match_labels
    pod_labels = item.spec.template.metadata.labels
    if any(pod_labels.get(k) != v for k, v in selector.items()):
        problems.append(
            Problem(
                format_path([*at, "spec", "selector", "matchLabels"]),
                "expected labels that spec.template.metadata.labels also has, "
                f"got {show(dict(selector))} against {show(dict(pod_labels))}",
            )
        )
    return problems
