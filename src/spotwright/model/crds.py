"""CustomResourceDefinitions for spotwright's resources, generated from the pydantic models.

The controller validates NodePools and NodeClaims with the pydantic models; the API server
validates them with the CRDs' OpenAPI schemas. Writing the schemas by hand would let the
two drift, so they are generated from the models and the YAML under ``deploy/crds`` is
checked in (``tests/test_crds.py`` fails when it no longer matches). Regenerate with::

    python -m spotwright.model.crds deploy/crds

Pydantic emits JSON Schema 2020-12; a CRD needs a *structural* OpenAPI v3 schema. The
generator therefore inlines ``$ref``, turns ``X | None`` into ``nullable``, ``Literal`` into
``enum``, open dicts into ``x-kubernetes-preserve-unknown-fields``, and drops what a CRD
may not say (titles, ``additionalProperties: false``). Fields that the models parse from
text write themselves as text: durations (``720h``, ``Never``) as patterned strings, and
quantities (``500m``, ``4Gi``) as Kubernetes int-or-string quantities.

The EC2NodeClass model lives in ``model/nodeclass.py``, which was written alongside this
module; it is imported lazily (``_nodeclass_definition``) so that the NodePool and NodeClaim
CRDs can be generated without it, and the drift test tells when its CRD must be added or
regenerated.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, get_args

import yaml
from pydantic import BaseModel, Field
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from spotwright.model.durations import Duration, DurationOrNever
from spotwright.model.fields import ConfigModel, Cpu, Memory, StrictInt, Whole
from spotwright.model.nodeclaim import Condition, NodeClaimSpec, NodeClaimStatus, ResourceQuantities
from spotwright.model.nodepool import NodePoolSpec

__all__ = ["GROUP", "VERSION", "CrdDefinition", "definitions", "render", "write"]

GROUP: Final = "spotwright.io"
VERSION: Final = "v1alpha1"
HEADER: Final = "# Generated from spotwright's models by `python -m spotwright.model.crds`.\n"

_DURATION_PATTERN: Final = r"^([0-9]+(\.[0-9]+)?(h|m|s|ms))+$"
_DURATION_OR_NEVER_PATTERN: Final = r"^(([0-9]+(\.[0-9]+)?(h|m|s|ms))+|Never)$"
_QUANTITY_PATTERN: Final = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?"
    r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_DURATION_FUNCS: Final = {get_args(Duration)[1].func: _DURATION_PATTERN}
_DURATION_FUNCS[get_args(DurationOrNever)[1].func] = _DURATION_OR_NEVER_PATTERN
_QUANTITY_FUNCS: Final = {get_args(t)[1].func for t in (Cpu, Memory, Whole)}
_READY: Final = '.status.conditions[?(@.type=="Ready")].status'
_DROPPED_KEYS: Final = {"title", "$defs", "propertyNames"}
#: Keys first in this order (the rest after, as generated), so the YAML reads top-down.
_KEY_ORDER: Final = {k: i for i, k in enumerate(("description", "type", "required", "properties"))}


class ConditionsStatus(ConfigModel):
    """A status that is its conditions (an EC2NodeClass's: Ready and why not)."""

    conditions: list[Condition] = Field(default_factory=list)


class NodePoolStatus(ConfigModel):
    """What the cluster holds for a NodePool: its nodes, their resources, its conditions."""

    nodes: StrictInt | None = Field(default=None, ge=0)
    resources: ResourceQuantities | None = None
    conditions: list[Condition] = Field(default_factory=list)


@dataclass(frozen=True)
class CrdDefinition:
    kind: str
    plural: str
    spec: type[BaseModel]
    status: type[BaseModel]
    columns: list[dict[str, Any]] = field(default_factory=list)
    description: str = ""


# ---------------------------------------------------------------------------------------
# Schema generation


def _duration_text(seconds: float) -> str:
    if seconds == float("inf"):
        return "Never"
    whole = int(seconds)
    for unit, size in (("h", 3600), ("m", 60)):
        if whole and whole == seconds and whole % size == 0:
            return f"{whole // size}{unit}"
    return f"{seconds:g}s"


class _CrdSchema(GenerateJsonSchema):
    """Pydantic's generator, told how spotwright's parsed-from-text fields look as text."""

    def function_before_schema(
        self, schema: core_schema.BeforeValidatorFunctionSchema
    ) -> JsonSchemaValue:
        func = schema["function"]["function"]
        if func in _DURATION_FUNCS:
            return {"type": "string", "pattern": _DURATION_FUNCS[func]}
        if func in _QUANTITY_FUNCS:
            return {
                "anyOf": [{"type": "integer"}, {"type": "string"}],
                "pattern": _QUANTITY_PATTERN,
                "x-kubernetes-int-or-string": True,
            }
        return super().function_before_schema(schema)

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        json_schema = super().default_schema(schema)
        inner = schema["schema"]
        default = json_schema.get("default")
        if (
            inner.get("type") == "function-before"
            and inner["function"]["function"] in _DURATION_FUNCS
            and isinstance(default, int | float)
        ):
            json_schema["default"] = _duration_text(float(default))
        return json_schema


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    """Inline ``$ref``s and make the schema structural (see the module docstring)."""
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _resolve(merged, defs)
    out = {k: _resolve(v, defs) for k, v in node.items() if k not in _DROPPED_KEYS}
    variants = out.get("anyOf")
    if variants is not None and any(v.get("type") == "null" for v in variants):
        rest = [v for v in variants if v.get("type") != "null"]
        del out["anyOf"]
        if len(rest) == 1:
            out = {**rest[0], **out}
        else:
            out["anyOf"] = rest
        out["nullable"] = True
    if "const" in out:
        out["enum"] = [out.pop("const")]
    if out.get("additionalProperties") is False:
        del out["additionalProperties"]
    if out.get("additionalProperties") is True or (
        out.get("type") == "object" and not (set(out) & {"properties", "additionalProperties"})
    ):
        out.pop("additionalProperties", None)
        out["x-kubernetes-preserve-unknown-fields"] = True
    if not out or set(out) <= {"description", "default", "nullable"}:
        out["x-kubernetes-preserve-unknown-fields"] = True
    if "exclusiveMinimum" in out and not isinstance(out["exclusiveMinimum"], bool):
        out["minimum"], out["exclusiveMinimum"] = out["exclusiveMinimum"], True
    if "exclusiveMaximum" in out and not isinstance(out["exclusiveMaximum"], bool):
        out["maximum"], out["exclusiveMaximum"] = out["exclusiveMaximum"], True
    if out.get("default", 0) is None:
        del out["default"]
    return dict(sorted(out.items(), key=lambda item: _KEY_ORDER.get(item[0], len(_KEY_ORDER))))


def object_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of a model, as a CRD needs it."""
    raw = model.model_json_schema(by_alias=True, mode="validation", schema_generator=_CrdSchema)
    schema: dict[str, Any] = _resolve(raw, raw.get("$defs", {}))
    return schema


# ---------------------------------------------------------------------------------------
# The resources


def _column(name: str, path: str, kind: str = "string", priority: int = 0) -> dict[str, Any]:
    column: dict[str, Any] = {"name": name, "type": kind, "jsonPath": path}
    if priority:
        column["priority"] = priority
    return column


def _nodeclass_definition() -> CrdDefinition | None:
    """The EC2NodeClass CRD, once ``model/nodeclass.py`` provides the model (see TODO)."""
    try:
        module = importlib.import_module("spotwright.model.nodeclass")
    except ImportError:
        return None
    model = getattr(module, "EC2NodeClass", None)
    fields = getattr(model, "model_fields", {})
    spec = getattr(fields.get("spec"), "annotation", None)
    status = getattr(fields.get("status"), "annotation", None)
    if not (isinstance(spec, type) and issubclass(spec, BaseModel)):
        return None
    if not (isinstance(status, type) and issubclass(status, BaseModel)):
        status = ConditionsStatus
    return CrdDefinition(
        kind="EC2NodeClass",
        plural="ec2nodeclasses",
        spec=spec,
        status=status,
        columns=[
            _column("Ready", _READY),
            _column("Role", ".spec.role", priority=1),
            _column("Age", ".metadata.creationTimestamp", "date"),
        ],
        description="How instances are launched on EC2: AMIs, subnets, security groups.",
    )


def definitions() -> list[CrdDefinition]:
    found = [
        CrdDefinition(
            kind="NodePool",
            plural="nodepools",
            spec=NodePoolSpec,
            status=NodePoolStatus,
            columns=[
                _column("NodeClass", ".spec.template.spec.nodeClassRef.name"),
                _column("Weight", ".spec.weight", "integer", priority=1),
                _column("Nodes", ".status.nodes", "integer"),
                _column("Ready", _READY),
                _column("Age", ".metadata.creationTimestamp", "date"),
            ],
            description="Which instances the provisioner may launch for pods, and how many.",
        ),
        CrdDefinition(
            kind="NodeClaim",
            plural="nodeclaims",
            spec=NodeClaimSpec,
            status=NodeClaimStatus,
            columns=[
                _column("Type", ".status.instanceType"),
                _column("Capacity", ".status.capacityType"),
                _column("Zone", ".status.zone"),
                _column("Node", ".status.nodeName"),
                _column("Ready", _READY),
                _column("Age", ".metadata.creationTimestamp", "date"),
                _column("ID", ".status.providerID", priority=1),
                _column("NodePool", ".spec.nodePool", priority=1),
                _column("NodeClass", ".spec.nodeClassRef.name", priority=1),
                _column("Price", ".status.price", "number", priority=1),
            ],
            description="A request for one instance, and what was launched for it.",
        ),
    ]
    nodeclass = _nodeclass_definition()
    if nodeclass is not None:
        found.append(nodeclass)
    return found


def crd(definition: CrdDefinition) -> dict[str, Any]:
    """The CustomResourceDefinition object of one resource."""
    spec_schema = object_schema(definition.spec)
    status_schema = object_schema(definition.status)
    schema = {
        "type": "object",
        "description": definition.description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{definition.plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": definition.kind,
                "listKind": f"{definition.kind}List",
                "plural": definition.plural,
                "singular": definition.kind.lower(),
                "categories": ["spotwright"],
            },
            "scope": "Cluster",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "additionalPrinterColumns": definition.columns,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                }
            ],
        },
    }


def render() -> dict[str, str]:
    """File name -> YAML text of every CRD, exactly as checked in under ``deploy/crds``."""
    out = {}
    for definition in definitions():
        text = yaml.safe_dump(crd(definition), sort_keys=False, width=100)
        out[f"{GROUP}_{definition.plural}.yaml"] = HEADER + text
    return out


def write(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render().items():
        path = directory / name
        path.write_text(text)
        written.append(path)
    return written


if __name__ == "__main__":
    for written_path in write(Path(sys.argv[1] if len(sys.argv) > 1 else "deploy/crds")):
        print(written_path)
