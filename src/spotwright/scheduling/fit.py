"""Whether a pod fits a node that already exists: kube-scheduler's filter plugins.

The provisioner plans capacity, but kube-scheduler binds. The in-memory cluster's
scheduler emulation calls ``node_fit`` so that simulated binding follows the same rules
(NodeUnschedulable, NodeAffinity, TaintToleration, NodeResourcesFit) and reports the same
short reasons kube-scheduler puts in its FailedScheduling events.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from spotwright.model.objects import Pod, Taint
from spotwright.model.resources import GPU, Resources
from spotwright.scheduling.requirements import Requirements
from spotwright.scheduling.taints import tolerates, toleration_matches

__all__ = ["node_fit", "pod_requests", "pod_requirements"]

_UNSCHEDULABLE_TAINT = Taint("node.kubernetes.io/unschedulable", "NoSchedule")


def pod_requests(pod: Pod) -> Resources:
    """What the pod takes from a node: its requests, its overhead and one pod slot."""
    total = pod.requests + pod.overhead if pod.overhead != Resources() else pod.requests
    if total.pods < 1:
        total = Resources(total.cpu, total.memory, total.gpu, 1, total.ephemeral, total.extended)
    return total


def pod_requirements(pod: Pod) -> list[Requirements]:
    """One Requirements per OR-ed required node affinity term, each AND the nodeSelector."""
    selector = Requirements.from_labels(pod.node_selector)
    if not pod.required_affinity:
        return [selector]
    return [selector.intersect(Requirements.from_terms(term)) for term in pod.required_affinity]


def node_fit(
    pod: Pod,
    *,
    labels: Mapping[str, str],
    taints: Sequence[Taint],
    unschedulable: bool,
    free: Resources,
) -> str | None:
    """None if ``pod`` may bind to the node, else kube-scheduler's reason why not."""
    if unschedulable and not any(
        toleration_matches(t, _UNSCHEDULABLE_TAINT) for t in pod.tolerations
    ):
        return "node is unschedulable"
    if not any(term.matches(labels) for term in pod_requirements(pod)):
        return "node(s) didn't match Pod's node affinity/selector"
    taint = tolerates(pod.tolerations, taints)
    if taint is not None:
        return f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}"
    need = pod_requests(pod)
    if need.pods > free.pods:
        return "Too many pods"
    if need.cpu > 0 and need.cpu > free.cpu:
        return "Insufficient cpu"
    if need.memory > 0 and need.memory > free.memory:
        return "Insufficient memory"
    if need.gpu > 0 and need.gpu > free.gpu:
        return f"Insufficient {GPU}"
    if need.ephemeral > 0 and need.ephemeral > free.ephemeral:
        return "Insufficient ephemeral-storage"
    if need.extended:
        short = need.short_of(free)
        if short:
            return f"Insufficient {short[0]}"
    return None
