"""Scenario files: the examples load, bad files fail with a message a user can act on."""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from spotwright.catalog import Catalog, load_catalog
from spotwright.model import labels as wk
from spotwright.model.durations import NEVER, format_duration, parse_duration
from spotwright.model.errors import ScenarioError
from spotwright.model.objects import (
    Deployment,
    LabelSelector,
    NodeSelectorRequirement,
    PodAffinityTerm,
    PreferredSchedulingTerm,
    TopologySpreadConstraint,
    WeightedPodAffinityTerm,
)
from spotwright.model.resources import Resources
from spotwright.model.scenario import (
    CapacityEvent,
    InterruptEvent,
    QuotaEvent,
    ScaleEvent,
    Scenario,
    bundled_example,
    default_scenario_path,
    examples_dir,
    load_scenario,
    parse_scenario,
)

ROOT = Path(__file__).resolve().parents[1]
REPO_EXAMPLES = ROOT / "examples"
BAD = Path(__file__).resolve().parent / "data" / "bad"
GIB = 2**30


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def scenario(spec: dict[str, Any], catalog: Catalog) -> Scenario:
    """Parse a minimal scenario around ``spec`` (a default NodePool when none is given)."""
    data = {
        "apiVersion": "spotwright.io/v1alpha1",
        "kind": "Scenario",
        "metadata": {"name": "t"},
        "spec": {"duration": "1h", "nodePools": [{"metadata": {"name": "default"}}], **spec},
    }
    return parse_scenario(data, source="test.yaml", catalog=catalog)


# ---------------------------------------------------------------------------------------
# Examples


def example_names() -> list[str]:
    return sorted(p.name for p in examples_dir().glob("*.yaml"))


def test_the_bundled_examples_are_the_expected_set() -> None:
    assert example_names() == [
        "day-100-nodes.yaml",
        "default.yaml",
        "mixed-node-group.yaml",
        "on-demand-shortage.yaml",
        "spot-fleet-rebalance.yaml",
        "spot-fleet.yaml",
        "spot-interruption.yaml",
        "spot-quota.yaml",
        "spot-shortage.yaml",
    ]


def test_repo_examples_are_identical_copies_of_the_bundled_ones() -> None:
    repo = sorted(p.name for p in REPO_EXAMPLES.glob("*.yaml"))
    assert repo == example_names()
    for name in repo:
        assert (REPO_EXAMPLES / name).read_bytes() == (examples_dir() / name).read_bytes(), name


@pytest.mark.parametrize("name", example_names())
def test_every_example_loads_and_starts_with_a_comment(name: str, catalog: Catalog) -> None:
    path = examples_dir() / name
    assert path.read_text().startswith(f"# {name} - ")
    loaded = load_scenario(path, catalog)
    assert (loaded.nodepools or loaded.nodegroups) and loaded.deployments()
    assert loaded.events == sorted(loaded.events, key=lambda e: e.at)
    assert all(e.at <= loaded.duration for e in loaded.events)


def test_default_scenario_tells_the_gpu_fallback_story(catalog: Catalog) -> None:
    assert default_scenario_path() == bundled_example("default")
    s = load_scenario(default_scenario_path(), catalog)
    assert (s.duration, s.seed, s.region) == (3600.0, 1, "us-east-1")
    assert s.zones == ("us-east-1a", "us-east-1b", "us-east-1c")
    (pool,) = s.nodepools
    reqs = pool.requirements()
    assert NodeSelectorRequirement(wk.INSTANCE_FAMILY, "In", ("g4dn",)) in reqs
    assert NodeSelectorRequirement(wk.CAPACITY_TYPE, "In", ("spot", "on-demand")) in reqs
    (resnet,) = s.deployments()
    assert resnet.name == "resnet" and resnet.replicas == 2
    assert resnet.template.requests == Resources(cpu=3000, memory=8 * GIB, gpu=1, pods=1)
    (pdb,) = s.pdbs()
    assert (pdb.name, pdb.min_available, pdb.selector) == ("resnet", 1, {"app": "resnet"})
    capacity, scale, interrupt = s.events
    assert isinstance(capacity, CapacityEvent)
    assert (capacity.at, capacity.capacity_type, capacity.available) == (240.0, "spot", False)
    assert capacity.for_seconds == 1200.0
    assert all(t.startswith("g4dn.") for t in capacity.instance_types)
    assert capacity.zones is None  # omitted: every zone
    assert scale == ScaleEvent(at=300.0, workload="resnet", replicas=6)
    assert isinstance(interrupt, InterruptEvent)
    assert (interrupt.at, interrupt.count, interrupt.capacity_type) == (2100.0, 1, "spot")
    assert s.market.interruptions == "none"


