"""A fake EC2 instance-metadata service, for testing interruption handlers without EC2.

``start_mock(MockConfig(...))`` serves amazon-ec2-metadata-mock's paths on a local port and
returns a ``RunningMock`` whose ``state`` (or HTTP control endpoint) raises notices.

The server half needs aiohttp, which costs a noticeable part of a second to import; every
``spotwright`` command imports this package for its option choices, so the server names
are loaded on first use (PEP 562) and the plain-data ones right away.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from spotwright.imds.state import (
    ACTIONS,
    EVENT_CODES,
    EVENT_STATES,
    LIFECYCLE_STATES,
    NOTICE_SECONDS,
    MockState,
    RebalanceNotice,
    ScheduledEvent,
    SpotNotice,
    aws_event_time,
    parse_time,
    scheduled_event,
    scheduled_event_from_spec,
    spot_notice,
)

if TYPE_CHECKING:
    from spotwright.imds.control import CONTROL_PREFIX
    from spotwright.imds.mock import (
        MAX_TOKEN_TTL,
        TOKEN_HEADER,
        TTL_HEADER,
        MockConfig,
        RunningMock,
        start_mock,
    )

__all__ = [
    "ACTIONS",
    "CONTROL_PREFIX",
    "EVENT_CODES",
    "EVENT_STATES",
    "LIFECYCLE_STATES",
    "MAX_TOKEN_TTL",
    "NOTICE_SECONDS",
    "TOKEN_HEADER",
    "TTL_HEADER",
    "MockConfig",
    "MockState",
    "RebalanceNotice",
    "RunningMock",
    "ScheduledEvent",
    "SpotNotice",
    "aws_event_time",
    "parse_time",
    "scheduled_event",
    "scheduled_event_from_spec",
    "spot_notice",
    "start_mock",
]

_SERVER_NAMES = {
    "CONTROL_PREFIX": "spotwright.imds.control",
    "MAX_TOKEN_TTL": "spotwright.imds.mock",
    "TOKEN_HEADER": "spotwright.imds.mock",
    "TTL_HEADER": "spotwright.imds.mock",
    "MockConfig": "spotwright.imds.mock",
    "RunningMock": "spotwright.imds.mock",
    "start_mock": "spotwright.imds.mock",
}


def __getattr__(name: str) -> Any:
    module = _SERVER_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
