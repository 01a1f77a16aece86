"""Scenario files: a cluster, its workloads and what the spot market does to them.

``spotwright simulate SCENARIO.yaml`` and the scenario tests start here. Loading happens in
three steps so every mistake is reported with its place in the file: YAML is parsed (with
line numbers for syntax errors and duplicate keys), the document is validated against the
models below (types, ranges, unknown keys), and then checks that need the whole document
or the instance-type catalog run (zones, instance types, event targets, times). Whatever
fails, the caller gets one ``ScenarioError`` listing everything found.

The loaded ``Scenario`` is what the simulator consumes: plain seconds, ``NodePool``
objects, fresh ``Deployment``/``PodDisruptionBudget`` records and a time-ordered list of
typed events, so nothing downstream touches YAML or pydantic.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, StrictBool, ValidationError, field_validator, model_validator

from spotwright.model.durations import Duration, format_duration
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
    ObjectName,
    StrictInt,
    unknown_instance_type,
    unknown_zone,
)
from spotwright.model.nodegroup import NodeGroup, check_nodegroup
from spotwright.model.nodepool import NodePool, check_nodepool
from spotwright.model.objects import Deployment, PodDisruptionBudget
from spotwright.model.workloads import (
    DeploymentManifest,
    PdbManifest,
    ShortWorkload,
    Workload,
    check_workloads,
)

__all__ = [
    "CapacityEvent",
    "Event",
    "InterruptEvent",
    "Market",
    "QuotaEvent",
    "ScaleEvent",
    "Scenario",
    "ScenarioDocument",
    "bundled_example",
    "default_scenario_path",
    "examples_dir",
    "load_scenario",
    "parse_scenario",
]

CapacityType = Literal["spot", "on-demand", "reserved"]


def _number(value: object) -> object:
    # pydantic would turn "35" or true into a number; a scenario should say 35.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number, got {show(value)}")
    return value


class Market(ConfigModel):
    """How the simulated spot market behaves besides the scripted events."""

    #: ``advisor``: random interruptions at each type's Spot Advisor rate; ``none``: only
    #: the ``interrupt`` events of the timeline.
    interruptions: Literal["advisor", "none"] = "advisor"
    #: Seconds between a rebalance recommendation and the interruption it announces;
    #: None means no rebalance recommendations are sent.
    rebalance_lead_seconds: float | None = Field(default=None, ge=0)
    #: Seconds from an instance launch until its node is ready.
    boot_seconds: float = Field(default=35.0, gt=0)

    @field_validator("rebalance_lead_seconds", "boot_seconds", mode="before")
    @classmethod
    def _numbers(cls, value: object) -> object:
        return value if value is None else _number(value)


# ---------------------------------------------------------------------------------------
# Timeline events: the YAML shape, then the typed records the simulator reads


class ScaleSpec(ConfigModel):
    workload: str
    replicas: StrictInt = Field(ge=0)


class InterruptSpec(ConfigModel):
    count: StrictInt = Field(default=1, ge=1)
    capacity_type: CapacityType | None = None
    instance_type: str | None = None
    zone: str | None = None
    rebalance_lead_seconds: float | None = Field(default=None, ge=0)

    @field_validator("rebalance_lead_seconds", mode="before")
    @classmethod
    def _numbers(cls, value: object) -> object:
        return value if value is None else _number(value)


class CapacitySpec(ConfigModel):
    capacity_type: CapacityType
    #: Omitted: every instance type (of the capacity type); an empty list is an error.
    instance_types: list[str] | None = Field(default=None, min_length=1)
    #: Omitted: every zone of the scenario.
    zones: list[str] | None = Field(default=None, min_length=1)
    available: StrictBool
    for_: Duration | None = Field(default=None, alias="for")


class QuotaSpec(ConfigModel):
    capacity_type: CapacityType
    max_instances: StrictInt = Field(ge=0)
    for_: Duration | None = Field(default=None, alias="for")


_EVENT_KINDS = ("scale", "interrupt", "capacity", "quota")


class EventSpec(ConfigModel):
    at: Duration
    scale: ScaleSpec | None = None
    interrupt: InterruptSpec | None = None
    capacity: CapacitySpec | None = None
    quota: QuotaSpec | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> EventSpec:
        given = [kind for kind in _EVENT_KINDS if getattr(self, kind) is not None]
        if len(given) != 1:
            got = ", ".join(given) if given else "none"
            raise ValueError(f"expected exactly one of {', '.join(_EVENT_KINDS)}, got {got}")
        return self


@dataclass(frozen=True, slots=True)
class ScaleEvent:
    """Set a workload's replica count."""

    kind: ClassVar[Literal["scale"]] = "scale"
    at: float
    workload: str
    replicas: int