def test_spot_interruption_example_matches_the_source_document(catalog: Catalog) -> None:
    s = load_scenario(REPO_EXAMPLES / "spot-interruption.yaml", catalog)
    (pool,) = s.nodepools
    assert NodeSelectorRequirement(wk.CAPACITY_TYPE, "In", ("spot",)) in pool.requirements()
    assert NodeSelectorRequirement(wk.INSTANCE_CATEGORY, "In", ("c", "m", "r")) in (
        pool.requirements()
    )
    limits = pool.limits()
    assert limits is not None and (limits.cpu, limits.memory) == (1_000_000, 1000 * GIB)
    assert pool.expire_after == math.inf
    (inflate,) = s.deployments()
    assert inflate.replicas == 2
    assert inflate.template.node_selector == {"eks-immersion-team": "my-team"}
    assert [p.min_available for p in s.pdbs()] == [1]
    assert s.events == [InterruptEvent(at=600.0, count=1, capacity_type="spot")]
    assert s.duration == 1800.0


def test_quota_and_day_examples_carry_their_market_settings(catalog: Catalog) -> None:
    quota = load_scenario(bundled_example("spot-quota"), catalog)
    assert quota.events[0] == QuotaEvent(at=0.0, capacity_type="spot", max_instances=1)
    day = load_scenario(bundled_example("day-100-nodes.yaml"), catalog)
    assert day.duration == 24 * 3600
    assert (day.market.interruptions, day.market.rebalance_lead_seconds) == ("advisor", 300.0)
    requested = sum(d.template.requests.cpu * d.replicas for d in day.deployments())
    assert 350_000 <= requested <= 500_000  # about 100 nodes at the base load


# ---------------------------------------------------------------------------------------
# Bad files: each names the file, the place in it, what was expected and what it got

BAD_CASES = [
    ("unknown-key", "spec.nodePools[0].spec.limts", 'unknown key "limts" (expected one of: '),
    ("wrong-type", "spec.workloads[0].replicas", 'expected an integer, got "two"'),
    ("weight-out-of-range", "spec.nodePools[0].spec.weight", "expected a value ≤ 100, got 500"),
    ("negative-replicas", "spec.workloads[0].replicas", "expected a value ≥ 0, got -1"),
    ("negative-duration", "spec.duration", 'not negative, got "-5m"'),
    ("event-after-end", "spec.events[0].at", "within the scenario's duration (30m), got 45m"),
    (
        "bad-capacity-type",
        "spec.events[0].capacity.capacityType",
        "expected one of 'spot', 'on-demand' or 'reserved', got \"cheap\"",
    ),
    (
        "gt-two-values",
        "spec.nodePools[0].spec.template.spec.requirements[1].values",
        'expected exactly one integer value for Gt, got ["2", "4"]',
    ),
    (
        "unknown-instance-type",
        "spec.nodePools[0].spec.template.spec.requirements[1].values[0]",
        'unknown instance type "m5.lage"; did you mean m5.large',
    ),
    ("unknown-workload", "spec.events[0].scale.workload", 'workload (web), got "webb"'),
    (
        "zone-outside-scenario",
        "spec.nodePools[0].spec.template.spec.requirements[1].values[0]",
        '(us-east-1a, us-east-1b, us-east-1c), got "us-east-1d"',
    ),
    ("short-form-unknown-key", "spec.workloads[0].image", 'unknown key "image"'),
    ("two-event-kinds", "spec.events[0]", "got scale, quota"),
    ("pdb-both-bounds", "spec.workloads[0].pdb", "got both"),
    ("not-a-scenario", "kind", "expected 'Scenario', got \"NodePool\""),
    ("bad-syntax", "line 8 column 12", "invalid YAML: mapping values are not allowed"),
    ("duplicate-key", "line 10 column 3", 'found duplicate key "duration"'),
]


def test_every_bad_file_has_a_case() -> None:
    assert sorted(p.stem for p in BAD.glob("*.yaml")) == sorted(c[0] for c in BAD_CASES)


