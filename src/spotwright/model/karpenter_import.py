"""Converting Karpenter's NodePools and EC2NodeClasses to spotwright's own CRDs.

A platform team moving to spotwright brings its ``karpenter.sh/v1`` NodePools and
``karpenter.k8s.aws/v1`` EC2NodeClasses (often from ``kubectl get -o yaml``, so with
status and server-written metadata). ``convert_files`` reads them, multi-document files
and ``kind: List`` included, and returns the same objects as ``spotwright.io/v1alpha1``
ones. It never drops anything silently: every field it does not carry over comes back as
a ``Note`` naming its path and why (unknown to Karpenter, known but not supported by
spotwright, written by the API server or a controller), and every rewrite is noted too.
The older ``karpenter.sh/v1beta1`` and ``karpenter.k8s.aws/v1beta1`` are accepted, with
the fields that moved in v1 moved and noted.

What is carried over is validated with the same models the scenario loader uses, and
written back as the user wrote it (``720h`` stays ``720h``). Anything invalid fails the
whole conversion with one ``FILE: PATH: expected ..., got ...`` line per problem.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel

from spotwright.model.errors import Problem, ScenarioError, format_path, show
from spotwright.model.nodeclass import (
    AMI_FAMILIES,
    UNSUPPORTED,
    UNSUPPORTED_KUBELET,
    EC2NodeClass,
    EC2NodeClassSpec,
    KubeletConfiguration,
    parse_nodeclass,
)
from spotwright.model.nodepool import Limits, NodePool, NodePoolSpec, parse_nodepool

__all__ = ["SPOTWRIGHT_API", "ImportFailed", "ImportResult", "Note", "convert_files", "to_yaml"]

SPOTWRIGHT_API = "spotwright.io/v1alpha1"
_NODEPOOL_APIS = ("karpenter.sh/v1", "karpenter.sh/v1beta1", SPOTWRIGHT_API)
_NODECLASS_APIS = ("karpenter.k8s.aws/v1", "karpenter.k8s.aws/v1beta1", SPOTWRIGHT_API)
_RETIRED = {
    ("karpenter.sh/v1alpha5", "Provisioner"): "NodePool",
    ("karpenter.k8s.aws/v1alpha1", "AWSNodeTemplate"): "EC2NodeClass",
}

#: Metadata written by the API server or controllers, not by the user.
_SERVER_METADATA = frozenset(
    {
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
        "selfLink",
        "finalizers",
        "ownerReferences",
        "generateName",
    }
)
_SERVER_ANNOTATIONS = frozenset(
    {
        "kubectl.kubernetes.io/last-applied-configuration",
        "karpenter.sh/nodepool-hash",
        "karpenter.sh/nodepool-hash-version",
        "karpenter.k8s.aws/ec2nodeclass-hash",
        "karpenter.k8s.aws/ec2nodeclass-hash-version",
    }
)
_KNOWN_KUBELET = (
    "clusterDNS",
    "evictionSoft",
    "evictionSoftGracePeriod",
    "evictionMaxPodGracePeriod",
    "imageGCHighThresholdPercent",
    "imageGCLowThresholdPercent",
    "cpuCFSQuota",
)
#: Fields Karpenter has and spotwright does not model, per model class, and why.
_UNSUPPORTED: dict[type[BaseModel], dict[str, str]] = {
    NodePoolSpec: {"replicas": "static NodePools (spec.replicas) are not supported"},
    EC2NodeClassSpec: UNSUPPORTED,
    KubeletConfiguration: dict.fromkeys(_KNOWN_KUBELET, UNSUPPORTED_KUBELET),
}
_LIMITS_NOTE = "spotwright limits only cpu, memory, nodes and nvidia.com/gpu"


@dataclass(frozen=True)
class Note:
    """Something the conversion changed or left out, said about one field."""

    source: str
    path: str
    message: str
    kind: Literal["dropped", "converted"] = "dropped"

    def __str__(self) -> str:
        return f"{self.source}: {self.path}: {self.kind}: {self.message}"


@dataclass
class ImportResult:
    documents: list[dict[str, Any]] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)

    @property
    def dropped(self) -> list[Note]:
        return [n for n in self.notes if n.kind == "dropped"]


class ImportFailed(Exception):
    """Invalid input: every problem of every file, and the notes gathered until then."""

    def __init__(self, errors: Sequence[ScenarioError], notes: Sequence[Note]) -> None:
        self.errors = list(errors)
        self.notes = list(notes)
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors)


def convert_files(paths: Sequence[Path | str]) -> ImportResult:
    """Convert every NodePool and EC2NodeClass in ``paths`` (see module doc)."""
    result = ImportResult()
    errors: list[ScenarioError] = []
    moves: list[_KubeletMove] = []
    homes: dict[str, tuple[dict[str, Any], str]] = {}
    for path in paths:
        try:
            documents = _read_documents(Path(path))
        except ScenarioError as exc:
            errors.append(exc)
            continue
        several = len(documents) > 1
        for number, (prefix, doc) in enumerate(documents, 1):
            source = f"{path} (document {number})" if several else str(path)
            try:
                converted = _convert(doc, source, prefix, result.notes, moves)
            except ScenarioError as exc:
                errors.append(exc)
                continue
            result.documents.append(converted)
            if converted.get("kind") == "EC2NodeClass":
                homes[converted["metadata"]["name"]] = (converted, source)
    for move in moves:
        try:
            _move_kubelet(move, homes, result.notes)
        except ScenarioError as exc:
            errors.append(exc)
    if errors:
        raise ImportFailed(errors, result.notes)
    return result


def to_yaml(documents: Sequence[dict[str, Any]]) -> str:
    """The converted objects as one multi-document YAML text."""
    return yaml.safe_dump_all(documents, sort_keys=False, default_flow_style=False)


# ---------------------------------------------------------------------------------------
# Reading


class _Loader(yaml.SafeLoader):
    """A SafeLoader that rejects duplicate keys instead of keeping the last one."""


def _mapping(loader: _Loader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, str | int | float | bool) and key in seen:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping",
                node.start_mark,
                f"found duplicate key {show(key)}",
                key_node.start_mark,
            )
        seen.add(key) if isinstance(key, str | int | float | bool) else None
    return loader.construct_mapping(node, deep=True)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def _read_documents(path: Path) -> list[tuple[tuple[str | int, ...], Any]]:
    """Every object in the file as (path prefix, document); ``kind: List`` is unpacked."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(source, [Problem("", "no such file")]) from None
    except IsADirectoryError:
        raise ScenarioError(
            source, [Problem("", "expected a YAML file, got a directory")]
        ) from None
    except UnicodeDecodeError as exc:
        message = f"expected UTF-8 text, got an undecodable byte at offset {exc.start}"
        raise ScenarioError(source, [Problem("", message)]) from None
    except OSError as exc:
        raise ScenarioError(source, [Problem("", exc.strerror or str(exc))]) from None
    try:
        loaded = [d for d in yaml.load_all(text, Loader=_Loader) if d is not None]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise ScenarioError(source, [Problem(where, f"invalid YAML: {exc.problem}")]) from None
    except yaml.YAMLError as exc:
        raise ScenarioError(source, [Problem("", f"invalid YAML: {exc}")]) from None
    if not loaded:
        raise ScenarioError(
            source, [Problem("", "expected a NodePool or EC2NodeClass, got an empty file")]
        )
    out: list[tuple[tuple[str | int, ...], Any]] = []
    for doc in loaded:
        if (
            isinstance(doc, dict)
            and doc.get("kind") == "List"
            and isinstance(doc.get("items"), list)
        ):
            out.extend((("items", i), item) for i, item in enumerate(doc["items"]))
        else:
            out.append(((), doc))
    return out


