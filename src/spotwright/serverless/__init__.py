"""Serverless mode: an AWS Lambda function that drains a node when its instance is going.

``spotwright.serverless:handler`` is the Lambda entry point. It takes EventBridge events
(rules targeting the function directly) or batches of them through SQS (or SNS), turns
each into normalized interruption events with the same parsers and the same action policy
as queue mode, and acts on the node of each instance through the Kubernetes API:

* spot interruption, scheduled change, stopping or terminating instance, capacity
  reservation reclaimed: taint, cordon, take out of load balancers, drain by the notice's
  deadline (or the function's own end, whichever comes first);
* rebalance recommendation: taint and cordon only; the replacement is the Auto Scaling
  group's job (capacity rebalancing), and its terminate hook brings the drain;
* Auto Scaling terminate hook: drain while heartbeating the hook, then complete it with
  CONTINUE, or ABANDON when the drain failed or did not finish in the function's time.

The node is found by providerID, then by the instance's private DNS name
(``ec2:DescribeInstances``); an instance with no node in this cluster is left alone, so
events about other clusters' instances complete nobody else's hooks.

The function reaches the API server with an EKS bearer token: ``k8s-aws-v1.`` followed by
the unpadded base64url of a presigned STS GetCallerIdentity URL that signs the header
``x-k8s-aws-id: <cluster name>`` (``eks_token``); the function's role must be granted
access in the cluster (an access entry or aws-auth mapping, see docs/serverless.md).

Everything is built per invocation inside ``handler`` from the environment
(``runtime.live_runtime``, with the token and the Kubernetes client of ``eks``); tests pass
their own ``runtime`` factory instead, with an in-memory cluster, the in-memory Auto
Scaling recorder and the simulated market.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from spotwright.controllers.context import Context, Settings
from spotwright.controllers.lifecycle import (
    DrainTimedOut,
    bounded,
    cordon_and_drain,
    drain_and_complete,
    find_node,
)
from spotwright.events import EventKind, EventParseError, InterruptionEvent, parse_eventbridge
from spotwright.events.actions import Action, ActionName, Step, plan_action
from spotwright.observability.logs import configure_logging, get_logger
from spotwright.observability.metrics import Metrics
from spotwright.serverless.eks import (
    CLUSTER_ID_HEADER,
    TOKEN_LIFETIME_SECONDS,
    TOKEN_PREFIX,
    EksToken,
    connect_cluster,
    disconnect_cluster,
    eks_token,
    kube_config,
)
from spotwright.serverless.runtime import Runtime, RuntimeFactory, live_runtime

__all__ = [
    "CLUSTER_ID_HEADER",
    "RESERVE_SECONDS",
    "TOKEN_LIFETIME_SECONDS",
    "TOKEN_PREFIX",
    "EksToken",
    "Runtime",
    "RuntimeFactory",
    "connect_cluster",
    "disconnect_cluster",
    "eks_token",
    "handle",
    "handler",
    "kube_config",
    "live_runtime",
]

log = get_logger("serverless")

RESERVE_SECONDS: Final = 10.0


@dataclass(frozen=True, slots=True)
class _Record:
    """One message of the invocation: the event itself, or one SQS/SNS record's body."""

    body: str | Mapping[str, Any]
    #: The SQS message id, for a partial batch failure report.
    sqs_id: str | None = None


_LOGGING_CONFIGURED = False


def handler(
    event: Mapping[str, Any], context: Any, *, runtime: RuntimeFactory | None = None
) -> dict[str, Any]:
    """The Lambda entry point: handle every interruption in ``event``; return a summary.

    For an SQS batch the summary carries ``batchItemFailures`` (the function's event source
    mapping should report batch item failures), so only the failed messages come back.
    Invoked directly (EventBridge), a failure raises after logging the summary, so Lambda
    retries the event.
    """
    global _LOGGING_CONFIGURED
    if runtime is None and not _LOGGING_CONFIGURED:
        configure_logging(
            fmt="json" if os.environ.get("SPOTWRIGHT_LOG_FORMAT", "json") == "json" else "text",
            level=os.environ.get("SPOTWRIGHT_LOG_LEVEL", "info"),
            stream=sys.stdout,
        )
        _LOGGING_CONFIGURED = True
    summary = asyncio.run(handle(event, context, runtime or live_runtime))
    if summary["failed"] and "batchItemFailures" not in summary:
        raise RuntimeError(f"{summary['failed']} interruption(s) failed: {json.dumps(summary)}")
    return summary


async def handle(event: Mapping[str, Any], context: Any, runtime: RuntimeFactory) -> dict[str, Any]:
    """``handler`` without the event loop and the raising: the summary of one invocation."""
    records, batch = _records(event)
    rt = await runtime()
    metrics = Metrics()
    try:
        ctx = Context(
            cluster=rt.cluster,
            cloud=rt.cloud,
            clock=rt.clock,
            metrics=metrics,
            nodepools=(),
            instance_types={},
            settings=Settings(force_at_deadline=rt.policy.at_deadline == "force"),
        )
        remaining = _remaining_seconds(context)
        end_at = None if remaining is None else rt.clock.now() + remaining - RESERVE_SECONDS
        seen: set[str] = set()
        outcomes = await asyncio.gather(
            *(_handle_record(ctx, rt, record, end_at, seen) for record in records)
        )
    finally:
        if rt.close is not None:
            await rt.close()
    results = [result for per_record in outcomes for result in per_record]
    failed_ids = [
        record.sqs_id
        for record, per_record in zip(records, outcomes, strict=True)
        if record.sqs_id is not None and any(r["outcome"] == "failed" for r in per_record)
    ]
    summary: dict[str, Any] = {
        "records": len(records),
        "events": len(results),
        "failed": sum(1 for r in results if r["outcome"] == "failed"),
        "pods_evicted": _count(metrics, "spotwright_pods_evicted_total", reason="drain"),
        "pods_deleted_at_deadline": _count(
            metrics, "spotwright_pods_evicted_total", reason="deadline"
        ),
        "results": results,
    }
    if batch:
        summary["batchItemFailures"] = [{"itemIdentifier": i} for i in failed_ids]
    log.info(
        "invocation done",
        records=summary["records"],
        events=summary["events"],
        failed=summary["failed"],
        pods_evicted=summary["pods_evicted"],
    )
    return summary


def _records(event: Mapping[str, Any]) -> tuple[list[_Record], bool]:
    """The messages of an invocation, and whether it is an SQS batch."""
    raw = event.get("Records")
    if not isinstance(raw, list):
        return [_Record(event)], False
    records: list[_Record] = []
    batch = False
    for item in raw:
        if not isinstance(item, Mapping):
            continue
        if item.get("eventSource") == "aws:sqs":
            batch = True
            records.append(_Record(str(item.get("body", "")), str(item.get("messageId", ""))))
        elif item.get("EventSource") == "aws:sns":
            records.append(_Record(str((item.get("Sns") or {}).get("Message", ""))))
        else:
            records.append(_Record(item))
    return records, batch


async def _handle_record(
    ctx: Context, rt: Runtime, record: _Record, end_at: float | None, seen: set[str]
) -> list[dict[str, Any]]:
    try:
        events = parse_eventbridge(record.body, source="lambda")
    except EventParseError as exc:
        log.warning("dropping message that cannot be parsed", error=str(exc))
        return [{"outcome": "unparseable", "error": str(exc)}]
    results = []
    for event in events:
        if event.id in seen:
            continue
        seen.add(event.id)
        results.append(await _handle_event(ctx, rt, event, end_at))
    return results


async def _handle_event(
    ctx: Context, rt: Runtime, event: InterruptionEvent, end_at: float | None
) -> dict[str, Any]:
    action = plan_action(event, rt.policy)
    result: dict[str, Any] = {
        "event_id": event.id,
        "kind": event.kind.value,
        "instance_id": event.instance_id,
        "action": action.name.value,
    }
    started = ctx.clock.now()
    try:
        result.update(await _act(ctx, rt, event, action, end_at))
    except Exception as exc:  # reported, and retried by Lambda or the queue
        ctx.metrics.interruption_errors.labels(type(exc).__name__).inc()
        log.error(
            "failed to handle interruption",
            kind=event.kind.value,
            instance_id=event.instance_id,
            error=f"{type(exc).__name__}: {exc}",
        )
        result.update(outcome="failed", error=f"{type(exc).__name__}: {exc}")
    result["seconds"] = round(ctx.clock.now() - started, 3)
    return result


async def _act(
    ctx: Context,
    rt: Runtime,
    event: InterruptionEvent,
    action: Action,
    end_at: float | None,
) -> dict[str, Any]:
    fields = {"kind": event.kind.value, "instance_id": event.instance_id}
    if event.kind is EventKind.ASG_LIFECYCLE_LAUNCH or not action.steps:
        reason = (
            "launch hooks are completed by the queue-mode controller"
            if event.kind is EventKind.ASG_LIFECYCLE_LAUNCH
            else action.reason
        )
        log.info("nothing to do", reason=reason, **fields)
        return {"outcome": "ignored", "reason": reason}
    ctx.metrics.interruption_messages.labels(event.kind.value).inc()
    node = await find_node(ctx, event.instance_id)
    if node is None:
        # Not a node of this cluster (or not registered): someone else's instance, whose
        # hook is not ours to complete.
        log.info("no node of this cluster runs the instance", **fields)
        return {"outcome": "not-found", "node": None}
    log.info("interruption received", node=node, action=action.name.value, **fields)
    await ctx.cluster.record_event(
        "Node", node, "InstanceInterrupted", f"{event.kind.value}: {event.detail}", warning=True
    )
    now = ctx.clock.now()
    limit = None if end_at is None else max(0.0, end_at - now)
    if action.name is ActionName.DRAIN_AND_COMPLETE_LIFECYCLE:
        outcome = await drain_and_complete(ctx, rt.autoscaling, action, node, limit=limit)
        ctx.metrics.actions.labels(action.name.value).inc()
        return {
            "node": node,
            "outcome": (
                "abandoned"
                if outcome.result == "ABANDON"
                else "drained"
                if outcome.drained
                else "node-gone"
            ),
            "lifecycle_result": outcome.result,
            "lifecycle_already_over": outcome.already_over,
            "heartbeats": outcome.heartbeats,
            **({"error": outcome.error} if outcome.error else {}),
        }
    if action.has(Step.WAIT_FOR_REPLACEMENT):
        # No replacement to wait for here: cordon now, the group's terminate hook drains.
        kept = tuple(s for s in action.steps if s in (Step.TAINT, Step.CORDON))
        action = dataclasses.replace(action, steps=kept)
    deadline = action.deadline
    if end_at is not None and (deadline is None or end_at < deadline):
        deadline = end_at
    try:
        drained = await bounded(
            ctx.clock, limit, cordon_and_drain(ctx, node, action, deadline=deadline)
        )
    except DrainTimedOut:
        log.warning("drain unfinished when the function's time ran out", node=node, **fields)
        return {"node": node, "outcome": "unfinished"}
    ctx.metrics.actions.labels(action.name.value).inc()
    if not action.has(Step.DRAIN):
        return {"node": node, "outcome": "cordoned" if drained else "node-gone"}
    return {"node": node, "outcome": "drained" if drained else "node-gone"}


def _remaining_seconds(context: Any) -> float | None:
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    return None if remaining is None else float(remaining()) / 1000.0


def _count(metrics: Metrics, name: str, **labels: str) -> int:
    value = metrics.registry.get_sample_value(name, labels)
    return 0 if value is None else int(value)
