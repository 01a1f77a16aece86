"""Prometheus metrics for every controller action, in simulation as well as live.

Each run gets its own CollectorRegistry so that simulations in one process (tests, benches)
do not share counters. Names follow Karpenter's where a Karpenter metric exists.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["Metrics"]


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.nodeclaims_created = Counter(
            "spotwright_nodeclaims_created",
            "Node claims created by the provisioner",
            ["nodepool"],
            registry=r,
        )
        self.nodes_launched = Counter(
            "spotwright_nodes_launched",
            "Instances launched, by capacity type",
            ["nodepool", "capacity_type", "instance_type"],
            registry=r,
        )
        self.launch_failures = Counter(
            "spotwright_launch_failures",
            "Failed launches by EC2 error code",
            ["reason", "capacity_type"],
            registry=r,
        )
        self.nodeclaims_terminated = Counter(
            "spotwright_nodeclaims_terminated",
            "Node claims deleted, by reason",
            ["reason"],
            registry=r,
        )
        self.pods_unschedulable = Gauge(
            "spotwright_pods_unschedulable",
            "Pods the last scheduling round could not place anywhere",
            registry=r,
        )
        self.scheduling_duration = Histogram(
            "spotwright_scheduling_duration_seconds",
            "Wall time of one scheduling round",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5),
            registry=r,
        )
        self.interruption_messages = Counter(
            "spotwright_interruption_received_messages",
            "Interruption signals received, by kind",
            ["kind"],
            registry=r,
        )
        self.interruption_errors = Counter(
            "spotwright_interruption_message_errors",
            "Messages that could not be parsed or handled",
            ["reason"],
            registry=r,
        )
        self.receipt_to_taint = Histogram(
            "spotwright_interruption_receipt_to_taint_seconds",
            "From an interruption message's receipt to its node's taint",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
            registry=r,
        )
        self.messages_held = Gauge(
            "spotwright_interruption_messages_in_flight",
            "Messages kept in flight until their action is over",
            registry=r,
        )
        self.termination_errors = Counter(
            "spotwright_termination_errors",
            "Node-claim terminations that failed and were started again, by error",
            ["reason"],
            registry=r,
        )
        self.actions = Counter(
            "spotwright_interruption_actions_performed",
            "Actions taken on a node because of an interruption signal",
            ["action"],
            registry=r,
        )
        self.pods_evicted = Counter(
            "spotwright_pods_evicted",
            "Pods evicted through the Eviction API while draining",
            ["reason"],
            registry=r,
        )
        self.eviction_blocked = Counter(
            "spotwright_eviction_blocked",
            "Evictions refused by a PodDisruptionBudget (HTTP 429)",
            registry=r,
        )
        self.drains = Counter(
            "spotwright_nodes_drained",
            "Nodes drained, by outcome (before_deadline, deadline_exceeded)",
            ["result"],
            registry=r,
        )
        self.nodegroup_nodes = Gauge(
            "spotwright_nodegroup_nodes",
            "Live node claims of a node group, by capacity type",
            ["nodegroup", "capacity_type"],
            registry=r,
        )
        self.nodegroup_target = Gauge(
            "spotwright_nodegroup_target_nodes",
            "Nodes a node group wants, by capacity type (its on-demand/spot split)",
            ["nodegroup", "capacity_type"],
            registry=r,
        )
        self.drain_duration = Histogram(
            "spotwright_node_drain_duration_seconds",
            "From drain start to the last pod gone",
            buckets=(1, 5, 10, 20, 30, 45, 60, 90, 120, 300),
            registry=r,
        )