# ---------------------------------------------------------------------------------------
# Converting one object


def _convert(
    doc: Any,
    source: str,
    prefix: tuple[str | int, ...],
    notes: list[Note],
    moves: list[_KubeletMove],
) -> dict[str, Any]:
    def at(*parts: str | int) -> str:
        return format_path([*prefix, *parts])

    if not isinstance(doc, dict):
        raise ScenarioError(
            source,
            [
                Problem(
                    at(), f"expected a Kubernetes object (apiVersion, kind, ...), got {show(doc)}"
                )
            ],
        )
    api, kind = str(doc.get("apiVersion")), str(doc.get("kind"))
    successor = _RETIRED.get((api, kind))
    if successor is not None:
        message = (
            f"expected karpenter.sh/v1 NodePool or karpenter.k8s.aws/v1 EC2NodeClass, got {api} "
            f"{kind}, which Karpenter replaced by {successor} in v1beta1; migrate it "
            "with Karpenter's upgrade guide first"
        )
        raise ScenarioError(source, [Problem(at("kind"), message)])
    if kind == "NodePool" and api in _NODEPOOL_APIS:
        return _nodepool(doc, api == "karpenter.sh/v1beta1", source, prefix, at, notes, moves)
    if kind == "EC2NodeClass" and api in _NODECLASS_APIS:
        return _nodeclass(doc, api == "karpenter.k8s.aws/v1beta1", source, at, notes)
    expected = "karpenter.sh/v1 NodePool or karpenter.k8s.aws/v1 EC2NodeClass (or a List of them)"
    raise ScenarioError(source, [Problem(at("kind"), f"expected {expected}, got {api} {kind}")])


