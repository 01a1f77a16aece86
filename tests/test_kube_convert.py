"""API objects to controller records and back, without a cluster.

Objects are written the way ``kubectl get -o json`` shows them, so each case reads as
"this is what the API server sends, this is what the controllers see".
"""

from __future__ import annotations

from typing import Any

import pytest

from spotwright.adapters.kube.convert import (
    format_time,
    node_from_api,
    parse_time,
    pdb_from_api,
    pod_from_api,
)
from spotwright.adapters.kube.nodeclaims import (
    claim_from_api,
    claim_to_api,
    format_cpu,
    format_memory,
    status_to_api,
)
from spotwright.model.nodeclaim import FINALIZER
from spotwright.model.objects import (
    LabelSelector,
    NodeClaim,
    NodeSelectorRequirement,
    Pod,
    PodAffinityTerm,
    Taint,
    Toleration,
    TopologySpreadConstraint,
)
from spotwright.model.resources import Resources

GIB = 2**30
MIB = 2**20


def api_pod(**overrides: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-7d9f8-abcde",
            "namespace": "shop",
            "uid": "u-1",
            "creationTimestamp": "2026-01-01T00:00:10Z",
            "labels": {"app": "web", "pod-template-hash": "7d9f8"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "web-7d9f8",
                    "controller": True,
                }
            ],
        },
        "spec": {
            "containers": [
                {"name": "app", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}
            ],
        },
        "status": {"phase": "Pending"},
    }
    for key, value in overrides.items():
        pod[key] = {**pod.get(key, {}), **value}
    return pod


def convert(obj: dict[str, Any]) -> Pod:
    pod = pod_from_api(obj)
    assert pod is not None
    return pod


# ---------------------------------------------------------------------------------------
# Pods


def test_a_deployments_pod_is_owned_by_the_deployment() -> None:
    pod = convert(api_pod())
    assert (pod.key, pod.uid, pod.owner) == ("shop/web-7d9f8-abcde", "u-1", "web")
    assert not pod.daemon and not pod.mirror
    assert pod.requests == Resources(cpu=500, memory=GIB, pods=1)
    assert pod.created_at == parse_time("2026-01-01T00:00:10Z")
    assert pod.grace_seconds == 30.0


def test_a_replicaset_without_the_hash_suffix_is_its_own_owner() -> None:
    obj = api_pod()
    obj["metadata"]["ownerReferences"][0]["name"] = "handmade"
    assert convert(obj).owner == "handmade"


def test_daemonset_and_mirror_pods_are_flagged() -> None:
    daemon = api_pod()
    daemon["metadata"]["ownerReferences"] = [
        {"kind": "DaemonSet", "name": "node-exporter", "controller": True}
    ]
    assert convert(daemon).daemon
    mirror = api_pod(metadata={"annotations": {"kubernetes.io/config.mirror": "abc"}})
    mirror["metadata"].pop("ownerReferences")
    converted = convert(mirror)
    assert converted.mirror and converted.owner is None


def test_requests_count_init_containers_sidecars_overhead_and_default_to_limits() -> None:
    obj = api_pod(
        spec={
            "initContainers": [
                {"name": "migrate", "resources": {"requests": {"cpu": "2", "memory": "256Mi"}}},
                {
                    "name": "proxy",
                    "restartPolicy": "Always",
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                },
            ],
            "containers": [
                {"name": "a", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}},
                {
                    "name": "b",
                    "resources": {
                        "requests": {"cpu": "250m", "hugepages-2Mi": "1Gi", "example.com/fpga": "1"}
                    },
                },
            ],
            "overhead": {"cpu": "10m", "memory": "5Mi"},
        }
    )
    pod = convert(obj)
    # Init peak: 2 cpu (migrate alone); main: 1 + 0.25 + sidecar 0.1 = 1.35 cpu.
    # Extended resources are kept (the scheduler counts them); hugepages are not.
    fpga = (("example.com/fpga", 1),)
    assert pod.requests == Resources(cpu=2000, memory=GIB + 64 * MIB, pods=1, extended=fpga)
    assert pod.overhead == Resources(cpu=10, memory=5 * MIB)


