"""eksctl node groups as spotwright reads them: the walkthrough's group loads with eksctl's
defaults, and every mistake is reported with its place in the file and what was wrong."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spotwright.catalog import Catalog, load_catalog
from spotwright.model.errors import ScenarioError
from spotwright.model.nodegroup import (
    NODEGROUP_LABEL,
    NodeGroup,
    load_nodegroup_files,
    parse_cluster_config,
    parse_nodegroup,
)
from spotwright.model.scenario import parse_scenario
from spotwright.scheduling.distribution import Split, split


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


SEED_GROUP: dict[str, Any] = {
    # The nodeGroups item of the EKS + Spot walkthrough, as written there.
    "name": "ng-1",
    "minSize": 4,
    "maxSize": 8,
    "instancesDistribution": {
        "instanceTypes": ["t3.small", "t3.medium", "t3.large"],
        "onDemandBaseCapacity": 2,
        "onDemandPercentageAboveBaseCapacity": 0,
        "spotInstancePools": 2,
    },
}


def group(**changes: Any) -> dict[str, Any]:
    data = {**SEED_GROUP, **changes}
    return {k: v for k, v in data.items() if v is not None}


def distribution(**changes: Any) -> dict[str, Any]:
    return group(instancesDistribution={**SEED_GROUP["instancesDistribution"], **changes})


def problems(data: Any, catalog: Catalog | None = None) -> list[str]:
    with pytest.raises(ScenarioError) as caught:
        parse_nodegroup(data, source="ng.yaml", zones=("us-east-1a", "us-east-1b"), catalog=catalog)
    return [f"{p.path}: {p.message}" for p in caught.value.problems]


def test_the_walkthrough_group_loads_with_eksctl_defaults(catalog: Catalog) -> None:
    g = parse_nodegroup(SEED_GROUP, source="ng.yaml", catalog=catalog)
    assert (g.min, g.desired, g.max) == (4, 4, 8)
    assert g.instance_types == ("t3.small", "t3.medium", "t3.large")
    assert g.spot_allocation_strategy == "lowest-price"
    assert g.spot_instance_pools == 2
    assert not g.capacity_rebalance and g.max_price is None
    # "two on-demand for sure, the other two (minSize - base) all spot"
    assert split(g.desired, g.on_demand_base, g.on_demand_percentage) == Split(2, 2)
    assert g.node_labels() == {NODEGROUP_LABEL: "ng-1"}


def test_sizes_default_as_eksctl_defaults_them() -> None:
    bare = {"name": "ng", "instanceType": "m5.large"}
    g = NodeGroup.model_validate(bare)
    assert (g.min, g.desired, g.max) == (2, 2, 2)
    assert (g.on_demand_base, g.on_demand_percentage) == (0, 100), "a plain group is on-demand"
    g = NodeGroup.model_validate({**bare, "desiredCapacity": 5})
    assert (g.min, g.desired, g.max) == (5, 5, 5)
    g = NodeGroup.model_validate({**bare, "minSize": 1, "maxSize": 9})
    assert (g.min, g.desired, g.max) == (1, 1, 9)


def test_build_only_eksctl_fields_are_accepted_and_ignored() -> None:
    g = NodeGroup.model_validate(
        group(volumeSize=80, ssh={"allow": True}, iam={"withAddonPolicies": {}}, amiFamily="AL2")
    )
    assert g.name == "ng-1"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            distribution(onDemandPercentageAboveBaseCapacity=150),
            "instancesDistribution.onDemandPercentageAboveBaseCapacity: expected a value ≤ 100, "
            "got 150",
        ),
        (
            distribution(onDemandBaseCapacity=9),
            ": expected instancesDistribution.onDemandBaseCapacity ≤ maxSize (8), got 9",
        ),
        (
            distribution(spotAllocationStrategy="capacity-optimized"),
            "instancesDistribution: expected spotInstancePools only with spotAllocationStrategy: "
            "lowest-price",
        ),
        (
            distribution(spotAllocationStrategy="cheapest"),
            "instancesDistribution.spotAllocationStrategy: expected one of 'lowest-price', "
            "'capacity-optimized'",
        ),
        (
            distribution(spotInstancePools=21),
            "instancesDistribution.spotInstancePools: expected a value ≤ 20, got 21",
        ),
        (
            distribution(instanceTypes=["t3.small", "t3.small"]),
            'instancesDistribution.instanceTypes: expected each instance type once, got "t3.small"',
        ),
        (
            distribution(instanceTypes=[]),
            "instancesDistribution.instanceTypes: expected at least 1 item(s)",
        ),
        (
            distribution(maxPrice=0),
            "instancesDistribution.maxPrice: expected a price greater than 0",
        ),
        (distribution(maxPrice="cheap"), "instancesDistribution.maxPrice: expected a price in USD"),
        (
            distribution(onDemandBasCapacity=2),
            'instancesDistribution.onDemandBasCapacity: unknown key "onDemandBasCapacity" '
            "(expected one of: instanceTypes, maxPrice, onDemandBaseCapacity,",
        ),
        (group(desiredCapacity=9), ": expected desiredCapacity ≤ maxSize (8), got 9"),
        (group(desiredCapacity=1), ": expected desiredCapacity ≥ minSize (4), got 1"),
        (group(maxSize=3), ": expected maxSize ≥ minSize (4), got 3"),
        (group(minSize=-1), "minSize: expected a value ≥ 0, got -1"),
        (group(instanceType="t3.small"), ': expected instanceType to be "mixed" or unset'),
        (group(instancesDistribution=None), ": expected instancesDistribution (or a single"),
        (group(name="NG_1"), "name: expected a name of lowercase letters"),
        (
            group(labels={"karpenter.sh/capacity-type": "spot"}),
            'labels: expected a label key of your own, got "karpenter.sh/capacity-type"',
        ),
        (
            group(maxPodsPerNode=20),
            ': unsupported eksctl field "maxPodsPerNode": pods per node come from the instance',
        ),
        (
            group(spot=True),
            ': unsupported eksctl field "spot": that is a managedNodeGroups field',
        ),
        (group(minSzie=2), 'minSzie: unknown key "minSzie" (expected one of: name,'),
    ],
)
def test_mistakes_are_reported_with_their_place_and_reason(
    data: dict[str, Any], expected: str
) -> None:
    found = problems(data)
    assert any(line.startswith(expected) or expected in line for line in found), found


def test_types_and_zones_are_checked_against_the_catalog_and_the_scenario(
    catalog: Catalog,
) -> None:
    data = distribution(instanceTypes=["t3.small", "t3.mediun"])
    data["availabilityZones"] = ["us-east-1a", "us-east-1d"]
    assert problems(data, catalog) == [
        "instancesDistribution.instanceTypes[1]: expected an instance type from the catalog, got "
        'unknown instance type "t3.mediun"; did you mean t3.medium, t3a.medium, t2.medium?',
        "availabilityZones[1]: expected one of the scenario's zones (us-east-1a, us-east-1b), "
        'got "us-east-1d"',
    ]


def scenario(catalog: Catalog, **spec: Any) -> Any:
    data = {
        "apiVersion": "spotwright.io/v1alpha1",
        "kind": "Scenario",
        "metadata": {"name": "t"},
        "spec": {"duration": "1h", **spec},
    }
    return parse_scenario(data, source="s.yaml", catalog=catalog)


def test_a_scenario_may_have_node_groups_instead_of_node_pools(catalog: Catalog) -> None:
    s = scenario(catalog, nodeGroups=[SEED_GROUP])
    assert [g.name for g in s.nodegroups] == ["ng-1"] and s.nodepools == []


def test_a_scenario_needs_capacity_and_distinct_names(catalog: Catalog) -> None:
    with pytest.raises(ScenarioError, match="spec: expected at least one NodePool in nodePools"):
        scenario(catalog)
    with pytest.raises(ScenarioError) as caught:
        scenario(
            catalog,
            nodePools=[{"metadata": {"name": "ng-1"}}],
            nodeGroups=[SEED_GROUP, SEED_GROUP],
        )
    lines = str(caught.value).splitlines()
    assert lines == [
        "s.yaml: spec.nodeGroups[0].name: expected a name no other node group or NodePool has, "
        'got "ng-1" (NodePool)',
        "s.yaml: spec.nodeGroups[1].name: expected a name no other node group or NodePool has, "
        'got "ng-1" (node group)',
    ]


SEED_CLUSTER = """\
---
apiVersion: eksctl.io/v1alpha5
kind: ClusterConfig

