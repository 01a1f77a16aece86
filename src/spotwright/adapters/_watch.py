"""Change notifications fanned out to subscribers: the ``watch()`` of both Cluster adapters.

The in-memory cluster and the live one announce changes the same way, so the controllers'
watch loops behave alike in both worlds:

* a subscription exists from the moment ``watch()`` returns, not from its first
  ``__anext__``: a controller that subscribes and then reads the cache misses nothing
  that changed in between;
* each subscriber has an unbounded queue of its own, so a slow subscriber never makes
  a publisher (an informer's watch loop, the simulated scheduler) wait or drop events;
  the queue holds small ``WatchEvent`` names, never objects;
* a subscription ends when closed, or when the task iterating it is cancelled, so a
  cancelled controller does not leave a queue behind that would grow forever.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from spotwright.ports.cluster import Kind, WatchEvent

__all__ = ["Subscription", "WatchHub"]


class Subscription:
    """One subscriber's events, in order; an async iterator that never ends by itself."""

    def __init__(self, hub: WatchHub, kinds: frozenset[str]) -> None:
        self._hub = hub
        self.kinds = kinds
        self.queue: asyncio.Queue[WatchEvent] = asyncio.Queue()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> WatchEvent:
        try:
            return await self.queue.get()
        except asyncio.CancelledError:
            self.close()
            raise

    def close(self) -> None:
        """Stop receiving events (idempotent)."""
        self._hub.discard(self)

    async def aclose(self) -> None:
        """``close()``, for ``contextlib.aclosing`` and async-generator-minded callers."""
        self.close()


class WatchHub:
    """The current subscriptions of one cluster, and the fan-out to them."""

    def __init__(self) -> None:
        self._subscriptions: list[Subscription] = []

    def __len__(self) -> int:
        return len(self._subscriptions)

    def subscribe(self, kinds: Iterable[Kind], backlog: Iterable[WatchEvent] = ()) -> Subscription:
        """A subscription to ``kinds``, starting with ``backlog`` (queued before any new
        change, so a subscriber sees the existing objects first)."""
        subscription = Subscription(self, frozenset(kinds))
        for event in backlog:
            subscription.queue.put_nowait(event)
        self._subscriptions.append(subscription)
        return subscription

    def discard(self, subscription: Subscription) -> None:
        if subscription in self._subscriptions:
            self._subscriptions.remove(subscription)

    def publish(self, event: WatchEvent) -> None:
        for subscription in self._subscriptions:
            if event.kind in subscription.kinds:
                subscription.queue.put_nowait(event)
