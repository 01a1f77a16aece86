"""Data shared by every layer: resources, label keys and the objects controllers act on."""

from spotwright.model.objects import (
    Deployment,
    Node,
    NodeClaim,
    NodeSelectorRequirement,
    Pod,
    PodDisruptionBudget,
    Taint,
    Toleration,
)
from spotwright.model.resources import Resources

__all__ = [
    "Deployment",
    "Node",
    "NodeClaim",
    "NodeSelectorRequirement",
    "Pod",
    "PodDisruptionBudget",
    "Resources",
    "Taint",
    "Toleration",
]
