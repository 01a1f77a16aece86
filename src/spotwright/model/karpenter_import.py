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

import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from spotwright.model.errors import (
    Problem,
    ScenarioError,
    format_path,
    load_yaml_documents,
    read_text,
    show,
)
from spotwright.model.import_cleaning import At, Note, clean, clean_object, copy_tree, dig
from spotwright.model.nodeclass import (
    AMI_FAMILIES,
    EC2NodeClass,
    KubeletConfiguration,
    parse_nodeclass,
)
from spotwright.model.nodepool import NodePool, parse_nodepool

__all__ = ["SPOTWRIGHT_API", "ImportFailed", "ImportResult", "Note", "convert_files", "to_yaml"]

SPOTWRIGHT_API = "spotwright.io/v1alpha1"
_NODEPOOL_APIS = ("karpenter.sh/v1", "karpenter.sh/v1beta1", SPOTWRIGHT_API)
_NODECLASS_APIS = ("karpenter.k8s.aws/v1", "karpenter.k8s.aws/v1beta1", SPOTWRIGHT_API)
_RETIRED = {
    ("karpenter.sh/v1alpha5", "Provisioner"): "NodePool",
    ("karpenter.k8s.aws/v1alpha1", "AWSNodeTemplate"): "EC2NodeClass",
}


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


def _read_documents(path: Path) -> list[tuple[tuple[str | int, ...], Any]]:
    """Every object in the file as (path prefix, document); ``kind: List`` is unpacked."""
    source = str(path)
    loaded = load_yaml_documents(read_text(path), source)
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


def _nodepool(
    doc: dict[str, Any],
    beta: bool,
    source: str,
    prefix: tuple[str | int, ...],
    at: At,
    notes: list[Note],
    moves: list[_KubeletMove],
) -> dict[str, Any]:
    doc = copy_tree(doc)
    if beta:
        _nodepool_from_beta(doc, source, prefix, at, notes, moves)
    spec = doc.get("spec")
    ref = dig(spec, "template", "spec", "nodeClassRef")
    if isinstance(ref, dict) and ref.get("group") == "karpenter.k8s.aws":
        ref["group"] = "spotwright.io"
        where = at("spec", "template", "spec", "nodeClassRef", "group")
        notes.append(Note(source, where, "karpenter.k8s.aws -> spotwright.io", "converted"))
    cleaned = clean_object(doc, NodePool, "karpenter.sh/v1 NodePool", source, at, notes)
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
    at: At,
    notes: list[Note],
    moves: list[_KubeletMove],
) -> None:
    """Move what moved between karpenter.sh/v1beta1 and v1, noting each move."""
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        return
    disruption = spec.get("disruption")
    template_spec = dig(spec, "template", "spec")
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
    kubelet = clean(move.kubelet, KubeletConfiguration, (), schema, move.source, at, notes)
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
    doc: dict[str, Any], beta: bool, source: str, at: At, notes: list[Note]
) -> dict[str, Any]:
    doc = copy_tree(doc)
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
    cleaned = clean_object(
        doc, EC2NodeClass, "karpenter.k8s.aws/v1 EC2NodeClass", source, at, notes
    )
    cleaned["apiVersion"] = SPOTWRIGHT_API
    _validated(lambda: parse_nodeclass(cleaned, source=source), at)
    return cleaned


def _validated(check: typing.Callable[[], object], at: At) -> None:
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