@dataclass(frozen=True, slots=True)
class InterruptEvent:
    """Reclaim ``count`` running instances matching the filters (None matches any)."""

    kind: ClassVar[Literal["interrupt"]] = "interrupt"
    at: float
    count: int = 1
    capacity_type: str | None = None
    instance_type: str | None = None
    zone: str | None = None
    #: Overrides ``market.rebalance_lead_seconds`` for these interruptions.
    rebalance_lead_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class CapacityEvent:
    """Make offerings (un)available; ``instance_types``/``zones`` of None mean all of them.

    With ``for_seconds`` the change is undone after that long; otherwise it lasts.
    """

    kind: ClassVar[Literal["capacity"]] = "capacity"
    at: float
    capacity_type: str
    available: bool
    instance_types: tuple[str, ...] | None = None
    zones: tuple[str, ...] | None = None
    for_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class QuotaEvent:
    """Cap the running instances of a capacity type; launches beyond it fail with a quota error."""

    kind: ClassVar[Literal["quota"]] = "quota"
    at: float
    capacity_type: str
    max_instances: int
    for_seconds: float | None = None


Event = ScaleEvent | InterruptEvent | CapacityEvent | QuotaEvent


def _to_event(spec: EventSpec) -> Event:
    if spec.scale is not None:
        return ScaleEvent(spec.at, spec.scale.workload, spec.scale.replicas)
    if spec.interrupt is not None:
        i = spec.interrupt
        return InterruptEvent(
            spec.at, i.count, i.capacity_type, i.instance_type, i.zone, i.rebalance_lead_seconds
        )
    if spec.capacity is not None:
        c = spec.capacity
        return CapacityEvent(
            spec.at,
            c.capacity_type,
            c.available,
            None if c.instance_types is None else tuple(c.instance_types),
            None if c.zones is None else tuple(c.zones),
            c.for_,
        )
    assert spec.quota is not None  # guaranteed by EventSpec._exactly_one
    q = spec.quota
    return QuotaEvent(spec.at, q.capacity_type, q.max_instances, q.for_)


# ---------------------------------------------------------------------------------------
# The document


