"""The EventBridge events the simulated market emits, in the exact shape AWS sends.

The simulation feeds these dicts to the same queue-mode parser that reads SQS in
production, so they must be byte-for-byte plausible: a field the parser does not expect
here would be a bug found only in a live cluster.
"""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "ACCOUNT",
    "REBALANCE",
    "SPOT_WARNING",
    "STATE_CHANGE",
    "iso_z",
    "rebalance_recommendation",
    "spot_interruption_warning",
    "state_change",
]

#: The account number AWS uses in its documentation examples.
ACCOUNT = "123456789012"
SPOT_WARNING = "EC2 Spot Instance Interruption Warning"
REBALANCE = "EC2 Instance Rebalance Recommendation"
STATE_CHANGE = "EC2 Instance State-change Notification"


def iso_z(epoch: float) -> str:
    """EventBridge's ``time`` format: second precision, UTC, ``Z`` suffix."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _envelope(
    rng: random.Random,
    detail_type: str,
    *,
    now: float,
    region: str,
    instance_id: str,
    detail: dict[str, Any],
) -> dict[str, Any]:
    # The id comes from the market's rng, not uuid4(), so a seeded run replays exactly.
    event_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return {
        "version": "0",
        "id": event_id,
        "detail-type": detail_type,
        "source": "aws.ec2",
        "account": ACCOUNT,
        "time": iso_z(now),
        "region": region,
        "resources": [f"arn:aws:ec2:{region}:{ACCOUNT}:instance/{instance_id}"],
        "detail": detail,
    }


def spot_interruption_warning(
    rng: random.Random, *, now: float, region: str, instance_id: str, action: str = "terminate"
) -> dict[str, Any]:
    detail = {"instance-id": instance_id, "instance-action": action}
    return _envelope(
        rng, SPOT_WARNING, now=now, region=region, instance_id=instance_id, detail=detail
    )


def rebalance_recommendation(
    rng: random.Random, *, now: float, region: str, instance_id: str
) -> dict[str, Any]:
    detail = {"instance-id": instance_id}
    return _envelope(rng, REBALANCE, now=now, region=region, instance_id=instance_id, detail=detail)


def state_change(
    rng: random.Random, *, now: float, region: str, instance_id: str, state: str
) -> dict[str, Any]:
    detail = {"instance-id": instance_id, "state": state}
    return _envelope(
        rng, STATE_CHANGE, now=now, region=region, instance_id=instance_id, detail=detail
    )