def test_placement_constraints() -> None:
    spec = {
        "nodeSelector": {"beta.kubernetes.io/arch": "amd64"},
        "tolerations": [
            {"key": "karpenter.sh/disrupted", "operator": "Exists", "effect": "NoSchedule"},
            {"operator": "Exists"},
        ],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "karpenter.sh/capacity-type",
                                    "operator": "In",
                                    "values": ["spot"],
                                }
                            ],
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": ["n1"]}
                            ],
                        }
                    ]
                },
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 10,
                        "preference": {
                            "matchExpressions": [
                                {
                                    "key": "topology.kubernetes.io/zone",
                                    "operator": "In",
                                    "values": ["us-east-1a"],
                                }
                            ]
                        },
                    }
                ],
            },
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": {"app": "web"}},
                        "namespaceSelector": {},
                    }
                ]
            },
        },
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "web"}},
                "matchLabelKeys": ["pod-template-hash"],
            }
        ],
        "priorityClassName": "system-cluster-critical",
        "priority": 2000000000,
        "terminationGracePeriodSeconds": 5,
    }
    pod = convert(api_pod(spec=spec))
    assert pod.node_selector == {"kubernetes.io/arch": "amd64"}
    assert pod.tolerations == (
        Toleration("karpenter.sh/disrupted", "Exists", "", "NoSchedule"),
        Toleration("", "Exists"),
    )
    assert pod.required_affinity == (
        (NodeSelectorRequirement("karpenter.sh/capacity-type", "In", ("spot",)),),
    )
    assert pod.preferred_affinity[0].weight == 10
    assert pod.pod_anti_affinity == (
        PodAffinityTerm("kubernetes.io/hostname", LabelSelector.of({"app": "web"})),
    )
    assert pod.topology_spread == (
        TopologySpreadConstraint(
            "topology.kubernetes.io/zone", 1, "DoNotSchedule", LabelSelector.of({"app": "web"})
        ),
    )
    assert (pod.priority, pod.priority_class, pod.grace_seconds) == (
        2000000000,
        "system-cluster-critical",
        5.0,
    )


def test_status_unschedulable_ready_and_terminating() -> None:
    pending = api_pod(
        status={
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
        }
    )
    assert convert(pending).unschedulable
    assert not convert(api_pod()).unschedulable  # not tried by the scheduler yet
    running = api_pod(
        spec={"nodeName": "ip-10-0-0-1"},
        status={
            "phase": "Running",
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:01:00Z"},
            ],
        },
    )
    pod = convert(running)
    assert (pod.node_name, pod.ready, pod.unschedulable) == ("ip-10-0-0-1", True, False)
    assert pod.ready_at == parse_time("2026-01-01T00:01:00Z")
    evicted = api_pod(
        metadata={"deletionTimestamp": "2026-01-01T00:02:00Z"},
        status={
            "conditions": [
                {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
            ]
        },
    )
    pod = convert(evicted)
    assert pod.terminating and pod.evicted


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_finished_pods_are_not_kept(phase: str) -> None:
    assert pod_from_api(api_pod(status={"phase": phase})) is None


def test_a_constraint_the_model_rejects_keeps_the_requests() -> None:
    obj = api_pod(spec={"nodeSelector": {"not a/valid/key": "x"}})
    pod = convert(obj)
    assert pod.requests == Resources(cpu=500, memory=GIB, pods=1)
    assert pod.node_selector == {}


def test_big_annotations_are_not_cached() -> None:
    obj = api_pod(
        metadata={
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{}",
                "huge": "x" * 10_000,
                "karpenter.sh/do-not-disrupt": "true",
            }
        }
    )
    assert convert(obj).annotations == {"karpenter.sh/do-not-disrupt": "true"}


# ---------------------------------------------------------------------------------------
# Nodes and budgets