@pytest.mark.parametrize(("name", "where", "what"), BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_file_is_reported_with_file_path_and_expectation(
    name: str, where: str, what: str, catalog: Catalog
) -> None:
    path = BAD / f"{name}.yaml"
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path, catalog)
    lines = str(caught.value).splitlines()
    matching = [line for line in lines if line.startswith(f"{path}: {where}: ")]
    assert matching, lines
    assert any(what in line for line in matching), lines
    # Never a pydantic traceback or its wording.
    error = caught.value
    assert error.__cause__ is None
    assert error.__context__ is None or error.__suppress_context__
    assert "Input should be" not in str(caught.value)
    assert "pydantic" not in str(caught.value)


def test_unknown_key_lists_the_accepted_keys(catalog: Catalog) -> None:
    with pytest.raises(ScenarioError) as caught:
        load_scenario(BAD / "unknown-key.yaml", catalog)
    assert "(expected one of: template, limits, weight, disruption)" in str(caught.value)


def test_missing_file_says_so(tmp_path: Path, catalog: Catalog) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path, catalog)
    assert str(caught.value) == f"{path}: no such file"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "got an empty file"),
        ("- a\n- b\n", "expected a Scenario mapping"),
        ("a: 1\n---\nb: 2\n", "expected one YAML document, got 2"),
    ],
)
def test_files_that_are_not_one_mapping(
    tmp_path: Path, catalog: Catalog, text: str, message: str
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError, match=message):
        load_scenario(path, catalog)


def test_all_problems_are_reported_at_once(catalog: Catalog) -> None:
    with pytest.raises(ScenarioError) as caught:
        scenario(
            {
                "seed": "one",
                "workloads": [{"name": "a", "replicas": -1}, {"name": "b", "requests": {"x": 1}}],
                "market": {"bootSeconds": 0},
            },
            catalog,
        )
    paths = [p.path for p in caught.value.problems]
    assert paths == [
        "spec.seed",
        "spec.workloads[0].replicas",
        "spec.workloads[1].requests.x",
        "spec.market.bootSeconds",
    ]


def test_semantic_problems_are_collected_across_the_file(catalog: Catalog) -> None:
    with pytest.raises(ScenarioError) as caught:
        scenario(
            {
                "zones": ["us-east-1a", "eu-west-1a"],
                "workloads": [{"name": "web"}, {"name": "web"}],
                "events": [
                    {"at": "1m", "interrupt": {"instanceType": "m5.xlage", "zone": "us-east-1c"}},
                    {
                        "at": "2m",
                        "capacity": {
                            "capacityType": "spot",
                            "available": True,
                            "instanceTypes": ["m5.large", "zz.top"],
                        },
                    },
                ],
            },
            catalog,
        )
    assert [p.path for p in caught.value.problems] == [
        "spec.zones[1]",
        "spec.workloads[1].name",
        "spec.events[0].interrupt.instanceType",
        "spec.events[0].interrupt.zone",
        "spec.events[1].capacity.instanceTypes[1]",
    ]
    assert "did you mean m5.xlarge" in str(caught.value)


def test_keys_with_dots_are_quoted_in_paths(catalog: Catalog) -> None:
    with pytest.raises(ScenarioError) as caught:
        scenario({"workloads": [{"name": "w", "requests": {"nvidia.com/gpu": 1.5}}]}, catalog)
    assert str(caught.value) == (
        'test.yaml: spec.workloads[0].requests["nvidia.com/gpu"]: expected a whole number, got 1.5'
    )


def test_unsupported_manifest_kind_names_the_supported_ones(catalog: Catalog) -> None:
    with pytest.raises(ScenarioError) as caught:
        scenario({"workloads": [{"apiVersion": "apps/v1", "kind": "StatefulSet"}]}, catalog)
    assert "spec.workloads[0].kind: expected one of 'Deployment' or 'PodDisruptionBudget'" in (
        str(caught.value)
    )


# ---------------------------------------------------------------------------------------
# Defaults and events


def test_defaults(catalog: Catalog) -> None:
    s = scenario({}, catalog)
    assert (s.region, s.seed, s.zones) == (
        "us-east-1",
        1,
        ("us-east-1a", "us-east-1b", "us-east-1c"),
    )
    assert (s.market.interruptions, s.market.rebalance_lead_seconds) == ("advisor", None)
    assert s.market.boot_seconds == 35.0
    assert s.events == [] and s.deployments() == [] and s.pdbs() == []


