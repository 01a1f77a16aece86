"""Keeping the fields a spotwright model knows, and noting every other one by name.

``karpenter_import`` converts Karpenter objects by walking each document alongside the
pydantic model it must become: a key the model has is kept (and its value walked in
turn), any other key is left out with a ``Note`` saying why (unknown to Karpenter, known
but unsupported here, written by the API server). This is what makes "nothing is dropped
silently" hold for every nested field without a hand-written list per object.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from spotwright.model.nodeclass import UNSUPPORTED, EC2NodeClassSpec
from spotwright.model.nodepool import Limits, NodePoolSpec

__all__ = ["At", "Note", "clean", "clean_object", "copy_tree", "dig"]


class At(typing.Protocol):
    """Formats a path inside the object being converted (with its place in the file)."""

    def __call__(self, *parts: str | int) -> str: ...


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
#: Fields Karpenter has and spotwright does not model, per model class, and why.
_UNSUPPORTED: dict[type[BaseModel], dict[str, str]] = {
    NodePoolSpec: {"replicas": "static NodePools (spec.replicas) are not supported"},
    EC2NodeClassSpec: UNSUPPORTED,
}
_LIMITS_NOTE = (
    "spotwright limits only cpu, memory, nodes, nvidia.com/gpu, pods and ephemeral-storage"
)


@dataclass(frozen=True)
class Note:
    """Something the conversion changed or left out, said about one field."""

    source: str
    path: str
    message: str
    kind: Literal["dropped", "converted"] = "dropped"

    def __str__(self) -> str:
        return f"{self.source}: {self.path}: {self.kind}: {self.message}"


# ---------------------------------------------------------------------------------------
# Keeping the fields the model knows, noting the others


def clean_object(
    doc: dict[str, Any],
    model: type[BaseModel],
    schema: str,
    source: str,
    at: At,
    notes: list[Note],
) -> dict[str, Any]:
    """A whole object cleaned: top-level keys, metadata (server-written fields noted as
    such) and ``spec`` against ``model``'s spec type."""
    out: dict[str, Any] = {}
    for key in ("apiVersion", "kind", "metadata", "spec"):
        if key in doc:
            out[key] = doc[key]
    if isinstance(out.get("metadata"), dict):
        out["metadata"] = _clean_metadata(out["metadata"], source, at, notes)
    if isinstance(out.get("spec"), dict):
        spec_type = _field_model(model, "spec")
        assert spec_type is not None
        out["spec"] = clean(out["spec"], spec_type, ("spec",), schema, source, at, notes)
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


def _clean_metadata(meta: dict[str, Any], source: str, at: At, notes: list[Note]) -> dict[str, Any]:
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


def clean(
    data: dict[str, Any],
    model: type[BaseModel],
    path: tuple[str | int, ...],
    schema: str,
    source: str,
    at: At,
    notes: list[Note],
) -> dict[str, Any]:
    """``data`` with only the keys ``model`` has, walked recursively; the rest noted.

    ``schema`` names the object in the notes ("karpenter.sh/v1 NodePool has no ...").
    """
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
            value = clean(value, inner, here, schema, source, at, notes)
        elif inner is not None and _is_list(f.annotation) and isinstance(value, list):
            value = [
                clean(item, inner, (*here, i), schema, source, at, notes)
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


def dig(data: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def copy_tree(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: copy_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [copy_tree(v) for v in value]
    return value
