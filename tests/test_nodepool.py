"""NodePools: Karpenter's v1 shape accepted as is, turned into what the provisioner reads."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import pytest
import yaml

from spotwright.model import labels as wk
from spotwright.model.errors import ScenarioError
from spotwright.model.nodepool import UNLIMITED, NodePool, check_nodepool, parse_nodepool
from spotwright.model.objects import NodeSelectorRequirement, Taint
from spotwright.model.resources import Resources

GIB = 2**30

KARPENTER_NODEPOOL = """
apiVersion: karpenter.sh/v1
kind: NodePool
metadata:
  name: default
  uid: 0d6a4c1e-0000-4000-8000-000000000000
  resourceVersion: "12345"
spec:
  template:
    metadata:
      labels:
        team: checkout
    spec:
      nodeClassRef:
        group: karpenter.k8s.aws
        kind: EC2NodeClass
        name: default
      requirements:
        - key: karpenter.k8s.aws/instance-category
          operator: In
          values: ["c", "m", "r"]
          minValues: 2
        - key: karpenter.k8s.aws/instance-generation
          operator: Gte
          values: ["5"]
        - key: karpenter.k8s.aws/instance-cpu
          operator: Lte
          values: ["16"]
        - key: beta.kubernetes.io/arch
          operator: In
          values: ["amd64"]
        - key: example.com/tier
          operator: Exists
      taints:
        - key: example.com/dedicated
          value: checkout
          effect: NoSchedule
      startupTaints:
        - key: node.cilium.io/agent-not-ready
          effect: NoExecute
      expireAfter: Never
      terminationGracePeriod: 48h
  limits:
    cpu: "1000"
    memory: 1000Gi
    nodes: 50
  weight: 20
  disruption:
    consolidationPolicy: WhenEmptyOrUnderutilized
    consolidateAfter: 1m
    budgets:
      - nodes: "20%"
        reasons: [Empty, Drifted]
      - nodes: "0"
        schedule: "@daily"
        duration: 10m
status:
  nodes: 3
