"""Pure scheduling: which pods go where, and which instances to ask for.

No I/O, no asyncio, no logging: the provisioner and the in-memory kube-scheduler call
these functions with plain data and act on the result.
"""

from spotwright.scheduling.compat import compat_labels
from spotwright.scheduling.fit import node_fit, pod_requests, pod_requirements
from spotwright.scheduling.offerings import choose_offerings
from spotwright.scheduling.packing import schedule
from spotwright.scheduling.plan import ClaimPlan, ExistingCapacity, NodePoolTemplate, Plan
from spotwright.scheduling.requirements import Requirements
from spotwright.scheduling.taints import tolerates

__all__ = [
    "ClaimPlan",
    "ExistingCapacity",
    "NodePoolTemplate",
    "Plan",
    "Requirements",
    "choose_offerings",
    "compat_labels",
    "node_fit",
    "pod_requests",
    "pod_requirements",
    "schedule",
    "tolerates",
]