class _At(typing.Protocol):
    def __call__(self, *parts: str | int) -> str: ...


def _nodepool(
    doc: dict[str, Any],
    beta: bool,
    source: str,
    prefix: tuple[str | int, ...],
    at: _At,
    notes: list[Note],
    moves: list[_KubeletMove],
) -> dict[str, Any]:
    doc = _copy(doc)
    if beta:
        _nodepool_from_beta(doc, source, prefix, at, notes, moves)
    spec = doc.get("spec")
    ref = _dig(spec, "template", "spec", "nodeClassRef")
    if isinstance(ref, dict) and ref.get("group") == "karpenter.k8s.aws":
        ref["group"] = "spotwright.io"
        where = at("spec", "template", "spec", "nodeClassRef", "group")
        notes.append(Note(source, where, "karpenter.k8s.aws -> spotwright.io", "converted"))
    cleaned = _clean_object(doc, NodePool, "karpenter.sh/v1 NodePool", source, at, notes)
    cleaned["apiVersion"] = SPOTWRIGHT_API
    _validated(lambda: parse_nodepool(cleaned, source=source), at)
    return cleaned


@dataclass
class _KubeletMove:
    """A v1beta1 NodePool's kubelet block, bound for its EC2NodeClass (v1 moved it)."""

    source: str
    parts: tuple[str | int, ...]
    nodeclass: str | None
    kubelet: Any

    @property
    def path(self) -> str:
        return format_path(self.parts)


def _nodepool_from_beta(
    doc: dict[str, Any],
    source: str,
    prefix: tuple[str | int, ...],
    at: _At,
    notes: list[Note],
    moves: list[_KubeletMove],
) -> None:
    """Move what moved between karpenter.sh/v1beta1 and v1, noting each move."""
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        return
    disruption = spec.get("disruption")
    template_spec = _dig(spec, "template", "spec")
    if isinstance(disruption, dict):
        if disruption.get("consolidationPolicy") == "WhenUnderutilized":
            disruption["consolidationPolicy"] = "WhenEmptyOrUnderutilized"
            where = at("spec", "disruption", "consolidationPolicy")
            notes.append(
                Note(
                    source, where, "WhenUnderutilized -> WhenEmptyOrUnderutilized (v1)", "converted"
                )
            )
        if "expireAfter" in disruption:
            value = disruption.pop("expireAfter")
            if isinstance(template_spec, dict) and "expireAfter" not in template_spec:
                template_spec["expireAfter"] = value
                message = "moved to spec.template.spec.expireAfter (karpenter.sh/v1)"
                notes.append(
                    Note(source, at("spec", "disruption", "expireAfter"), message, "converted")
                )
            else:
                message = "moved to spec.template.spec.expireAfter in v1, which is already set"
                notes.append(Note(source, at("spec", "disruption", "expireAfter"), message))
    if isinstance(template_spec, dict):
        if "kubelet" in template_spec:
            kubelet = template_spec.pop("kubelet")
            ref = template_spec.get("nodeClassRef")
            name = ref.get("name") if isinstance(ref, dict) else None
            parts = (*prefix, "spec", "template", "spec", "kubelet")
            home = name if isinstance(name, str) else None
            moves.append(_KubeletMove(source, parts, home, kubelet))
        ref = template_spec.get("nodeClassRef")
        if isinstance(ref, dict) and "apiVersion" in ref and "group" not in ref:
            api = ref.pop("apiVersion")
            group = str(api).partition("/")[0]
            template_spec["nodeClassRef"] = {"group": group, "kind": "EC2NodeClass", **ref}
            where = at("spec", "template", "spec", "nodeClassRef", "apiVersion")
            notes.append(Note(source, where, f"{api} -> group {group} (v1)", "converted"))


