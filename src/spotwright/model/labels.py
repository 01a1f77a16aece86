"""Well-known label, taint and annotation keys.

Karpenter's vocabulary is the canonical one; EKS managed node group and eksctl labels are
understood as aliases so that manifests written for those keep scheduling.
"""

from __future__ import annotations

__all__ = [
    "ALIASES",
    "ARCH",
    "CAPACITY_TYPE",
    "CAPACITY_TYPES",
    "DISRUPTED_TAINT_KEY",
    "HOSTNAME",
    "INSTANCE_CATEGORY",
    "INSTANCE_CPU",
    "INSTANCE_FAMILY",
    "INSTANCE_GENERATION",
    "INSTANCE_GPU_COUNT",
    "INSTANCE_GPU_NAME",
    "INSTANCE_MEMORY",
    "INSTANCE_SIZE",
    "INSTANCE_TYPE",
    "NODEPOOL",
    "ON_DEMAND",
    "OS",
    "REGION",
    "RESERVED",
    "SPOT",
    "WELL_KNOWN",
    "ZONE",
]

NODEPOOL = "karpenter.sh/nodepool"
CAPACITY_TYPE = "karpenter.sh/capacity-type"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
ZONE = "topology.kubernetes.io/zone"
REGION = "topology.kubernetes.io/region"
ARCH = "kubernetes.io/arch"
OS = "kubernetes.io/os"
HOSTNAME = "kubernetes.io/hostname"

INSTANCE_CATEGORY = "karpenter.k8s.aws/instance-category"
INSTANCE_FAMILY = "karpenter.k8s.aws/instance-family"
INSTANCE_GENERATION = "karpenter.k8s.aws/instance-generation"
INSTANCE_SIZE = "karpenter.k8s.aws/instance-size"
INSTANCE_CPU = "karpenter.k8s.aws/instance-cpu"
INSTANCE_MEMORY = "karpenter.k8s.aws/instance-memory"
INSTANCE_GPU_COUNT = "karpenter.k8s.aws/instance-gpu-count"
INSTANCE_GPU_NAME = "karpenter.k8s.aws/instance-gpu-name"

SPOT = "spot"
ON_DEMAND = "on-demand"
RESERVED = "reserved"
#: Capacity types in the order they are preferred when a pod allows several.
CAPACITY_TYPES = (RESERVED, SPOT, ON_DEMAND)

#: Taint put on a node that is being drained (interruption, deletion, disruption).
DISRUPTED_TAINT_KEY = "karpenter.sh/disrupted"

#: Labels a NodePool requirement may constrain. Anything else must be a template label.
WELL_KNOWN = frozenset(
    {
        NODEPOOL,
        CAPACITY_TYPE,
        INSTANCE_TYPE,
        ZONE,
        REGION,
        ARCH,
        OS,
        INSTANCE_CATEGORY,
        INSTANCE_FAMILY,
        INSTANCE_GENERATION,
        INSTANCE_SIZE,
        INSTANCE_CPU,
        INSTANCE_MEMORY,
        INSTANCE_GPU_COUNT,
        INSTANCE_GPU_NAME,
    }
)

#: Deprecated or foreign label keys and the canonical key they mean.
ALIASES = {
    "beta.kubernetes.io/arch": ARCH,
    "beta.kubernetes.io/os": OS,
    "beta.kubernetes.io/instance-type": INSTANCE_TYPE,
    "failure-domain.beta.kubernetes.io/zone": ZONE,
    "failure-domain.beta.kubernetes.io/region": REGION,
}
