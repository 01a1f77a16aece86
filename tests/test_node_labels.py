"""The labels a launched node registers with, in every vocabulary its pods may use."""

from __future__ import annotations

from spotwright.catalog import load_catalog
from spotwright.model import labels as wk
from spotwright.model.nodes import node_labels
from spotwright.model.objects import NodeClaim


def _labels(capacity_type: str, claim_labels: dict[str, str]) -> dict[str, str]:
    claim = NodeClaim(name="default-b7x2k", nodepool="default", labels=claim_labels)
    return node_labels(
        claim=claim,
        instance_type=load_catalog().get("m5.large"),
        zone="us-east-1a",
        region="us-east-1",
        capacity_type=capacity_type,
        hostname="ip-10-0-0-1.ec2.internal",
    )


def test_reserved_capacity_is_on_demand_to_eks_and_eksctl() -> None:
    labels = _labels(wk.RESERVED, {})
    assert labels[wk.CAPACITY_TYPE] == wk.RESERVED
    assert labels["eks.amazonaws.com/capacityType"] == "ON_DEMAND"
    assert labels["lifecycle"] == "OnDemand"


def test_a_lifecycle_label_set_by_the_nodepool_is_kept() -> None:
    """``lifecycle: stable`` is an ordinary label there; pods selecting it must still fit."""
    labels = _labels(wk.SPOT, {"lifecycle": "stable", wk.NODEPOOL: "default"})
    assert labels["lifecycle"] == "stable"
    assert labels["eks.amazonaws.com/capacityType"] == "SPOT"
