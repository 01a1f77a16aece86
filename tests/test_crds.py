"""The CRDs under deploy/crds are the ones the models generate, and they are structural.

A model change that is not followed by ``python -m spotwright.model.crds deploy/crds``
fails the drift test, so the API server can never validate NodePools and NodeClaims
differently from the controller. The structural checks catch what the API server would
refuse at ``kubectl apply`` time; the real-cluster tier then applies them for real.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from spotwright.model import crds
from spotwright.model.nodeclaim import NodeClaimResource
from spotwright.model.nodepool import NodePool

DEPLOY = Path(__file__).resolve().parent.parent / "deploy" / "crds"
REGENERATE = "run `python -m spotwright.model.crds deploy/crds` and commit the result"


def test_checked_in_crds_match_the_models() -> None:
    expected = crds.render()
    present = {p.name: p.read_text() for p in DEPLOY.glob("*.yaml")}
    assert sorted(present) == sorted(expected), REGENERATE
    for name, text in expected.items():
        assert present[name] == text, f"{name} drifted from the models: {REGENERATE}"


def schemas() -> Iterator[tuple[str, dict[str, Any]]]:
    for name, text in crds.render().items():
        doc = yaml.safe_load(text)
        for version in doc["spec"]["versions"]:
            yield name, version["schema"]["openAPIV3Schema"]


def walk(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield path, node
        for key, value in node.get("properties", {}).items():
            yield from walk(value, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            yield from walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from walk(node["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize(
    "name,schema", list(schemas()), ids=lambda v: v if isinstance(v, str) else ""
)
def test_schemas_are_structural(name: str, schema: dict[str, Any]) -> None:
    for path, node in walk(schema):
        where = f"{name}: {path or '<root>'}"
        assert "$ref" not in node and "$defs" not in node and "title" not in node, where
        assert "const" not in node and node.get("additionalProperties") is not False, where
        typed = "type" in node
        open_ = node.get("x-kubernetes-preserve-unknown-fields") or node.get(
            "x-kubernetes-int-or-string"
        )
        assert typed or open_, f"{where}: no type"
        for variant in node.get("anyOf", ()):
            assert set(variant) <= {"type"} and node.get("x-kubernetes-int-or-string"), where
        if "default" in node and node.get("type") == "string":
            assert isinstance(node["default"], str), where
        if isinstance(node.get("exclusiveMinimum"), int | float):
            pytest.fail(f"{where}: OpenAPI v3 wants a boolean exclusiveMinimum")


def test_durations_and_quantities_are_written_as_text() -> None:
    nodepool = yaml.safe_load(crds.render()["spotwright.io_nodepools.yaml"])
    spec = nodepool["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    template = spec["properties"]["template"]["properties"]["spec"]["properties"]
    assert template["expireAfter"]["type"] == "string"
    assert template["expireAfter"]["default"] == "720h"
    cpu = spec["properties"]["limits"]["properties"]["cpu"]
    assert cpu["x-kubernetes-int-or-string"] is True


def test_nodeclaim_columns_and_status_conditions() -> None:
    nodeclaim = yaml.safe_load(crds.render()["spotwright.io_nodeclaims.yaml"])
    version = nodeclaim["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert nodeclaim["spec"]["scope"] == "Cluster"
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Type"] == ".status.instanceType"
    assert columns["Ready"] == '.status.conditions[?(@.type=="Ready")].status'
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    condition = status["properties"]["conditions"]["items"]
    assert set(condition["required"]) >= {"type", "status", "lastTransitionTime"}


def test_the_models_read_what_the_crds_describe() -> None:
    """A NodePool and a NodeClaim as a user or the controller writes them validate."""
    NodePool.model_validate(
        {
            "apiVersion": "spotwright.io/v1alpha1",
            "kind": "NodePool",
            "metadata": {"name": "spot"},
            "spec": {
                "template": {
                    "spec": {
                        "requirements": [
                            {
                                "key": "karpenter.sh/capacity-type",
                                "operator": "In",
                                "values": ["spot"],
                            }
                        ],
                        "expireAfter": "720h",
                    }
                },
                "limits": {"cpu": "1000"},
            },
        }
    )
    NodeClaimResource.model_validate(
        {
            "apiVersion": "spotwright.io/v1alpha1",
            "kind": "NodeClaim",
            "metadata": {"name": "spot-00001"},
            "spec": {"nodePool": "spot", "resources": {"requests": {"cpu": "1500m"}}},
        }
    )