def test_node() -> None:
    node = node_from_api(
        {
            "metadata": {
                "name": "ip-10-0-0-1.ec2.internal",
                "labels": {"karpenter.sh/capacity-type": "spot"},
                "creationTimestamp": "2026-01-01T00:00:00Z",
            },
            "spec": {
                "providerID": "aws:///us-east-1a/i-0123",
                "unschedulable": True,
                "taints": [
                    {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"},
                    {"key": "dedicated", "value": "gpu", "effect": "NoExecute"},
                ],
            },
            "status": {
                "allocatable": {
                    "cpu": "1930m",
                    "memory": "7Gi",
                    "pods": "29",
                    "hugepages-1Gi": "0",
                    "ephemeral-storage": "17Gi",
                },
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )
    assert node.provider_id == "aws:///us-east-1a/i-0123"
    assert node.unschedulable and node.ready
    assert node.taints == [
        Taint("karpenter.sh/disrupted", "NoSchedule"),
        Taint("dedicated", "NoExecute", "gpu"),
    ]
    assert node.allocatable == Resources(cpu=1930, memory=7 * GIB, pods=29, ephemeral=17 * GIB)


def test_pdb() -> None:
    pdb = pdb_from_api(
        {
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
        }
    )
    assert (pdb.namespace, pdb.selector, pdb.min_available, pdb.max_unavailable) == (
        "shop",
        {"app": "web"},
        1,
        None,
    )


# ---------------------------------------------------------------------------------------
# NodeClaims


def test_time_round_trips_to_the_microsecond() -> None:
    moment = 1_767_225_612.345678
    text = format_time(moment)
    assert text == "2026-01-01T00:00:12.345678Z"
    again = parse_time(text)
    assert again is not None and format_time(again) == text


def test_quantities_are_written_the_way_people_read_them() -> None:
    assert [format_cpu(v) for v in (1500, 2000, 0)] == ["1500m", "2", "0"]
    assert [format_memory(v) for v in (4 * GIB, 512 * MIB, 1000, 0)] == [
        "4Gi",
        "512Mi",
        "1000",
        "0",
    ]


def test_nodeclaim_round_trip() -> None:
    claim = NodeClaim(
        name="default-00001",
        nodepool="default",
        requirements=(
            NodeSelectorRequirement("karpenter.sh/capacity-type", "In", ("spot", "on-demand")),
            NodeSelectorRequirement("karpenter.k8s.aws/instance-cpu", "Gt", ("1",)),
            NodeSelectorRequirement("node.kubernetes.io/instance-type", "Exists", (), 3),
        ),
        instance_types=("c5.large", "m5.large"),
        requests=Resources(cpu=1500, memory=3 * GIB, pods=3),
        labels={"karpenter.sh/nodepool": "default", "team": "a"},
        taints=(Taint("dedicated", "NoSchedule", "batch"),),
        startup_taints=(Taint("example.com/agent-not-ready", "NoSchedule"),),
        node_class="private",
        provider_id="aws:///us-east-1a/i-0abc",
        instance_type="c5.large",
        zone="us-east-1a",
        capacity_type="spot",
        price=0.0342,
        allocatable=Resources(cpu=1930, memory=3 * GIB, pods=29, ephemeral=17 * GIB),
        node_name="ip-10-0-0-1.ec2.internal",
        launched_at=1_767_225_601.5,
        registered_at=1_767_225_640.25,
        initialized_at=1_767_225_641.0,
        drain_deadline=1_767_225_900.0,
        deletion_reason="spot_interruption",
    )
    obj = claim_to_api(claim)
    assert obj["metadata"]["finalizers"] == [FINALIZER]
    assert obj["spec"]["nodeClassRef"]["name"] == "private"
    assert obj["spec"]["resources"]["requests"] == {"cpu": "1500m", "memory": "3Gi", "pods": "3"}
    status = status_to_api(claim)
    assert [c["type"] for c in status["conditions"]] == [
        "Launched",
        "Registered",
        "Initialized",
        "Ready",
    ]
    obj["metadata"].update(
        {"creationTimestamp": "2026-01-01T00:00:00Z", "deletionTimestamp": "2026-01-01T00:03:00Z"}
    )
    stored = claim_from_api(
        {"apiVersion": "spotwright.io/v1alpha1", "kind": "NodeClaim", **obj, "status": status}
    )
    assert stored is not None and stored.deleting and stored.finalizers == (FINALIZER,)
    back = stored.claim
    for field in (
        "name", "nodepool", "requirements", "instance_types", "requests", "labels", "taints",
        "startup_taints", "node_class", "provider_id", "instance_type", "zone", "capacity_type",
        "price", "allocatable", "node_name", "launched_at", "registered_at", "initialized_at",
        "drain_deadline", "deletion_reason",
    ):  # fmt: skip
        assert getattr(back, field) == getattr(claim, field), field
    assert back.created_at == parse_time("2026-01-01T00:00:00Z")
    assert back.deleting_since == parse_time("2026-01-01T00:03:00Z")
    assert stored.status == status


def test_an_unlaunched_claim_has_an_empty_status() -> None:
    claim = NodeClaim(name="default-00002", nodepool="default")
    assert status_to_api(claim) == {}
    stored = claim_from_api({**claim_to_api(claim), "status": {}})
    assert stored is not None and stored.claim.provider_id == "" and not stored.deleting


def test_a_nodeclaim_that_does_not_validate_is_skipped() -> None:
    assert claim_from_api({"metadata": {"name": "x"}, "spec": {"nodePool": ""}}) is None


def test_a_pods_placement_is_computed_once_per_spec_generation() -> None:
    first = api_pod(metadata={"uid": "u-cache", "generation": 1})
    again = api_pod(metadata={"uid": "u-cache", "generation": 1}, status={"phase": "Running"})
    again["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "2"  # not a real event
    assert convert(again).requests == convert(first).requests  # served from the cache
    resized = api_pod(metadata={"uid": "u-cache", "generation": 2})
    resized["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "2"
    assert convert(resized).requests.cpu == 2000


def test_a_simulated_instance_becomes_a_kwok_node() -> None:
    from spotwright.adapters.kube.kwok import fake_node
    from spotwright.catalog import load_catalog
    from spotwright.ports.cloud import Instance

    itype = load_catalog().get("m5.large")
    claim = NodeClaim(
        name="spot-00001",
        nodepool="spot",
        labels={"karpenter.sh/nodepool": "spot", "team": "a"},
        taints=(Taint("dedicated", "NoSchedule", "a"),),
    )
    instance = Instance(
        "i-0abc",
        "m5.large",
        "us-east-1b",
        "spot",
        0.04,
        1_767_225_600.0,
        "ip-10-0-0-9.ec2.internal",
    )
    body = fake_node(instance, itype, claim, region="us-east-1")
    assert body["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    labels = body["metadata"]["labels"]
    assert labels["team"] == "a" and labels["karpenter.sh/capacity-type"] == "spot"
    assert labels["topology.kubernetes.io/zone"] == "us-east-1b"
    assert labels["node.kubernetes.io/instance-type"] == "m5.large"
    assert body["spec"]["providerID"] == "aws:///us-east-1b/i-0abc"
    assert body["spec"]["taints"] == [{"key": "dedicated", "effect": "NoSchedule", "value": "a"}]
    node = node_from_api(body)  # what the cache makes of it again
    assert node.allocatable == itype.allocatable and node.labels == labels
