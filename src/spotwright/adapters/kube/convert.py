"""Kubernetes API objects (as decoded JSON) to the records the controllers reason about.

The controllers speak ``model.objects``: small dataclasses with integer resources and
tuples of requirements. A real API server speaks JSON with quantities as strings,
scheduling constraints spread over half a dozen fields and ownership in references. This
module is the one place that translates, and it is deliberately pure (dicts in, dataclasses
out) so that it is tested without a cluster and so that the cache stores nothing else.

A pod's requests and placement constraints are computed by ``model.podspec``, the same
code that reads Deployments from scenario files, so a pod packs identically in a
simulation and on a live cluster. That model is strict about what it understands; fields
it does not model (hugepages, ``matchFields``) are dropped before it sees them
rather than failing the whole pod.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple

from pydantic import ValidationError

from spotwright.model.objects import (
    Node,
    Pod,
    PodDisruptionBudget,
    Taint,
    Toleration,
)
from spotwright.model.podspec import PodSpec
from spotwright.model.resources import GPU, Resources, is_extended
from spotwright.observability.logs import get_logger

__all__ = [
    "DAEMON_KINDS",
    "MIRROR_ANNOTATION",
    "READINESS_TAINTS",
    "format_time",
    "node_from_api",
    "parse_time",
    "pdb_from_api",
    "pod_from_api",
    "resource_list",
    "taint_to_api",
    "taints_from_api",
]

log = get_logger("kube.convert")

#: The kubelet puts this annotation on the API copy of a static pod.
MIRROR_ANNOTATION: Final = "kubernetes.io/config.mirror"
DAEMON_KINDS: Final = frozenset({"DaemonSet"})
#: Resource names the scheduler model counts besides extended ones (hugepages are ignored).
_KNOWN_RESOURCES: Final = frozenset({"cpu", "memory", GPU, "pods", "ephemeral-storage"})
_REQUEST_RESOURCES: Final = frozenset({"cpu", "memory", GPU, "ephemeral-storage"})
#: Annotations never worth keeping in memory: whole copies of the object.
_DROPPED_ANNOTATIONS: Final = frozenset(
    {"kubectl.kubernetes.io/last-applied-configuration", "deployment.kubernetes.io/revision"}
)
_MAX_ANNOTATION_LENGTH: Final = 512
#: Taints the node lifecycle controller sets while a node is not Ready; they restate
#: ``Node.ready`` and are transient (Karpenter's "known ephemeral taints").
READINESS_TAINTS: Final = frozenset(
    {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}
)
_warned: set[str] = set()
_PLACEMENT_CACHE_SIZE: Final = 65_536


class _Placement(NamedTuple):
    requests: Resources
    tolerations: tuple[Toleration, ...]
    fields: dict[str, Any]


_PLACEMENTS: OrderedDict[tuple[str, int], _Placement] = OrderedDict()


# ---------------------------------------------------------------------------------------
# Small pieces


def parse_time(text: object) -> float | None:
    """An RFC 3339 timestamp (``metav1.Time`` or ``MicroTime``) as seconds since the epoch."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def format_time(seconds: float) -> str:
    """Seconds since the epoch as an RFC 3339 ``MicroTime`` (microseconds, UTC, ``Z``)."""
    moment = datetime.fromtimestamp(seconds, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _interned(values: Mapping[str, Any] | None) -> dict[str, str]:
    """Labels with shared string objects: ten thousand pods repeat the same few labels."""
    if not values:
        return {}
    return {sys.intern(str(k)): sys.intern(str(v)) for k, v in values.items()}


def _annotations(values: Mapping[str, Any] | None) -> dict[str, str]:
    """Annotations minus the big ones, so the cache's size follows the object count."""
    if not values:
        return {}
    return {
        k: str(v)
        for k, v in values.items()
        if k not in _DROPPED_ANNOTATIONS and len(str(v)) <= _MAX_ANNOTATION_LENGTH
    }


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in status.get("conditions") or ():
        if condition.get("type") == kind:
            return condition  # type: ignore[no-any-return]
    return None


def resource_list(values: Mapping[str, Any] | None, *, pods: int = 0) -> Resources:
    """A ResourceList (``{"cpu": "500m", ...}``) restricted to the resources spotwright counts."""
    known = {k: v for k, v in (values or {}).items() if k in _KNOWN_RESOURCES or is_extended(k)}
    return Resources.from_k8s(known, pods=pods)


def taints_from_api(items: Sequence[Mapping[str, Any]] | None) -> list[Taint]:
    taints = []
    for item in items or ():
        effect = item.get("effect")
        if effect in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            taints.append(Taint(str(item.get("key", "")), effect, str(item.get("value") or "")))
    return taints


def taint_to_api(taint: Taint) -> dict[str, str]:
    out = {"key": taint.key, "effect": taint.effect}
    if taint.value:
        out["value"] = taint.value
    return out


# ---------------------------------------------------------------------------------------
# Pods


def _container(item: Mapping[str, Any]) -> dict[str, Any]:
    resources = item.get("resources") or {}
    out: dict[str, Any] = {
        "name": item.get("name", ""),
        "resources": {
            part: {
                k: v
                for k, v in (resources.get(part) or {}).items()
                if k in _REQUEST_RESOURCES or is_extended(k)
            }
            for part in ("requests", "limits")
        },
    }
    if item.get("restartPolicy"):
        out["restartPolicy"] = item["restartPolicy"]
    return out


def _node_terms(terms: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Node selector terms without ``matchFields``, which the scheduler model lacks."""
    return [{"matchExpressions": list(t.get("matchExpressions") or ())} for t in terms]


def _affinity(affinity: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not affinity:
        return None
    out: dict[str, Any] = {}
    node = affinity.get("nodeAffinity")
    if node:
        node_out: dict[str, Any] = {}
        required = node.get("requiredDuringSchedulingIgnoredDuringExecution")
        if required and required.get("nodeSelectorTerms"):
            node_out["requiredDuringSchedulingIgnoredDuringExecution"] = {
                "nodeSelectorTerms": _node_terms(required["nodeSelectorTerms"])
            }
        preferred = node.get("preferredDuringSchedulingIgnoredDuringExecution") or ()
        node_out["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {
                "weight": p.get("weight", 1),
                "preference": _node_terms([p.get("preference") or {}])[0],
            }
            for p in preferred
        ]
        out["nodeAffinity"] = node_out
    for kind in ("podAffinity", "podAntiAffinity"):
        if affinity.get(kind):
            out[kind] = affinity[kind]
    return out


def _scheduling_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The subset of a pod spec that ``PodSpec`` reads, with unmodelled parts removed."""
    out: dict[str, Any] = {
        "containers": [_container(c) for c in spec.get("containers") or ()],
        "initContainers": [_container(c) for c in spec.get("initContainers") or ()],
        "nodeSelector": dict(spec.get("nodeSelector") or {}),
        "tolerations": [
            {k: v for k, v in t.items() if v is not None and v != ""}
            for t in spec.get("tolerations") or ()
        ],
        "topologySpreadConstraints": list(spec.get("topologySpreadConstraints") or ()),
    }
    affinity = _affinity(spec.get("affinity"))
    if affinity:
        out["affinity"] = affinity
    overhead = spec.get("overhead")
    if overhead:
        out["overhead"] = {
            k: v for k, v in overhead.items() if k in _REQUEST_RESOURCES or is_extended(k)
        }
    if not out["containers"]:
        out["containers"] = [{"name": ""}]
    return out


def _parse_spec(key: str, spec: Mapping[str, Any]) -> PodSpec:
    """The pod's spec as ``PodSpec``; on a constraint the model rejects, requests only."""
    scheduling = _scheduling_spec(spec)
    try:
        return PodSpec.model_validate(scheduling)
    except ValidationError as exc:
        if key not in _warned and len(_warned) < 1000:
            _warned.add(key)
            log.warning(
                "ignoring scheduling constraints spotwright cannot read",
                pod=key,
                error=str(exc).splitlines()[0],
            )
    reduced = {
        "containers": scheduling["containers"],
        "initContainers": scheduling["initContainers"],
    }
    try:
        return PodSpec.model_validate(reduced)
    except ValidationError:
        return PodSpec.model_validate({"containers": [{"name": ""}]})


def _placement(key: str, meta: Mapping[str, Any], spec: Mapping[str, Any]) -> _Placement:
    """Requests and constraints of a pod, cached per (uid, generation).

    A pod's spec hardly ever changes while its status changes with every probe, so most
    watch events would otherwise validate the same spec again. ``metadata.generation``
    moves exactly when the spec does; without it nothing is cached.
    """
    generation = meta.get("generation")
    cache_key = (str(meta.get("uid", "")), int(generation)) if generation is not None else None
    if cache_key is not None:
        cached = _PLACEMENTS.get(cache_key)
        if cached is not None:
            return cached
    parsed = _parse_spec(key, spec)
    placement = _Placement(
        parsed.requests(),
        tuple(t.to_toleration() for t in parsed.tolerations),
        parsed.scheduling_fields(),
    )
    if cache_key is not None:
        _PLACEMENTS[cache_key] = placement
        while len(_PLACEMENTS) > _PLACEMENT_CACHE_SIZE:
            _PLACEMENTS.popitem(last=False)
    return placement


def _owner(meta: Mapping[str, Any], labels: Mapping[str, str]) -> tuple[str | None, bool]:
    """The controller owner's name (the Deployment's, for a ReplicaSet's pod) and daemon-ness.

    A ReplicaSet created by a Deployment is named ``<deployment>-<pod-template-hash>`` and
    its pods carry that hash as a label, so the Deployment is known without a lookup.
    """
    refs = meta.get("ownerReferences") or ()
    ref = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
    if ref is None:
        return None, False
    kind, name = ref.get("kind", ""), str(ref.get("name", ""))
    if kind == "ReplicaSet":
        suffix = "-" + labels.get("pod-template-hash", "\0")
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return sys.intern(name), kind in DAEMON_KINDS


def pod_from_api(obj: Mapping[str, Any]) -> Pod | None:
    """A Pod record, or None for a pod that has finished (Succeeded or Failed).

    Finished pods hold no resources and cannot be evicted, so for the controllers they
    are as good as gone.
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return None
    namespace = sys.intern(str(meta.get("namespace") or "default"))
    name = str(meta.get("name", ""))
    labels = _interned(meta.get("labels"))
    annotations = _annotations(meta.get("annotations"))
    placement = _placement(f"{namespace}/{name}", meta, spec)
    owner, daemon = _owner(meta, labels)
    ready = _condition(status, "Ready")
    scheduled = _condition(status, "PodScheduled")
    disruption = _condition(status, "DisruptionTarget")
    node_name = spec.get("nodeName") or None
    grace = spec.get("terminationGracePeriodSeconds")
    return Pod(
        name=name,
        namespace=namespace,
        uid=str(meta.get("uid", "")),
        labels=labels,
        annotations=annotations,
        requests=placement.requests,
        tolerations=placement.tolerations,
        priority=int(spec.get("priority") or 0),
        priority_class=str(spec.get("priorityClassName") or ""),
        owner=owner,
        daemon=daemon,
        mirror=MIRROR_ANNOTATION in (meta.get("annotations") or {}),
        grace_seconds=float(30 if grace is None else grace),
        created_at=parse_time(meta.get("creationTimestamp")) or 0.0,
        started_at=parse_time(status.get("startTime")),
        node_name=sys.intern(node_name) if node_name else None,
        unschedulable=(
            node_name is None
            and scheduled is not None
            and scheduled.get("status") == "False"
            and scheduled.get("reason") == "Unschedulable"
        ),
        ready=ready is not None and ready.get("status") == "True",
        ready_at=(
            parse_time(ready.get("lastTransitionTime"))
            if ready is not None and ready.get("status") == "True"
            else None
        ),
        deleting_since=parse_time(meta.get("deletionTimestamp")),
        evicted=disruption is not None and disruption.get("reason") == "EvictionByEvictionAPI",
        **placement.fields,
    )


# ---------------------------------------------------------------------------------------
# Nodes and budgets


def node_from_api(obj: Mapping[str, Any]) -> Node:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    ready = _condition(status, "Ready")
    return Node(
        name=str(meta.get("name", "")),
        provider_id=str(spec.get("providerID") or ""),
        labels=_interned(meta.get("labels")),
        taints=taints_from_api(spec.get("taints")),
        unschedulable=bool(spec.get("unschedulable")),
        allocatable=resource_list(status.get("allocatable")),
        ready=ready is not None and ready.get("status") == "True",
        created_at=parse_time(meta.get("creationTimestamp")) or 0.0,
        annotations=_annotations(meta.get("annotations")),
    )


def pdb_from_api(obj: Mapping[str, Any]) -> PodDisruptionBudget:
    """A budget; a selector's ``matchExpressions`` cannot be represented and are dropped.

    The API server enforces budgets on eviction anyway: the record only informs decisions.
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    selector = spec.get("selector") or {}
    return PodDisruptionBudget(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace") or "default"),
        selector=dict(selector.get("matchLabels") or {}),
        min_available=spec.get("minAvailable"),
        max_unavailable=spec.get("maxUnavailable"),
    )
