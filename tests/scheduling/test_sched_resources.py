"""Extended resources and limits on every resource the packer counts."""

from __future__ import annotations

import pytest
from sched_fixtures import GIB, catalog, offers, pod

from spotwright.model.nodepool import UNLIMITED, NodePool
from spotwright.model.objects import Pod
from spotwright.model.podspec import PodSpec
from spotwright.model.resources import Resources
from spotwright.scheduling import ExistingCapacity, NodePoolTemplate, node_fit, schedule

TYPES = catalog()
OFFERS = offers(TYPES)
DEFAULT = NodePoolTemplate("default")
FOO = "example.com/foo"


def foo_pod(name: str, count: int = 1) -> Pod:
    return Pod(
        name=name,
        uid=name,
        requests=Resources(cpu=500, memory=GIB, extended=((FOO, count),)),
    )


def test_extended_resources_parse_add_and_compare() -> None:
    asked = Resources.from_k8s({"cpu": "1", FOO: "2", "aws.amazon.com/neuron": 1})
    assert asked.extended == (("aws.amazon.com/neuron", 1), (FOO, 2))
    node = Resources.from_k8s({"cpu": "4", FOO: 3, "aws.amazon.com/neuron": 1})
    assert asked.fits_in(node)
    assert not (asked + asked).fits_in(node)
    assert (asked + asked).short_of(node) == ["aws.amazon.com/neuron", FOO]
    assert (node - asked).amount(FOO) == 1
    assert "example.com/foo=2" in asked.describe()
    with pytest.raises(ValueError, match="gpus"):
        Resources.from_k8s({"gpus": 1})
    with pytest.raises(ValueError, match="whole number"):
        Resources.from_k8s({FOO: "500m"})


def test_a_workload_may_request_an_extended_resource_but_not_an_unknown_name() -> None:
    spec = PodSpec.model_validate(
        {
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "1", FOO: 1}}},
                {"name": "b", "resources": {"limits": {FOO: 2}}},
            ]
        }
    )
    assert spec.requests().amount(FOO) == 3
    with pytest.raises(ValueError, match="gpus"):
        PodSpec.model_validate(
            {"containers": [{"name": "a", "resources": {"requests": {"gpus": 1}}}]}
        )


def test_pods_asking_for_an_extended_resource_use_nodes_that_have_it_free() -> None:
    with_foo = ExistingCapacity(
        "fpga-node", {}, free=Resources(8000, 32 * GIB, pods=100, extended=((FOO, 2),))
    )
    plain = ExistingCapacity("plain", {}, free=Resources(8000, 32 * GIB, pods=100))
    pods = [foo_pod(f"f{i}") for i in range(3)]
    plan = schedule([*pods, pod("other")], [plain, with_foo], [DEFAULT], TYPES, OFFERS)
    assert [plan.existing.get(p.key) for p in pods] == ["fpga-node", "fpga-node", None]
    assert "default/other" in plan.existing
    reason = plan.unschedulable["default/f2"]
    assert FOO in reason and "no instance type offers" in reason
    assert all(p.key != "default/f2" for c in plan.new_claims for p in c.pods)


def test_kube_scheduler_emulation_names_the_missing_extended_resource() -> None:
    free = Resources(8000, 32 * GIB, pods=100, extended=((FOO, 1),))
    fit = {"labels": {}, "taints": (), "unschedulable": False}
    assert node_fit(foo_pod("a"), free=free, **fit) is None  # type: ignore[arg-type]
    assert node_fit(foo_pod("b", 2), free=free, **fit) == f"Insufficient {FOO}"  # type: ignore[arg-type]


def test_pods_and_ephemeral_storage_limits_hold_like_cpu_limits() -> None:
    pool = NodePool.model_validate(
        {"metadata": {"name": "default"}, "spec": {"limits": {"pods": 150}}}
    )
    limits = pool.limits()
    assert limits is not None and limits.pods == 150 and limits.cpu == UNLIMITED
    capped = NodePoolTemplate("default", remaining=limits)
    pods = [pod(f"p{i}", cpu=100, mem_gib=0.1) for i in range(300)]
    plan = schedule(pods, [], [capped], TYPES, OFFERS)
    by_name = {t.name: t for t in TYPES}
    slots = sum(by_name[c.instance_types[0]].allocatable.pods for c in plan.new_claims)
    assert 0 < slots <= 150
    assert plan.unschedulable
    assert all("limits exceeded (pods)" in r for r in plan.unschedulable.values())


def test_a_limit_on_a_resource_no_instance_type_offers_is_reported_by_name() -> None:
    with pytest.raises(ValueError, match=FOO):
        NodePool.model_validate({"metadata": {"name": "a"}, "spec": {"limits": {FOO: 1}}})