def _move_kubelet(
    move: _KubeletMove, homes: dict[str, tuple[dict[str, Any], str]], notes: list[Note]
) -> None:
    """Put a v1beta1 NodePool's kubelet block on its EC2NodeClass, if that is converted too."""
    home = homes.get(move.nodeclass) if move.nodeclass else None
    name = f"EC2NodeClass {move.nodeclass!r}" if move.nodeclass else "its EC2NodeClass"
    if home is None or not isinstance(move.kubelet, dict):
        message = (
            f"karpenter.sh/v1 moved it to spec.kubelet of {name}; add it there "
            "(that class is not among the files)"
        )
        notes.append(Note(move.source, move.path, message))
        return
    nodeclass, source = home
    if "kubelet" in nodeclass["spec"]:
        message = f"karpenter.sh/v1 moved it to spec.kubelet of {name}, which already has one"
        notes.append(Note(move.source, move.path, message))
        return

    def at(*parts: str | int) -> str:
        return format_path([*move.parts, *parts])

    schema = "karpenter.k8s.aws/v1 EC2NodeClass kubelet"
    kubelet = _clean(move.kubelet, KubeletConfiguration, (), schema, move.source, at, notes)
    nodeclass["spec"]["kubelet"] = kubelet
    try:
        parse_nodeclass(nodeclass, source=source)
    except ScenarioError as exc:
        del nodeclass["spec"]["kubelet"]
        raise ScenarioError(
            move.source, [Problem(move.path, p.message) for p in exc.problems]
        ) from None
    message = f"moved to spec.kubelet of {name} ({source}), as in karpenter.sh/v1"
    notes.append(Note(move.source, move.path, message, "converted"))


def _nodeclass(
    doc: dict[str, Any], beta: bool, source: str, at: _At, notes: list[Note]
) -> dict[str, Any]:
    doc = _copy(doc)
    spec = doc.get("spec")
    if beta and isinstance(spec, dict) and "amiSelectorTerms" not in spec:
        family = spec.get("amiFamily")
        alias = next((a for a, f in AMI_FAMILIES.items() if f == family), None)
        if alias is not None:
            spec["amiSelectorTerms"] = [{"alias": f"{alias}@latest"}]
            message = (
                f"karpenter.k8s.aws/v1 requires amiSelectorTerms: set alias {alias}@latest "
                "from amiFamily (pin a version such as v20240807 for production)"
            )
            notes.append(Note(source, at("spec", "amiSelectorTerms"), message, "converted"))
    cleaned = _clean_object(
        doc, EC2NodeClass, "karpenter.k8s.aws/v1 EC2NodeClass", source, at, notes
    )
    cleaned["apiVersion"] = SPOTWRIGHT_API
    _validated(lambda: parse_nodeclass(cleaned, source=source), at)
    return cleaned


def _validated(check: typing.Callable[[], object], at: _At) -> None:
    """Run ``check``; its problems' paths get the object's place in the file in front."""
    try:
        check()
    except ScenarioError as exc:
        base = at()
        problems = [
            Problem(f"{base}.{p.path}" if base and p.path else (p.path or base), p.message)
            for p in exc.problems
        ]
        raise ScenarioError(exc.source, problems) from None


# ---------------------------------------------------------------------------------------
# Keeping the fields the model knows, noting the others


