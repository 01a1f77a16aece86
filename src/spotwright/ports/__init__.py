"""Narrow interfaces between the controllers and the worlds they run in."""

from spotwright.ports.clock import Clock, LoopClock
from spotwright.ports.cloud import (
    Cloud,
    CloudError,
    Instance,
    InsufficientCapacityError,
    LaunchRequest,
    Offering,
    OfferingError,
    QuotaExceededError,
)
from spotwright.ports.cluster import Cluster, ClusterError, EvictionBlocked, NotFound, WatchEvent
from spotwright.ports.queue import Message, MessageQueue

__all__ = [
    "Clock",
    "Cloud",
    "CloudError",
    "Cluster",
    "ClusterError",
    "EvictionBlocked",
    "Instance",
    "InsufficientCapacityError",
    "LaunchRequest",
    "LoopClock",
    "Message",
    "MessageQueue",
    "NotFound",
    "Offering",
    "OfferingError",
    "QuotaExceededError",
    "WatchEvent",
]
