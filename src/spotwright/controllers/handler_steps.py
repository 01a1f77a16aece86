"""How the IMDS-mode handler's steps are named in Kubernetes Events and counted.

Each step the handler takes becomes an Event on its Node whose reason says what happened
(``Tainted``, ``Drained``, ``DrainDeadlineExceeded``...), so ``kubectl describe node`` and
an Event-based alert read like a log of the interruption; and it is counted in
``spotwright_node_handler_steps{step, result}``.
"""

from __future__ import annotations

import weakref

from prometheus_client import CollectorRegistry, Counter

from spotwright.events.actions import Step

__all__ = ["event_reason", "step_counter"]

_REASONS = {
    Step.TAINT: "Tainted",
    Step.CORDON: "Cordoned",
    Step.EXCLUDE_FROM_LOAD_BALANCERS: "ExcludedFromLoadBalancers",
    Step.LAUNCH_REPLACEMENT: "ReplacementRequested",
    Step.WAIT_FOR_REPLACEMENT: "ReplacementReady",
    Step.DRAIN: "Drained",
    Step.UNCORDON: "Uncordoned",
    Step.HEARTBEAT: "LifecycleHeartbeat",
    Step.WAIT_FOR_NODE_READY: "NodeReady",
    Step.COMPLETE_LIFECYCLE: "LifecycleCompleted",
}
_FAILED = {
    (Step.WAIT_FOR_REPLACEMENT, "timeout"): "ReplacementNotReady",
    (Step.DRAIN, "deadline_exceeded"): "DrainDeadlineExceeded",
    (Step.DRAIN, "node_gone"): "NodeGoneBeforeDrained",
}


def event_reason(step: Step, result: str) -> str:
    """The Event reason of a step's outcome: its own name for the results worth one,
    ``<Reason>Failed`` for an error."""
    reason = _FAILED.get((step, result)) or _REASONS[step]
    return reason + "Failed" if result == "error" else reason


_STEPS: weakref.WeakKeyDictionary[CollectorRegistry, Counter] = weakref.WeakKeyDictionary()


def step_counter(registry: CollectorRegistry) -> Counter:
    counter = _STEPS.get(registry)
    if counter is None:
        counter = Counter(
            "spotwright_node_handler_steps",
            "Steps the IMDS-mode handler took on its node, by step and result",
            ["step", "result"],
            registry=registry,
        )
        _STEPS[registry] = counter
    return counter