def _clean_object(
    doc: dict[str, Any],
    model: type[BaseModel],
    schema: str,
    source: str,
    at: _At,
    notes: list[Note],
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("apiVersion", "kind", "metadata", "spec"):
        if key in doc:
            out[key] = doc[key]
    if isinstance(out.get("metadata"), dict):
        out["metadata"] = _clean_metadata(out["metadata"], source, at, notes)
    if isinstance(out.get("spec"), dict):
        spec_type = _field_model(model, "spec")
        assert spec_type is not None
        out["spec"] = _clean(out["spec"], spec_type, ("spec",), schema, source, at, notes)
    for key in doc:
        if key in out:
            continue
        if key == "status":
            notes.append(Note(source, at("status"), "written by the controller, not configuration"))
        else:
            notes.append(
                Note(
                    source,
                    at(key),
                    _unknown(key, ["apiVersion", "kind", "metadata", "spec"], schema),
                )
            )
    return out


def _clean_metadata(
    meta: dict[str, Any], source: str, at: _At, notes: list[Note]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in meta.items():
        if key in ("name", "namespace", "labels"):
            out[key] = value
        elif key == "annotations" and isinstance(value, dict):
            kept = {}
            for name, text in value.items():
                if name in _SERVER_ANNOTATIONS:
                    where = at("metadata", "annotations", name)
                    notes.append(Note(source, where, "written by kubectl or a controller"))
                else:
                    kept[name] = text
            if kept:
                out["annotations"] = kept
        elif key == "annotations":
            out[key] = value  # let validation say what is wrong with it
        elif key in _SERVER_METADATA:
            notes.append(Note(source, at("metadata", key), "written by the API server"))
        else:
            known = ["name", "namespace", "labels", "annotations"]
            notes.append(Note(source, at("metadata", key), _unknown(key, known, "object metadata")))
    return out


def _clean(
    data: dict[str, Any],
    model: type[BaseModel],
    path: tuple[str | int, ...],
    schema: str,
    source: str,
    at: _At,
    notes: list[Note],
) -> dict[str, Any]:
    fields = {f.alias or name: f for name, f in model.model_fields.items()}
    unsupported = _UNSUPPORTED.get(model, {})
    out: dict[str, Any] = {}
    for key, value in data.items():
        here = (*path, key)
        f = fields.get(key) if isinstance(key, str) else None
        if f is None:
            if key in unsupported:
                notes.append(
                    Note(source, at(*here), f"not supported by spotwright: {unsupported[key]}")
                )
            elif model is Limits:
                notes.append(
                    Note(source, at(*here), f"not supported by spotwright: {_LIMITS_NOTE}")
                )
            else:
                notes.append(Note(source, at(*here), _unknown(str(key), list(fields), schema)))
            continue
        inner = _model_of(f.annotation)
        if inner is not None and isinstance(value, dict):
            value = _clean(value, inner, here, schema, source, at, notes)
        elif inner is not None and _is_list(f.annotation) and isinstance(value, list):
            value = [
                _clean(item, inner, (*here, i), schema, source, at, notes)
                if isinstance(item, dict)
                else item
                for i, item in enumerate(value)
            ]
        out[key] = value
    return out


def _unknown(key: str, known: list[str], schema: str) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"unknown field: {schema} has no {key!r}{hint}"


def _field_model(model: type[BaseModel], name: str) -> type[BaseModel] | None:
    return _model_of(model.model_fields[name].annotation)


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside ``annotation`` (``X``, ``X | None``, ``list[X]``), if any."""
    for candidate in _unwrap(annotation):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _is_list(annotation: Any) -> bool:
    return any(typing.get_origin(a) is list for a in _members(annotation))


def _members(annotation: Any) -> Iterator[Any]:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        yield from _members(typing.get_args(annotation)[0])
    elif origin in (typing.Union, type(int | str)):
        for arg in typing.get_args(annotation):
            yield from _members(arg)
    else:
        yield annotation


def _unwrap(annotation: Any) -> Iterator[Any]:
    for member in _members(annotation):
        if typing.get_origin(member) is list:
            yield from _members(typing.get_args(member)[0])
        else:
            yield member


def _dig(data: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value