def test_region_sets_the_default_zones(catalog: Catalog) -> None:
    s = scenario({"region": "eu-west-1"}, catalog)
    assert s.zones == ("eu-west-1a", "eu-west-1b", "eu-west-1c")


def test_events_are_typed_and_sorted_by_time(catalog: Catalog) -> None:
    s = scenario(
        {
            "workloads": [{"name": "web"}],
            "events": [
                {"at": "30m", "quota": {"capacityType": "spot", "maxInstances": 0, "for": "5m"}},
                {"at": "10m", "scale": {"workload": "web", "replicas": 3}},
                {"at": 60, "interrupt": {"count": 2, "rebalanceLeadSeconds": 90}},
                {
                    "at": "10m",
                    "capacity": {
                        "capacityType": "on-demand",
                        "available": False,
                        "zones": ["us-east-1b"],
                    },
                },
            ],
        },
        catalog,
    )
    assert s.events == [
        InterruptEvent(at=60.0, count=2, rebalance_lead_seconds=90.0),
        ScaleEvent(at=600.0, workload="web", replicas=3),
        CapacityEvent(at=600.0, capacity_type="on-demand", available=False, zones=("us-east-1b",)),
        QuotaEvent(at=1800.0, capacity_type="spot", max_instances=0, for_seconds=300.0),
    ]
    assert [e.kind for e in s.events] == ["interrupt", "scale", "capacity", "quota"]


# ---------------------------------------------------------------------------------------
# Workloads: short form and manifests


def manifest(containers: list[dict[str, Any]], **pod_spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "annotations": {"spotwright.io/startup-seconds": "30"}},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": containers, **pod_spec},
            },
        },
    }


def as_dict(deployment: Deployment) -> dict[str, Any]:
    return {
        "name": deployment.name,
        "namespace": deployment.namespace,
        "replicas": deployment.replicas,
        "labels": deployment.labels,
        "template": dataclasses.asdict(deployment.template),
    }


def test_short_form_and_manifest_give_the_same_deployment(catalog: Catalog) -> None:
    toleration = {"key": "dedicated", "operator": "Equal", "value": "web", "effect": "NoSchedule"}
    short = {
        "name": "web",
        "replicas": 3,
        "requests": {"cpu": "1500m", "memory": "2Gi"},
        "nodeSelector": {"karpenter.sh/capacity-type": "spot"},
        "tolerations": [toleration],
        "startupSeconds": 30,
        "terminationGracePeriodSeconds": 45,
        "pdb": {"maxUnavailable": "25%"},
    }
    full = manifest(
        [
            {
                "name": "app",
                "image": "nginx:1.27",
                "ports": [{"containerPort": 80}],
                "env": [{"name": "A", "value": "b"}],
                "resources": {"requests": {"cpu": "1", "memory": "1536Mi"}},
            },
            {"name": "sidecar", "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}}},
        ],
        nodeSelector={"karpenter.sh/capacity-type": "spot"},
        tolerations=[toleration],
        terminationGracePeriodSeconds=45,
    )
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "web"},
        "spec": {"maxUnavailable": "25%", "selector": {"matchLabels": {"app": "web"}}},
    }
    from_short = scenario({"workloads": [short]}, catalog)
    from_manifest = scenario({"workloads": [full, pdb]}, catalog)
    (a,), (b,) = from_short.deployments(), from_manifest.deployments()
    assert as_dict(a) == as_dict(b)
    assert a.template.requests == Resources(cpu=1500, memory=2 * GIB, pods=1)
    assert a.template.owner == "web" and a.template.startup_seconds == 30.0
    assert a.labels == a.template.labels == {"app": "web"}
    assert [dataclasses.asdict(p) for p in from_short.pdbs()] == [
        dataclasses.asdict(p) for p in from_manifest.pdbs()
    ]


def test_short_form_defaults(catalog: Catalog) -> None:
    (web,) = scenario({"workloads": [{"name": "web"}]}, catalog).deployments()
    assert (web.replicas, web.labels, web.template.labels) == (1, {"app": "web"}, {"app": "web"})
    assert (web.template.startup_seconds, web.template.grace_seconds) == (10.0, 30.0)
    assert web.template.requests == Resources(pods=1)


