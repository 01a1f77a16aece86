"""``spotwright import karpenter``: Karpenter's NodePools and EC2NodeClasses, converted.

Good files come out as spotwright.io/v1alpha1 objects that the models accept, written
as the user wrote them; every field left out is named by its path; bad files fail with
the file, the path and what was expected, and exit code 2.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from spotwright.model.errors import ScenarioError
from spotwright.model.karpenter_import import ImportFailed, convert_files, to_yaml
from spotwright.model.nodeclass import EC2NodeClass, parse_nodeclass
from spotwright.model.nodepool import NodePool, parse_nodepool

NODEPOOL: dict[str, Any] = {
    "apiVersion": "karpenter.sh/v1",
    "kind": "NodePool",
    "metadata": {
        "name": "default",
        "uid": "0a1b",
        "resourceVersion": "42",
        "annotations": {"karpenter.sh/nodepool-hash": "123", "team": "platform"},
    },
    "spec": {
        "template": {
            "metadata": {"labels": {"team": "a"}},
            "spec": {
                "requirements": [
                    {
                        "key": "karpenter.sh/capacity-type",
                        "operator": "In",
                        "values": ["spot", "on-demand"],
                    },
                    {
                        "key": "karpenter.k8s.aws/instance-category",
                        "operator": "In",
                        "values": ["c", "m", "r"],
                        "minValues": 2,
                    },
                ],
                "taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}],
                "nodeClassRef": {
                    "group": "karpenter.k8s.aws",
                    "kind": "EC2NodeClass",
                    "name": "default",
                },
                "expireAfter": "720h",
            },
        },
        "limits": {"cpu": 1000, "memory": "1000Gi"},
        "disruption": {
            "consolidationPolicy": "WhenEmptyOrUnderutilized",
            "consolidateAfter": "1m",
            "budgets": [{"nodes": "10%"}],
        },
        "weight": 10,
    },
    "status": {"resources": {"cpu": "4"}},
}

NODECLASS: dict[str, Any] = {
    "apiVersion": "karpenter.k8s.aws/v1",
    "kind": "EC2NodeClass",
    "metadata": {"name": "default"},
    "spec": {
        "role": "KarpenterNodeRole-demo",
        "amiSelectorTerms": [{"alias": "al2023@latest"}],
        "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": "demo"}}],
        "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": "demo"}}],
        "tags": {"team": "platform"},
        "kubelet": {"maxPods": 110, "evictionHard": {"memory.available": "5%"}},
        "blockDeviceMappings": [
            {
                "deviceName": "/dev/xvda",
                "rootVolume": True,
                "ebs": {"volumeSize": "100Gi", "volumeType": "gp3", "encrypted": True},
            }
        ],
        "metadataOptions": {"httpPutResponseHopLimit": 2},
    },
}


def write(tmp_path: Path, name: str, *docs: Any) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False), encoding="utf-8")
    return path


def spotwright(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spotwright", *args], capture_output=True, text=True, timeout=120
    )


# -- good files ----------------------------------------------------------------------------

#: Every kubelet setting Karpenter's v1 EC2NodeClass takes.
FULL_KUBELET: dict[str, Any] = {
    "podsPerCore": 2,
    "maxPods": 20,
    "systemReserved": {"cpu": "100m", "memory": "100Mi", "ephemeral-storage": "1Gi"},
    "kubeReserved": {"cpu": "200m", "memory": "100Mi", "ephemeral-storage": "3Gi"},
    "evictionHard": {"memory.available": "5%", "nodefs.available": "10%"},
    "evictionSoft": {"memory.available": "500Mi", "nodefs.available": "15%"},
    "evictionSoftGracePeriod": {"memory.available": "1m", "nodefs.available": "1m30s"},
    "evictionMaxPodGracePeriod": 60,
    "imageGCHighThresholdPercent": 85,
    "imageGCLowThresholdPercent": 80,
    "cpuCFSQuota": True,
    "clusterDNS": ["10.0.1.100"],
}


def test_every_karpenter_kubelet_setting_is_carried(tmp_path: Path) -> None:
    nodeclass = copy.deepcopy(NODECLASS)
    nodeclass["spec"]["kubelet"] = FULL_KUBELET
    result = convert_files([write(tmp_path, "k.yaml", nodeclass)])
    (out,) = result.documents
    assert out["spec"]["kubelet"] == FULL_KUBELET
    assert not [n for n in result.dropped if "kubelet" in n.path]
    kubelet = parse_nodeclass(out, source="out").spec.kubelet
    assert kubelet is not None and kubelet.cluster_dns == ["10.0.1.100"]
    assert kubelet.eviction_soft_grace_period["nodefs.available"] == "1m30s"


def test_v1_objects_convert_and_validate(tmp_path: Path) -> None:
    path = write(tmp_path, "karpenter.yaml", NODEPOOL, NODECLASS)
    result = convert_files([path])
    pool, nodeclass = result.documents
    assert pool["apiVersion"] == nodeclass["apiVersion"] == "spotwright.io/v1alpha1"
    assert [pool["kind"], nodeclass["kind"]] == ["NodePool", "EC2NodeClass"]
    # written back as written, not as parsed
    assert pool["spec"]["template"]["spec"]["expireAfter"] == "720h"
    assert pool["spec"]["limits"] == {"cpu": 1000, "memory": "1000Gi"}
    assert pool["spec"]["template"]["spec"]["nodeClassRef"]["group"] == "spotwright.io"
    assert pool["metadata"] == {"name": "default", "annotations": {"team": "platform"}}
    assert "status" not in pool
    assert nodeclass["spec"] == NODECLASS["spec"]
    # the models the scenario loader uses accept the result
    parsed = parse_nodepool(pool, source="out")
    assert parsed.weight == 10 and parsed.expire_after == 720 * 3600
    assert parse_nodeclass(nodeclass, source="out").spec.family == "AL2023"
    # and every left-out field is named
    dropped = {n.path: n.message for n in result.dropped}
    assert set(dropped) == {
        "metadata.uid",
        "metadata.resourceVersion",
        'metadata.annotations["karpenter.sh/nodepool-hash"]',
        "status",
    }
    converted = [n.path for n in result.notes if n.kind == "converted"]
    assert converted == ["spec.template.spec.nodeClassRef.group"]
    # the YAML round-trips
    assert list(yaml.safe_load_all(to_yaml(result.documents))) == result.documents


def test_unsupported_and_unknown_fields_are_named(tmp_path: Path) -> None:
    pool = copy.deepcopy(NODEPOOL)
    pool["spec"]["replicas"] = 3
    pool["spec"]["limits"]["amd.com/gpu"] = 4
    pool["spec"]["limts"] = {"cpu": 3}
    nodeclass = copy.deepcopy(NODECLASS)
    nodeclass["spec"]["detailedMonitoring"] = True
    nodeclass["spec"]["kubelet"]["clusterDomain"] = "cluster.local"
    path = write(tmp_path, "k.yaml", pool, nodeclass)
    notes = {
        (n.source.rsplit(" ", 1)[-1], n.path): n.message for n in convert_files([path]).dropped
    }
    assert "static NodePools" in notes["1)", "spec.replicas"]
    assert "nvidia.com/gpu" in notes["1)", 'spec.limits["amd.com/gpu"]']
    assert "did you mean limits?" in notes["1)", "spec.limts"]
    assert "CloudWatch" in notes["2)", "spec.detailedMonitoring"]
    assert "no 'clusterDomain'" in notes["2)", "spec.kubelet.clusterDomain"]


def test_v1beta1_fields_move_where_v1_put_them(tmp_path: Path) -> None:
    pool = {
        "apiVersion": "karpenter.sh/v1beta1",
        "kind": "NodePool",
        "metadata": {"name": "default"},
        "spec": {
            "template": {
                "spec": {
                    "nodeClassRef": {
                        "apiVersion": "karpenter.k8s.aws/v1beta1",
                        "kind": "EC2NodeClass",
                        "name": "default",
                    },
                    "kubelet": {"maxPods": 50},
                    "requirements": [
                        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}
                    ],
                }
            },
            "disruption": {"consolidationPolicy": "WhenUnderutilized", "expireAfter": "168h"},
        },
    }
    nodeclass = {
        "apiVersion": "karpenter.k8s.aws/v1beta1",
        "kind": "EC2NodeClass",
        "metadata": {"name": "default"},
        "spec": {
            "amiFamily": "Bottlerocket",
            "role": "KarpenterNodeRole",
            "subnetSelectorTerms": [{"tags": {"k": "v"}}],
            "securityGroupSelectorTerms": [{"tags": {"k": "v"}}],
        },
    }
    result = convert_files([write(tmp_path, "beta.yaml", pool, nodeclass)])
    out_pool, out_class = result.documents
    template = out_pool["spec"]["template"]["spec"]
    assert template["expireAfter"] == "168h"
    assert "expireAfter" not in out_pool["spec"]["disruption"]
    assert out_pool["spec"]["disruption"]["consolidationPolicy"] == "WhenEmptyOrUnderutilized"
    assert template["nodeClassRef"] == {
        "group": "spotwright.io",
        "kind": "EC2NodeClass",
        "name": "default",
    }
    assert "kubelet" not in template
    assert out_class["spec"]["kubelet"] == {"maxPods": 50}
    assert out_class["spec"]["amiSelectorTerms"] == [{"alias": "bottlerocket@latest"}]
    assert not result.dropped
    moved = {n.path for n in result.notes if n.kind == "converted"}
    assert {
        "spec.disruption.expireAfter",
        "spec.disruption.consolidationPolicy",
        "spec.template.spec.kubelet",
        "spec.amiSelectorTerms",
    } <= moved
    parse_nodepool(out_pool, source="out")
    parse_nodeclass(out_class, source="out")


def test_kubelet_without_its_class_is_reported(tmp_path: Path) -> None:
    pool = {
        "apiVersion": "karpenter.sh/v1beta1",
        "kind": "NodePool",
        "metadata": {"name": "p"},
        "spec": {"template": {"spec": {"kubelet": {"maxPods": 50}}}},
    }
    result = convert_files([write(tmp_path, "p.yaml", pool)])
    (note,) = result.dropped
    assert note.path == "spec.template.spec.kubelet"
    assert "spec.kubelet" in note.message


def test_lists_from_kubectl_are_unpacked(tmp_path: Path) -> None:
    listing = {"apiVersion": "v1", "kind": "List", "items": [NODEPOOL, NODECLASS]}
    result = convert_files([write(tmp_path, "list.yaml", listing)])
    assert [d["kind"] for d in result.documents] == ["NodePool", "EC2NodeClass"]
    assert "items[0].metadata.uid" in {n.path for n in result.dropped}


def test_spotwright_objects_pass_through(tmp_path: Path) -> None:
    first = convert_files([write(tmp_path, "a.yaml", NODEPOOL, NODECLASS)]).documents
    again = convert_files([write(tmp_path, "b.yaml", *first)])
    assert again.documents == first
    assert not again.notes


# -- bad files -----------------------------------------------------------------------------


def problems(tmp_path: Path, *docs: Any) -> list[str]:
    with pytest.raises(ImportFailed) as caught:
        convert_files([write(tmp_path, "bad.yaml", *docs)])
    return str(caught.value).splitlines()


def test_invalid_values_fail_with_file_path_and_expectation(tmp_path: Path) -> None:
    pool = copy.deepcopy(NODEPOOL)
    pool["spec"]["weight"] = 500
    nodeclass = copy.deepcopy(NODECLASS)
    nodeclass["spec"]["tags"] = {"kubernetes.io/cluster/demo": "owned"}
    lines = problems(tmp_path, pool, nodeclass)
    path = tmp_path / "bad.yaml"
    assert lines[0] == f"{path} (document 1): spec.weight: expected a value ≤ 100, got 500"
    assert lines[1].startswith(f"{path} (document 2): spec.tags: expected a tag key")


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({"apiVersion": "apps/v1", "kind": "Deployment"}, "kind: expected karpenter.sh/v1"),
        (
            {"apiVersion": "karpenter.sh/v1alpha5", "kind": "Provisioner"},
            "replaced by NodePool",
        ),
        ([1, 2], "expected a Kubernetes object"),
    ],
)
def test_other_objects_are_refused(tmp_path: Path, doc: Any, expected: str) -> None:
    (line,) = problems(tmp_path, doc)
    assert expected in line


def test_nodeclass_rules(tmp_path: Path) -> None:
    def fails(change: dict[str, Any], expected: str) -> None:
        nodeclass = copy.deepcopy(NODECLASS)
        nodeclass["spec"].update(change)
        nodeclass["spec"] = {k: v for k, v in nodeclass["spec"].items() if v is not None}
        with pytest.raises(ScenarioError, match=expected):
            parse_nodeclass(nodeclass, source="x")

    fails({"instanceProfile": "p"}, "exactly one of role and instanceProfile, got both")
    fails({"role": None}, "exactly one of role and instanceProfile, got neither")
    fails({"amiSelectorTerms": [{"alias": "al2023@latest"}, {"id": "ami-1"}]}, "only")
    fails({"amiSelectorTerms": [{"id": "ami-1"}]}, "expected amiFamily")
    fails({"amiSelectorTerms": [{"alias": "al2@latest"}], "amiFamily": "AL2023"}, "AL2")
    fails({"amiSelectorTerms": [{"alias": "ubuntu@latest"}]}, "alias family@version")
    fails({"tags": {"karpenter.sh/nodeclaim": "x"}}, "restricted")
    fails({"subnetSelectorTerms": [{}]}, "at least one of tags, id")
    fails({"kubelet": {"evictionHard": {"memory.free": "1Gi"}}}, "eviction signal")
    fails({"kubelet": {"evictionHard": {"memory.available": "120%"}}}, "0% to 100%")
    fails({"kubelet": {"kubeReserved": {"cpu": "-1"}}}, "not negative")
    fails({"kubelet": {"systemReserved": {"gpu": "1"}}}, "reservable resource")
    fails({"kubelet": {"evictionSoft": {"memory.available": "1Gi"}}}, "GracePeriod for every")
    fails(
        {"kubelet": {"evictionSoftGracePeriod": {"memory.available": "1m"}}},
        "only for evictionSoft signals",
    )
    fails(
        {
            "kubelet": {
                "evictionSoft": {"memory.available": "1Gi"},
                "evictionSoftGracePeriod": {"memory.available": "soon"},
            }
        },
        "duration like 1m",
    )
    fails(
        {"kubelet": {"imageGCHighThresholdPercent": 70, "imageGCLowThresholdPercent": 80}},
        "above imageGCLowThresholdPercent",
    )
    fails({"kubelet": {"imageGCHighThresholdPercent": 101}}, "≤ 100")
    fails({"kubelet": {"cpuCFSQuota": "yes"}}, "cpuCFSQuota")
    fails({"metadataOptions": {"httpTokens": "sometimes"}}, "required")
    fails(
        {"blockDeviceMappings": [{"rootVolume": True}, {"rootVolume": True}]},
        "at most one mapping with rootVolume",
    )
    fine = parse_nodeclass(NODECLASS, source="x").spec.metadata_options
    assert (fine.http_endpoint, fine.http_tokens, fine.http_put_response_hop_limit) == (
        "enabled",
        "required",
        2,
    )
    assert (
        EC2NodeClass.model_validate(
            {**NODECLASS, "spec": {**NODECLASS["spec"], "metadataOptions": {}}}
        ).spec.metadata_options.http_put_response_hop_limit
        == 1
    )


def test_scenario_models_still_take_karpenter_nodepools() -> None:
    pool = copy.deepcopy(NODEPOOL)
    del pool["status"]
    assert NodePool.model_validate(pool).name == "default"
    with pytest.raises(ValidationError):
        NodePool.model_validate({**pool, "apiVersion": "karpenter.sh/v2"})


# -- never silently dropped ----------------------------------------------------------------


def _dict_paths(data: Any, path: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    out: list[tuple[str | int, ...]] = []
    if isinstance(data, dict):
        out.append(path)
        for key, value in data.items():
            if key in ("labels", "annotations", "tags", "limits", "evictionHard"):
                continue  # free-form maps: any key is data, not a field
            out.extend(_dict_paths(value, (*path, key)))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            out.extend(_dict_paths(value, (*path, i)))
    return out


def _format(path: tuple[str | int, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    which=st.sampled_from(["nodepool", "nodeclass"]),
    picks=st.lists(
        st.tuples(st.integers(0, 10_000), st.sampled_from(["colour", "zzTop", "spce"])),
        min_size=1,
        max_size=4,
    ),
)
def test_every_extra_field_is_reported_by_path(
    tmp_path: Path, which: str, picks: list[tuple[int, str]]
) -> None:
    doc = copy.deepcopy(NODEPOOL if which == "nodepool" else NODECLASS)
    targets = _dict_paths(doc)
    added: set[str] = set()
    for index, name in picks:
        where = targets[index % len(targets)]
        node = doc
        for part in where:
            node = node[part]
        if name in node:
            continue
        node[name] = "surprise"
        added.add(_format((*where, name)))
    result = convert_files([write(tmp_path, f"{which}.yaml", doc)])
    reported = {n.path for n in result.dropped}
    for path in added:  # the field itself, or a whole block holding it (status)
        assert any(path == r or path.startswith(r + ".") for r in reported), path
    assert "surprise" not in to_yaml(result.documents)


# -- the command ---------------------------------------------------------------------------


def test_cli_prints_yaml_and_notes(tmp_path: Path) -> None:
    path = write(tmp_path, "k.yaml", NODEPOOL, NODECLASS)
    result = spotwright("import", "karpenter", str(path))
    assert result.returncode == 0, result.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(result.stdout)]
    assert kinds == ["NodePool", "EC2NodeClass"]
    assert "metadata.uid: dropped: written by the API server" in result.stderr

    out = tmp_path / "out.yaml"
    strict = spotwright("import", "karpenter", str(path), "--out", str(out), "--strict")
    assert strict.returncode == 1
    assert not strict.stdout
    assert [d["kind"] for d in yaml.safe_load_all(out.read_text())] == kinds


def test_cli_exits_2_on_bad_input(tmp_path: Path) -> None:
    pool = copy.deepcopy(NODEPOOL)
    pool["spec"]["weight"] = 500
    path = write(tmp_path, "bad.yaml", pool)
    result = spotwright("import", "karpenter", str(path))
    assert result.returncode == 2
    assert f"spotwright: {path}: spec.weight: expected a value ≤ 100, got 500" in result.stderr
    assert "Traceback" not in result.stderr
    missing = spotwright("import", "karpenter", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2
    assert "nope.yaml: no such file" in missing.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("a: [\n", encoding="utf-8")
    syntax = spotwright("import", "karpenter", str(broken))
    assert syntax.returncode == 2 and "invalid YAML" in syntax.stderr
