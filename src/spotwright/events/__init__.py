"""Interruption signals, normalized: every source becomes an ``InterruptionEvent``."""

from spotwright.events.eventbridge import SUPPORTED, parse_eventbridge
from spotwright.events.model import (
    EventKind,
    EventParseError,
    InterruptionEvent,
    LifecycleHook,
    MalformedEvent,
    UnknownEvent,
    event_id,
)

__all__ = [
    "SUPPORTED",
    "EventKind",
    "EventParseError",
    "InterruptionEvent",
    "LifecycleHook",
    "MalformedEvent",
    "UnknownEvent",
    "event_id",
    "parse_eventbridge",
]
