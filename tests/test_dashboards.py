"""The Grafana dashboards under deploy/dashboards chart only metrics spotwright exports.

A renamed or removed metric leaves a dashboard panel silently empty; these tests catch
that. The exported names are read from the registries themselves (the controller's
``Metrics`` and the node handler's ``TerminationExporter``), never from a list kept here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spotwright.observability.exporter import TerminationExporter
from spotwright.observability.metrics import Metrics

DASHBOARDS = sorted((Path(__file__).resolve().parents[1] / "deploy" / "dashboards").glob("*.json"))

#: The series names Prometheus scrapes for each kind of metric family.
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
}
#: PromQL words that are not metric names (functions are recognised by their "(").
_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
}


def exported_names() -> set[str]:
    metrics = Metrics()
    TerminationExporter(instance_id="i-0123456789abcdef0", registry=metrics.registry)
    return {
        family.name + suffix
        for family in metrics.registry.collect()
        for suffix in _SUFFIXES[family.type]
    }


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (with Grafana variables) selects."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values, strings
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors
    text = re.sub(r"\$\{[^}]*\}|\$\w+", "", text)  # Grafana variables
    text = re.sub(r"(?<![\w:])\d[\w.]*", "", text)  # numbers and durations (0.99, 5m)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        if text[match.end() :].lstrip().startswith("("):
            continue  # a function or an aggregation
        if match.group().lower() not in _KEYWORDS:
            names.add(match.group())
    return names


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression: panel targets, and the metrics template variables read."""
    found = [t["expr"] for t in _walk(dashboard.get("panels", [])) if "expr" in t]
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable.get("query")
        text = query.get("query", "") if isinstance(query, dict) else str(query or "")
        values = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", text)
        found.append(values.group(1) if values else text)
    return found


def load(path: Path) -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(path.read_text())
    return dashboard


def test_there_is_a_dashboard() -> None:
    assert [p.name for p in DASHBOARDS] == ["spotwright.json"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_metric_a_dashboard_charts_is_exported(path: Path) -> None:
    exported = exported_names()
    used: set[str] = set()
    for expr in queries(load(path)):
        names = metric_names(expr)
        assert names, f"no metric found in {expr!r}"
        assert names <= exported, f"{expr!r} charts {sorted(names - exported)}, not exported"
        used |= names
    # The handler's spot-termination-exporter gauges are charted under their own names.
    for name in (
        "aws_instance_termination_imminent",
        "aws_instance_termination_in",
        "aws_instance_metadata_service_available",
        "aws_instance_rebalance_recommended",
    ):
        assert name in used


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_a_dashboard_imports_as_is(path: Path) -> None:
    """Unique panel ids, every query on the data source variable, panels on the grid."""
    dashboard = load(path)
    assert dashboard["uid"] and dashboard["title"]
    panels = list(_walk(dashboard["panels"]))
    ids = [p["id"] for p in panels if "gridPos" in p]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert "datasource" in variables
    for panel in panels:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
        grid = panel.get("gridPos")
        if grid is not None:
            assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]


def test_the_metric_name_reader_sees_through_promql() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le) (rate(a_bucket{nodepool=~"$pool", x="y{z}"}'
        "[$__rate_interval]))) / on (le) group_left (k) b_total offset 5m or vector(0)"
    )
    assert metric_names(expr) == {"a_bucket", "b_total"}
    assert metric_names("sum(x) by (instance_id) > bool 1 and y") == {"x", "y"}