class ScenarioMeta(ConfigModel):
    name: ObjectName
    description: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class ScenarioSpec(ConfigModel):
    region: str = "us-east-1"
    #: None until defaulted from the region (its a, b and c zones).
    zones: list[str] | None = Field(default=None, min_length=1)
    duration: Duration = Field(gt=0)
    seed: StrictInt = 1
    #: At least one NodePool or one node group (checked in ``_check``).
    node_pools: list[NodePool] = Field(default_factory=list)
    #: eksctl ``nodeGroups[]`` items: fixed-size mixed on-demand/spot groups.
    node_groups: list[NodeGroup] = Field(default_factory=list)
    workloads: list[Workload] = Field(default_factory=list)
    market: Market = Field(default_factory=Market)
    events: list[EventSpec] = Field(default_factory=list)

    @field_validator("region")
    @classmethod
    def _region(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-[0-9]+", value):
            raise ValueError(f"expected an AWS region like us-east-1, got {show(value)}")
        return value


class ScenarioDocument(ConfigModel):
    """The YAML file, validated but not yet checked against the catalog."""

    api_version: Literal["spotwright.io/v1alpha1"]
    kind: Literal["Scenario"]
    metadata: ScenarioMeta
    spec: ScenarioSpec


@dataclass(frozen=True, eq=False)
class Scenario:
    """A loaded, fully checked scenario, in the units and records the simulator uses."""

    document: ScenarioDocument
    source: str
    zones: tuple[str, ...]
    #: Timeline events ordered by time (file order among equal times).
    events: list[Event] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.document.metadata.name

    @property
    def description(self) -> str:
        return self.document.metadata.description

    @property
    def seed(self) -> int:
        return self.document.spec.seed

    @property
    def region(self) -> str:
        return self.document.spec.region

    @property
    def duration(self) -> float:
        """Simulated seconds to run."""
        return self.document.spec.duration

    @property
    def nodepools(self) -> list[NodePool]:
        return list(self.document.spec.node_pools)

    @property
    def nodegroups(self) -> list[NodeGroup]:
        return list(self.document.spec.node_groups)

    @property
    def market(self) -> Market:
        return self.document.spec.market

    def deployments(self) -> list[Deployment]:
        """Fresh Deployment records (the caller may mutate them), in file order."""
        out: list[Deployment] = []
        for item in self.document.spec.workloads:
            if isinstance(item, ShortWorkload | DeploymentManifest):
                out.append(item.deployment())
        return out

    def pdbs(self) -> list[PodDisruptionBudget]:
        """Fresh PodDisruptionBudget records: manifests and short-form ``pdb`` entries."""
        out: list[PodDisruptionBudget] = []
        for item in self.document.spec.workloads:
            budget = (
                item.pod_disruption_budget()
                if isinstance(item, ShortWorkload | PdbManifest)
                else None
            )
            if budget is not None:
                out.append(budget)
        return out


# ---------------------------------------------------------------------------------------
# Loading


def default_scenario_path() -> Path:
    """The bundled scenario ``spotwright simulate`` runs when given no file."""
    return examples_dir() / "default.yaml"


def bundled_example(name: str) -> Path:
    """The bundled example called ``name`` (``"day-100-nodes"`` or ``"day-100-nodes.yaml"``)."""
    return examples_dir() / (name if name.endswith(".yaml") else f"{name}.yaml")


def examples_dir() -> Path:
    """The bundled example scenarios (installed as package data)."""
    return Path(__file__).resolve().parent.parent / "examples"


def load_scenario(path: Path | str, catalog: CatalogLike) -> Scenario:
    """Read, validate and check a scenario file; raises ``ScenarioError`` on any problem."""
    return parse_scenario(read_yaml(path), source=str(path), catalog=catalog)


def parse_scenario(data: Any, *, source: str, catalog: CatalogLike) -> Scenario:
    """Validate an already-parsed document (``source`` names it in errors) and check it."""
    if not isinstance(data, dict):
        what = "an empty file" if data is None else show(data)
        message = f"expected a Scenario mapping (apiVersion, kind, metadata, spec), got {what}"
        raise ScenarioError(source, [Problem("", message)])
    try:
        document = ScenarioDocument.model_validate(data)
    except ValidationError as exc:
        problems = problems_from_validation(exc, data, ScenarioDocument)
        raise ScenarioError(source, problems) from None
    spec = document.spec
    zones = tuple(spec.zones) if spec.zones else tuple(f"{spec.region}{s}" for s in "abc")
    problems = _check(document, zones, catalog)
    if problems:
        raise ScenarioError(source, problems)
    events = sorted((_to_event(e) for e in spec.events), key=lambda event: event.at)
    return Scenario(document=document, source=source, zones=zones, events=events)


def _check(document: ScenarioDocument, zones: Sequence[str], catalog: CatalogLike) -> list[Problem]:
    """The rules that need more than one field, or the catalog."""
    spec = document.spec
    problems: list[Problem] = []
    seen_zones: set[str] = set()
    for index, zone in enumerate(spec.zones or ()):
        at = format_path(["spec", "zones", index])
        if not zone.startswith(spec.region):
            problems.append(
                Problem(at, f"expected a zone of region {spec.region}, got {show(zone)}")
            )
        elif zone in seen_zones:
            problems.append(Problem(at, f"expected each zone once, got {show(zone)} again"))
        seen_zones.add(zone)

    pool_names: set[str] = set()
    for index, pool in enumerate(spec.node_pools):
        prefix = ("spec", "nodePools", index)
        if pool.name in pool_names:
            at = format_path([*prefix, "metadata", "name"])
            problems.append(
                Problem(at, f"expected a unique NodePool name, got {show(pool.name)} again")
            )
        pool_names.add(pool.name)
        problems += check_nodepool(pool, zones=zones, catalog=catalog, prefix=prefix)

    if not spec.node_pools and not spec.node_groups:
        message = "expected at least one NodePool in nodePools or one group in nodeGroups"
        problems.append(Problem("spec", message + ", got neither"))
    group_names: set[str] = set()
    for index, group in enumerate(spec.node_groups):
        prefix = ("spec", "nodeGroups", index)
        if group.name in group_names or group.name in pool_names:
            what = "node group" if group.name in group_names else "NodePool"
            message = f"expected a name no other node group or NodePool has, got {show(group.name)}"
            problems.append(Problem(format_path([*prefix, "name"]), f"{message} ({what})"))
        group_names.add(group.name)
        problems += check_nodegroup(group, zones=zones, catalog=catalog, prefix=prefix)

    problems += check_workloads(spec.workloads, ("spec", "workloads"))
    workloads = list(
        dict.fromkeys(
            item.name
            for item in spec.workloads
            if isinstance(item, ShortWorkload | DeploymentManifest)
        )
    )
    for index, event in enumerate(spec.events):
        problems += _check_event(
            event, ("spec", "events", index), spec.duration, workloads, zones, catalog
        )
    return problems


def _check_event(
    event: EventSpec,
    at: tuple[str | int, ...],
    duration: float,
    workloads: Sequence[str],
    zones: Sequence[str],
    catalog: CatalogLike,
) -> list[Problem]:
    problems: list[Problem] = []

    def zone_problem(path: tuple[str | int, ...], zone: str) -> None:
        if zone not in zones:
            problems.append(Problem(format_path(path), unknown_zone(zone, zones)))

    def type_problem(path: tuple[str | int, ...], name: str) -> None:
        if name not in catalog:
            problems.append(Problem(format_path(path), unknown_instance_type(name, catalog)))

    if event.at > duration:
        limit, got = _seconds_text(duration), _seconds_text(event.at)
        message = f"expected a time within the scenario's duration ({limit}), got {got}"
        problems.append(Problem(format_path([*at, "at"]), message))
    if event.scale is not None and event.scale.workload not in workloads:
        known = ", ".join(workloads) or "none defined"
        message = f"expected the name of a workload ({known}), got {show(event.scale.workload)}"
        problems.append(Problem(format_path([*at, "scale", "workload"]), message))
    if event.interrupt is not None:
        if event.interrupt.instance_type is not None:
            type_problem((*at, "interrupt", "instanceType"), event.interrupt.instance_type)
        if event.interrupt.zone is not None:
            zone_problem((*at, "interrupt", "zone"), event.interrupt.zone)
    if event.capacity is not None:
        for index, name in enumerate(event.capacity.instance_types or ()):
            type_problem((*at, "capacity", "instanceTypes", index), name)
        for index, zone in enumerate(event.capacity.zones or ()):
            zone_problem((*at, "capacity", "zones", index), zone)
    return problems


def _seconds_text(seconds: float) -> str:
    return "Never" if math.isinf(seconds) else format_duration(seconds)
