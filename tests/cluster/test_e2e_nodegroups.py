"""``spotwright controller --nodegroups`` on a real control plane, with kwok Nodes.

An eksctl ClusterConfig's node group (4 nodes: an on-demand base of 2, the rest spot)
comes up as NodeClaim objects labelled with the group and Nodes of the right capacity
types; a restarted controller finds the group whole and launches nothing more.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from _e2e import Controller, NodeClaimCR, admin, controller_args, install, remove_pool
from lightkube import ApiError
from lightkube.resources.core_v1 import Node

from spotwright.testing.cluster import TestCluster

pytestmark = pytest.mark.cluster


def cluster_config(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "eksctl.io/v1alpha5",
        "kind": "ClusterConfig",
        "metadata": {"name": "e2e", "region": "us-east-1"},
        "nodeGroups": [
            {
                "name": name,
                "minSize": 4,
                "maxSize": 8,
                # The label lets remove_pool find the nodes afterwards.
                "labels": {"e2e": name},
                "instancesDistribution": {
                    "instanceTypes": ["m5.large", "m6i.large", "c5.large"],
                    "onDemandBaseCapacity": 2,
                    "onDemandPercentageAboveBaseCapacity": 0,
                },
            }
        ],
    }


async def group_state(cluster: TestCluster, name: str) -> tuple[set[str], dict[str, int]]:
    """The group's claim names and its Nodes by capacity type."""
    client = admin(cluster)
    try:
        claims = {
            c["metadata"]["name"]
            async for c in client.list(NodeClaimCR, labels={"spotwright.io/nodegroup": name})
        }
        nodes: dict[str, int] = {}
        async for node in client.list(Node, labels={"spotwright.io/nodegroup": name}):
            labels = (node.metadata.labels if node.metadata else None) or {}
            capacity = labels.get("karpenter.sh/capacity-type", "?")
            nodes[capacity] = nodes.get(capacity, 0) + 1
        return claims, nodes
    finally:
        await client.close()


def wait_for(cluster: TestCluster, name: str, want: dict[str, int], timeout: float) -> set[str]:
    give_up = time.monotonic() + timeout
    claims: set[str] = set()
    nodes: dict[str, int] = {}
    while True:
        try:
            claims, nodes = asyncio.run(group_state(cluster, name))
        except ApiError as exc:  # 429 while a freshly installed CRD's storage starts
            if exc.status.code != 429:
                raise
        else:
            if nodes == want:
                return claims
        if time.monotonic() > give_up:
            raise AssertionError(f"group nodes {nodes}, wanted {want}; claims {sorted(claims)}")
        time.sleep(0.5)


def test_a_node_group_comes_up_and_survives_a_controller_restart(
    test_cluster: TestCluster, namespace: str, tmp_path: Path
) -> None:
    kubeconfig = install(test_cluster)
    name = f"ng-{namespace[-6:]}"
    config = tmp_path / "cluster.yaml"
    config.write_text(yaml.safe_dump(cluster_config(name)))
    args = [*controller_args(kubeconfig, lease=f"lease-{name}"), "--nodegroups", str(config)]
    try:
        first = Controller(f"{name}-a", args, test_cluster.log_dir)
        try:
            claims = wait_for(test_cluster, name, {"on-demand": 2, "spot": 2}, timeout=90)
            assert len(claims) == 4, first.tail()
            assert len(first.logged("created nodeclaim for node group")) == 4, first.tail()
        finally:
            first.kill()
        second = Controller(f"{name}-b", args, test_cluster.log_dir)
        try:
            time.sleep(8)  # long enough to have acted on anything it found missing
            again = wait_for(test_cluster, name, {"on-demand": 2, "spot": 2}, timeout=30)
            assert again == claims, second.tail()
            assert not second.logged("created nodeclaim for node group"), second.tail()
        finally:
            second.kill()
    finally:
        asyncio.run(remove_pool(test_cluster, name))