def test_effective_request_is_the_larger_of_init_and_app_containers(catalog: Catalog) -> None:
    containers = [
        {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
        {"name": "b", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
    ]
    init = [
        {"name": "migrate", "resources": {"requests": {"cpu": "3", "memory": "512Mi"}}},
        {"name": "warm", "resources": {"requests": {"cpu": "500m", "memory": "4Gi"}}},
    ]
    (d,) = scenario(
        {"workloads": [manifest(containers, initContainers=init)]}, catalog
    ).deployments()
    # cpu: max(3, 1 + 1); memory: max(4Gi, 1Gi + 1Gi), per dimension.
    assert d.template.requests == Resources(cpu=3000, memory=4 * GIB, pods=1)


def test_sidecars_add_to_later_init_containers_and_to_the_app(catalog: Catalog) -> None:
    containers = [{"name": "app", "resources": {"requests": {"cpu": "1"}}}]
    init = [
        {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}},
        {"name": "setup", "resources": {"requests": {"cpu": "2"}}},
    ]
    (d,) = scenario(
        {"workloads": [manifest(containers, initContainers=init)]}, catalog
    ).deployments()
    assert d.template.requests.cpu == 2500  # setup runs beside the already-started proxy


def test_requests_default_to_limits_per_container(catalog: Catalog) -> None:
    containers = [
        {
            "name": "a",
            "resources": {"limits": {"cpu": "2", "nvidia.com/gpu": 1}, "requests": {"cpu": "1"}},
        }
    ]
    (d,) = scenario({"workloads": [manifest(containers)]}, catalog).deployments()
    assert (d.template.requests.cpu, d.template.requests.gpu) == (1000, 1)


MANIFEST_WITH_CONSTRAINTS = """
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: shop
spec:
  replicas: 4
  strategy: {type: RollingUpdate}
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web, tier: front}
    spec:
      serviceAccountName: web
      priorityClassName: system-node-critical
      nodeSelector:
        failure-domain.beta.kubernetes.io/zone: us-east-1a
      overhead: {cpu: 250m, memory: 120Mi}
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
              - matchExpressions:
                  - {key: beta.kubernetes.io/arch, operator: In, values: [arm64]}
              - matchExpressions:
                  - {key: karpenter.k8s.aws/instance-cpu, operator: Gt, values: [4]}
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 50
              preference:
                matchExpressions:
                  - {key: karpenter.sh/capacity-type, operator: In, values: [spot]}
        podAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            - topologyKey: topology.kubernetes.io/zone
              labelSelector:
                matchLabels: {app: cache}
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            - topologyKey: kubernetes.io/hostname
              labelSelector:
                matchExpressions:
                  - {key: app, operator: In, values: [web]}
            - topologyKey: kubernetes.io/hostname   # no selector: matches no pod
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 10
              podAffinityTerm:
                topologyKey: topology.kubernetes.io/zone
                namespaces: [shop]
                labelSelector: {}
      topologySpreadConstraints:
        - maxSkew: 1
          topologyKey: topology.kubernetes.io/zone
          whenUnsatisfiable: ScheduleAnyway
          labelSelector:
            matchLabels: {app: web}
          matchLabelKeys: [pod-template-hash]
      containers:
        - name: web
          image: nginx:1.27
          livenessProbe: {httpGet: {path: /, port: 80}}
          resources:
            requests: {cpu: "1"}
"""


def test_manifest_scheduling_constraints_are_read(catalog: Catalog) -> None:
    manifest_data = yaml.safe_load(MANIFEST_WITH_CONSTRAINTS)
    (d,) = scenario({"workloads": [manifest_data]}, catalog).deployments()
    pod = d.template
    assert (d.namespace, pod.namespace, d.labels) == ("shop", "shop", {"app": "web"})
    assert pod.node_selector == {wk.ZONE: "us-east-1a"}
    assert pod.required_affinity == (
        (NodeSelectorRequirement(wk.ARCH, "In", ("arm64",)),),
        (NodeSelectorRequirement(wk.INSTANCE_CPU, "Gt", ("4",)),),
    )
    assert pod.preferred_affinity == (
        PreferredSchedulingTerm(50, (NodeSelectorRequirement(wk.CAPACITY_TYPE, "In", ("spot",)),)),
    )
    assert pod.pod_affinity == (PodAffinityTerm(wk.ZONE, LabelSelector.of({"app": "cache"})),)
    assert pod.pod_anti_affinity == (
        PodAffinityTerm(
            wk.HOSTNAME,
            LabelSelector(match_expressions=(NodeSelectorRequirement("app", "In", ("web",)),)),
        ),
    )
    assert pod.preferred_pod_anti_affinity == (
        WeightedPodAffinityTerm(10, PodAffinityTerm(wk.ZONE, LabelSelector(), ("shop",))),
    )
    assert pod.topology_spread == (
        TopologySpreadConstraint(
            wk.ZONE, 1, "ScheduleAnyway", LabelSelector.of({"app": "web"}), None
        ),
    )
    assert pod.overhead == Resources(cpu=250, memory=120 * 2**20)
    assert (pod.priority_class, pod.priority) == ("system-node-critical", 2_000_001_000)
    assert pod.startup_seconds == 10.0


def test_typos_inside_modelled_manifest_parts_are_still_errors(catalog: Catalog) -> None:
    manifest_data = yaml.safe_load(MANIFEST_WITH_CONSTRAINTS)
    pod_spec = manifest_data["spec"]["template"]["spec"]
    pod_spec["affinity"]["podAntiAfinity"] = pod_spec["affinity"].pop("podAntiAffinity")
    pod_spec["topologySpreadConstraints"][0]["whenUnsatisfiable"] = "Never"
    with pytest.raises(ScenarioError) as caught:
        scenario({"workloads": [manifest_data]}, catalog)
    base = "spec.workloads[0].spec.template.spec"
    assert [p.path for p in caught.value.problems] == [
        f"{base}.affinity.podAntiAfinity",
        f"{base}.topologySpreadConstraints[0].whenUnsatisfiable",
    ]


def test_manifest_problems_point_into_the_manifest(catalog: Catalog) -> None:
    bad = manifest([{"name": "a"}])
    bad["metadata"]["annotations"]["spotwright.io/startup-seconds"] = "soon"
    bad["spec"]["selector"]["matchLabels"] = {"app": "other"}
    with pytest.raises(ScenarioError) as caught:
        scenario({"workloads": [bad]}, catalog)
    assert [p.path for p in caught.value.problems] == [
        'spec.workloads[0].metadata.annotations["spotwright.io/startup-seconds"]',
        "spec.workloads[0].spec.selector.matchLabels",
    ]


def test_deployments_are_fresh_each_call(catalog: Catalog) -> None:
    s = scenario({"workloads": [{"name": "web", "replicas": 2}]}, catalog)
    first = s.deployments()[0]
    first.replicas = 99
    first.template.labels["x"] = "y"
    assert s.deployments()[0].replicas == 2
    assert s.deployments()[0].template.labels == {"app": "web"}


def test_parse_scenario_does_not_mutate_its_input(catalog: Catalog) -> None:
    spec = {"workloads": [{"name": "web"}]}
    before = copy.deepcopy(spec)
    scenario(spec, catalog)
    assert spec == before


# ---------------------------------------------------------------------------------------
# Durations


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("10m", 600),
        ("2h", 7200),
        ("1h30m", 5400),
        ("1.5h", 5400),
        (45, 45),
        (2.5, 2.5),
        ("300", 300),
        ("1m30s", 90),
        ("250ms", 0.25),
        ("0s", 0),
    ],
)
def test_parse_duration(text: str | int | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "-5m", "10x", "1m1h", "m", "1h 30m", "Never", "nan", "-1"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="expected"):
        parse_duration(text)


def test_never_only_where_allowed() -> None:
    assert parse_duration("Never", allow_never=True) == NEVER == math.inf
    with pytest.raises(ValueError, match="finite"):
        parse_duration("Never")
    with pytest.raises(ValueError):
        parse_duration(True)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (3900, "1h05m"),
        (180, "3m"),
        (45, "45s"),
        (0, "0s"),
        (3600, "1h00m"),
        (3661, "1h01m01s"),
        (65.5, "1m05.5s"),
        (math.inf, "Never"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@given(st.integers(min_value=0, max_value=10**7))
def test_format_then_parse_round_trips_whole_seconds(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


@given(st.floats(min_value=0, max_value=10**7, allow_nan=False, allow_infinity=False))
def test_format_then_parse_round_trips_fractions(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds, abs=1e-6)