"""


class FakeCatalog:
    """Just enough catalog for the checks: names and membership."""

    def __init__(self, names: Iterable[str]) -> None:
        self._names = tuple(names)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def names(self) -> tuple[str, ...]:
        return self._names


CATALOG = FakeCatalog(["m5.large", "m5.xlarge", "c5.large", "g4dn.xlarge"])


def pool(spec: dict[str, Any] | None = None, **top: Any) -> NodePool:
    return NodePool.model_validate({"metadata": {"name": "p"}, "spec": spec or {}, **top})


def requirement(key: str, operator: str, *values: Any, **extra: Any) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values), **extra}


def with_requirements(*reqs: dict[str, Any]) -> dict[str, Any]:
    return {"template": {"spec": {"requirements": list(reqs)}}}


def test_a_real_karpenter_nodepool_is_accepted_unchanged() -> None:
    p = parse_nodepool(yaml.safe_load(KARPENTER_NODEPOOL), source="np.yaml", catalog=CATALOG)
    assert (p.name, p.weight) == ("default", 20)
    assert p.requirements() == (
        NodeSelectorRequirement(wk.INSTANCE_CATEGORY, "In", ("c", "m", "r"), min_values=2),
        NodeSelectorRequirement(wk.INSTANCE_GENERATION, "Gt", ("4",)),
        NodeSelectorRequirement(wk.INSTANCE_CPU, "Lt", ("17",)),
        NodeSelectorRequirement(wk.ARCH, "In", ("amd64",)),
        NodeSelectorRequirement("example.com/tier", "Exists"),
        NodeSelectorRequirement("team", "In", ("checkout",)),
        NodeSelectorRequirement(wk.NODEPOOL, "In", ("default",)),
    )
    assert p.labels() == {"team": "checkout", wk.NODEPOOL: "default"}
    assert p.taints() == (Taint("example.com/dedicated", "NoSchedule", "checkout"),)
    assert p.startup_taints() == (Taint("node.cilium.io/agent-not-ready", "NoExecute"),)
    assert p.limits() == Resources(
        cpu=1_000_000, memory=1000 * GIB, gpu=UNLIMITED, pods=UNLIMITED, ephemeral=UNLIMITED
    )
    assert p.node_limit() == 50
    assert p.expire_after == math.inf
    assert p.termination_grace_period == 48 * 3600
    assert p.disruption.consolidate_after == 60
    assert [b.nodes for b in p.disruption.budgets] == ["20%", "0"]


def test_defaults_follow_karpenter() -> None:
    p = pool()
    assert p.weight == 0
    assert p.limits() is None and p.node_limit() is None
    assert p.expire_after == 720 * 3600
    assert p.termination_grace_period is None
    assert p.disruption.consolidation_policy == "WhenEmptyOrUnderutilized"
    assert [b.nodes for b in p.disruption.budgets] == ["10%"]
    assert p.requirements() == (NodeSelectorRequirement(wk.NODEPOOL, "In", ("p",)),)
    assert p.taints() == () and p.startup_taints() == ()


def test_spotwright_api_group_is_accepted_too() -> None:
    assert pool(apiVersion="spotwright.io/v1alpha1").api_version == "spotwright.io/v1alpha1"


def test_limits_on_nodes_only_leave_resources_unlimited() -> None:
    p = pool({"limits": {"nodes": "10"}})
    assert p.limits() is None and p.node_limit() == 10
    gpu = pool({"limits": {"nvidia.com/gpu": 8}}).limits()
    assert gpu is not None and (gpu.gpu, gpu.cpu) == (8, UNLIMITED)


def test_a_label_already_required_is_not_repeated() -> None:
    p = pool(
        {
            "template": {
                "metadata": {"labels": {"team": "a"}},
                "spec": {"requirements": [requirement("team", "In", "a")]},
            }
        }
    )
    assert p.requirements().count(NodeSelectorRequirement("team", "In", ("a",))) == 1


def test_integer_values_are_read_as_strings() -> None:
    p = pool(with_requirements(requirement(wk.INSTANCE_CPU, "Gt", 4)))
    assert p.requirements()[0] == NodeSelectorRequirement(wk.INSTANCE_CPU, "Gt", ("4",))


def problems_of(data: dict[str, Any], **context: Any) -> list[tuple[str, str]]:
    with pytest.raises(ScenarioError) as caught:
        parse_nodepool(data, source="np.yaml", **context)
    return [(p.path, p.message) for p in caught.value.problems]


def only_problem(spec: dict[str, Any], **context: Any) -> tuple[str, str]:
    (problem,) = problems_of({"metadata": {"name": "p"}, "spec": spec}, **context)
    return problem


REQ = "spec.template.spec.requirements[0]"


@pytest.mark.parametrize(
    ("req", "where", "message"),
    [
        (requirement(wk.ARCH, "In"), "values", "expected at least one value for In, got none"),
        (requirement(wk.ARCH, "NotIn"), "values", "at least one value for NotIn"),
        (requirement(wk.ARCH, "Exists", "amd64"), "values", 'no values for Exists, got ["amd64"]'),
        (
            requirement(wk.INSTANCE_CPU, "Gt", "2", "4"),
            "values",
            "exactly one integer value for Gt",
        ),
        (requirement(wk.INSTANCE_CPU, "Lt", "many"), "values", 'for Lt, got ["many"]'),
        (requirement(wk.INSTANCE_CPU, "Gte"), "values", "exactly one integer value for Gte"),
        (requirement(wk.ARCH, "Matches", "x"), "operator", 'got "Matches"'),
        (requirement(wk.ARCH, "In", "amd64", minValues=2), "minValues", "at most the 1 value"),
        (requirement(wk.ARCH, "In", "amd64", minValues=51), "minValues", "≤ 50, got 51"),
        (requirement("bad key!", "Exists"), "key", "expected a label key like app"),
    ],
)
def test_requirement_rules(req: dict[str, Any], where: str, message: str) -> None:
    path, text = only_problem(with_requirements(req))
    assert path == f"{REQ}.{where}"
    assert message in text


@pytest.mark.parametrize(
    ("req", "where", "message"),
    [
        (requirement(wk.CAPACITY_TYPE, "In", "spot", "cheap"), "values[1]", 'got "cheap"'),
        (requirement(wk.ZONE, "In", "us-east-1d"), "values[0]", 'got "us-east-1d"'),
        (
            requirement(wk.INSTANCE_TYPE, "In", "m5.lage"),
            "values[0]",
            'unknown instance type "m5.lage"; did you mean m5.large',
        ),
        (
            requirement(wk.INSTANCE_FAMILY, "In", "g4dx"),
            "values[0]",
            'unknown instance family "g4dx"; did you mean g4dn?',
        ),
        (requirement("karpenter.sh/foo", "Exists"), "key", "karpenter.sh domain is restricted"),
        (requirement(wk.HOSTNAME, "Exists"), "key", "set per node"),
        (
            requirement("karpenter.k8s.aws/instance-hypervisor", "In", "nitro"),
            "key",
            "spotwright knows only these karpenter.k8s.aws labels",
        ),
    ],
)
def test_requirement_checks_with_context(req: dict[str, Any], where: str, message: str) -> None:
    path, text = only_problem(with_requirements(req), zones=["us-east-1a"], catalog=CATALOG)
    assert path == f"{REQ}.{where}"
    assert message in text


def test_context_checks_are_skipped_without_context() -> None:
    reqs = with_requirements(
        requirement(wk.ZONE, "In", "us-east-1d"), requirement(wk.INSTANCE_TYPE, "In", "m9.huge")
    )
    assert parse_nodepool({"metadata": {"name": "p"}, "spec": reqs}, source="np.yaml")


def test_custom_keys_are_allowed_well_known_aliases_too() -> None:
    reqs = with_requirements(
        requirement("example.com/team", "In", "a"),
        requirement("failure-domain.beta.kubernetes.io/zone", "In", "us-east-1a"),
    )
    p = parse_nodepool(
        {"metadata": {"name": "p"}, "spec": reqs}, source="np.yaml", zones=["us-east-1a"]
    )
    assert NodeSelectorRequirement(wk.ZONE, "In", ("us-east-1a",)) in p.requirements()


def test_restricted_template_labels_are_rejected() -> None:
    spec = {"template": {"metadata": {"labels": {"karpenter.sh/custom": "x"}}}}
    path, text = only_problem(spec)
    assert path == 'spec.template.metadata.labels["karpenter.sh/custom"]'
    assert "restricted" in text


@pytest.mark.parametrize(
    ("spec", "where", "message"),
    [
        ({"weight": 0}, "spec.weight", "≥ 1, got 0"),
        ({"weight": 101}, "spec.weight", "≤ 100, got 101"),
        ({"weight": "high"}, "spec.weight", 'expected an integer, got "high"'),
        ({"limits": {"cpu": "lots"}}, "spec.limits.cpu", "Kubernetes quantity"),
        ({"limits": {"gpus": 1}}, "spec.limits.gpus", "(expected one of: cpu, memory, nodes, "),
        ({"limts": {}}, "spec.limts", 'unknown key "limts"'),
        (
            {"disruption": {"consolidationPolicy": "WhenUnderutilized"}},
            "spec.disruption.consolidationPolicy",
            "renamed WhenUnderutilized to WhenEmptyOrUnderutilized",
        ),
        (
            {"disruption": {"budgets": [{"nodes": "101%"}]}},
            "spec.disruption.budgets[0].nodes",
            "a node count or a percentage",
        ),
        (
            {"disruption": {"budgets": [{"nodes": "1", "schedule": "@daily"}]}},
            "spec.disruption.budgets[0]",
            "schedule and duration to be set together",
        ),
        (
            {"disruption": {"budgets": [{"schedule": "daily", "duration": "1h"}]}},
            "spec.disruption.budgets[0].schedule",
            "cron schedule",
        ),
        (
            {"template": {"spec": {"expireAfter": "forever"}}},
            "spec.template.spec.expireAfter",
            "or Never",
        ),
        (
            {"template": {"spec": {"terminationGracePeriod": "Never"}}},
            "spec.template.spec.terminationGracePeriod",
            "finite duration",
        ),
        (
            {"template": {"spec": {"taints": [{"key": "a", "effect": "Sometimes"}]}}},
            "spec.template.spec.taints[0].effect",
            'got "Sometimes"',
        ),
    ],
)
def test_spec_rules(spec: dict[str, Any], where: str, message: str) -> None:
    path, text = only_problem(spec)
    assert path == where
    assert message in text


def test_v1beta1_is_rejected_with_a_hint() -> None:
    problems = problems_of({"apiVersion": "karpenter.sh/v1beta1", "metadata": {"name": "p"}})
    assert problems == [
        (
            "apiVersion",
            "expected one of 'karpenter.sh/v1' or 'spotwright.io/v1alpha1', got "
            '"karpenter.sh/v1beta1" (karpenter.sh/v1beta1 NodePools must be converted to '
            "karpenter.sh/v1)",
        )
    ]


def test_name_is_required_and_must_be_a_dns_name() -> None:
    assert problems_of({"metadata": {}}) == [("metadata.name", "required key missing")]
    ((path, text),) = problems_of({"metadata": {"name": "Default_Pool"}})
    assert path == "metadata.name" and 'got "Default_Pool"' in text


def test_check_nodepool_prefixes_paths() -> None:
    p = pool(with_requirements(requirement(wk.ZONE, "In", "us-west-2a")))
    (problem,) = check_nodepool(p, zones=["us-east-1a"], prefix=("spec", "nodePools", 3))
    assert problem.path == f"spec.nodePools[3].{REQ}.values[0]"