metadata:
    name: eksdemo
    region: ap-northeast-1

nodeGroups:
    - name: ng-1
      minSize: 4
      maxSize: 8
      instancesDistribution:
        instanceTypes: ["t3.small", "t3.medium", "t3.large"] # At least two instance types
        onDemandBaseCapacity: 2
        onDemandPercentageAboveBaseCapacity: 0
        spotInstancePools: 2
"""


def test_the_walkthrough_cluster_yaml_is_read_as_is(tmp_path: Path, catalog: Catalog) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(SEED_CLUSTER)
    [g] = load_nodegroup_files([path], catalog=catalog)
    assert g.name == "ng-1" and g.desired == 4 and g.on_demand_base == 2


def test_every_group_of_a_cluster_config_is_checked_with_its_path(catalog: Catalog) -> None:
    data = {
        "apiVersion": "eksctl.io/v1alpha5",
        "kind": "ClusterConfig",
        "nodeGroups": [
            distribution(instanceTypes=["t3.smal"]),
            group(maxPodsPerNode=20),
            SEED_GROUP,
        ],
    }
    with pytest.raises(ScenarioError) as caught:
        parse_cluster_config(data, source="cluster.yaml", catalog=catalog)
    paths = [p.path for p in caught.value.problems]
    assert paths == [
        "nodeGroups[0].instancesDistribution.instanceTypes[0]",
        "nodeGroups[1]",
        "nodeGroups[2].name",  # ng-1 again
    ]
    with pytest.raises(ScenarioError, match="expected an eksctl ClusterConfig"):
        parse_cluster_config({"kind": "Scenario"}, source="x.yaml")


def test_the_controller_refuses_a_bad_cluster_config_before_connecting(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(SEED_CLUSTER.replace("onDemandBaseCapacity: 2", "onDemandBaseCapacity: 9"))
    result = subprocess.run(
        [sys.executable, "-m", "spotwright", "controller", "--cloud", "sim", "--nodegroups", path],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "nodeGroups[0]: expected instancesDistribution.onDemandBaseCapacity ≤ maxSize (8)" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr
