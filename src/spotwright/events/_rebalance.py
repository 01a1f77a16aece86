"""EC2 Instance Rebalance Recommendation: an early, best-effort hint of elevated risk.

It sets no deadline (AWS publishes no lead time, and many recommendations are never
followed by an interruption), so the controller decides what it is worth: Karpenter only
records it, NTH cordons or drains it depending on its settings.
"""

from __future__ import annotations

from spotwright.events._common import Envelope, detail_where, instance_id_field
from spotwright.events.model import EventKind, InterruptionEvent, notice_event_id

__all__ = ["DETAIL_TYPE", "SOURCE", "parse"]

SOURCE = "aws.ec2"
DETAIL_TYPE = "EC2 Instance Rebalance Recommendation"


def parse(env: Envelope) -> list[InterruptionEvent]:
    instance_id = instance_id_field(env.detail, "instance-id", where=detail_where(env))
    kind = EventKind.REBALANCE_RECOMMENDATION
    return [
        env.event(
            kind,
            instance_id,
            id=notice_event_id(kind, instance_id, env.time),
            deadline=None,
            detail=f"rebalance recommendation: {instance_id} is at elevated risk of interruption",
        )
    ]
