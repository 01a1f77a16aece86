"""AWS Health scheduled changes for EC2 (retirement, maintenance, reboots).

One Health event can name several instances in ``affectedEntities``; each becomes its own
interruption event, so each node is drained and acknowledged on its own. Health events for
other services or categories (issues, account notifications) are valid but not about
instances going away: they parse to no events, as Karpenter and NTH ignore them too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spotwright.events._common import (
    Envelope,
    detail_where,
    is_instance_id,
    optional_str,
    parse_time,
)
from spotwright.events.model import EventKind, InterruptionEvent, MalformedEvent

__all__ = ["DETAIL_TYPE", "SOURCE", "parse"]

SOURCE = "aws.health"
DETAIL_TYPE = "AWS Health Event"


def parse(env: Envelope) -> list[InterruptionEvent]:
    where = detail_where(env)
    service = optional_str(env.detail, "service", where=where)
    category = optional_str(env.detail, "eventTypeCategory", where=where)
    if service != "EC2" or category != "scheduledChange":
        return []
    code = optional_str(env.detail, "eventTypeCode", where=where) or "scheduledChange"
    start_text = optional_str(env.detail, "startTime", where=where)
    deadline = parse_time(start_text, where=f"{where} startTime") if start_text else None
    description = _description(env.detail)
    kind = EventKind.SCHEDULED_CHANGE
    events = []
    for instance_id in _instances(env, where):
        text = f"scheduled change {code} for {instance_id}"
        if description:
            text += f": {description}"
        events.append(env.event(kind, instance_id, deadline=deadline, detail=text, action=code))
    return events


def _instances(env: Envelope, where: str) -> list[str]:
    """Instance ids from ``affectedEntities``, else from ``resources``; others are skipped.

    Entities can be dedicated hosts or volumes; only instances can be drained.
    """
    entities = env.detail.get("affectedEntities")
    found: list[str] = []
    if entities is not None:
        if not isinstance(entities, list):
            raise MalformedEvent(f"{where}: affectedEntities must be a list")
        for index, entity in enumerate(entities):
            if not isinstance(entity, Mapping):
                raise MalformedEvent(f"{where}: affectedEntities[{index}] must be an object")
            value = entity.get("entityValue")
            if not isinstance(value, str):
                raise MalformedEvent(
                    f"{where}: affectedEntities[{index}].entityValue must be a string"
                )
            if is_instance_id(value.strip()):
                found.append(value.strip())
    if not found:
        for resource in env.resources:
            candidate = resource.rsplit("/", 1)[-1]
            if is_instance_id(candidate):
                found.append(candidate)
    # The same instance named twice is one event, in first-seen order.
    return list(dict.fromkeys(found))


def _description(detail: Mapping[str, Any]) -> str:
    """The first line of the English description, for logs and Kubernetes Events."""
    items = detail.get("eventDescription")
    if not isinstance(items, list):
        return ""
    for item in items:
        if isinstance(item, Mapping) and isinstance(item.get("latestDescription"), str):
            text: str = item["latestDescription"].strip()
            return text.splitlines()[0] if text else ""
    return ""
