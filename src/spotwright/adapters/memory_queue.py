"""An in-memory stand-in for an SQS queue, with SQS's delivery semantics.

Received messages are in flight (invisible) until deleted, released or their visibility
timeout runs out; each delivery has a receipt of its own, and only the latest one counts,
as in SQS. A released message, or one whose visibility ran out, is delivered again (a
release after ``release_delay``); after ``max_receives`` deliveries it is moved aside, as
an SQS redrive policy would move it to a dead-letter queue. The simulator's market
publishes EventBridge events into it, and the interruption controller reads it exactly as
it reads SQS live.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from spotwright.ports.queue import Message

__all__ = ["MemoryQueue"]


@dataclass
class _Flight:
    message: Message
    expiry: asyncio.TimerHandle | None


class MemoryQueue:
    def __init__(
        self,
        *,
        release_delay: float = 30.0,
        max_receives: int = 5,
        visibility_timeout: float | None = 30.0,
    ) -> None:
        """``visibility_timeout``: SQS's default; ``None`` keeps messages in flight until
        they are deleted or released."""
        self.release_delay = release_delay
        self.max_receives = max_receives
        self.visibility_timeout = visibility_timeout
        self._receives: dict[str, int] = {}
        self.dead_letters: list[Message] = []
        self._ready: deque[Message] = deque()
        self._in_flight: dict[str, _Flight] = {}
        self._ids = itertools.count(1)
        self._deliveries = itertools.count(1)
        self._arrived = asyncio.Event()
        self.deleted = 0

    def put(self, body: str | Mapping[str, Any]) -> Message:
        text = body if isinstance(body, str) else json.dumps(body)
        n = next(self._ids)
        message = Message(id=f"msg-{n}", body=text, receipt=f"rcpt-{n}")
        self._ready.append(message)
        self._arrived.set()
        return message

    def __len__(self) -> int:
        return len(self._ready) + len(self._in_flight)

    @property
    def in_flight(self) -> int:
        """Messages received and neither deleted nor back in the queue yet."""
        return len(self._in_flight)

    async def receive(self, max_messages: int = 10, wait_seconds: float = 20.0) -> list[Message]:
        if not self._ready:
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), wait_seconds)
            except TimeoutError:
                return []
        batch: list[Message] = []
        while self._ready and len(batch) < max_messages:
            queued = self._ready.popleft()
            message = replace(queued, receipt=f"{queued.receipt}.{next(self._deliveries)}")
            self._in_flight[message.receipt] = _Flight(
                message, self._expire_after(self.visibility_timeout, message)
            )
            batch.append(message)
        return batch

    async def delete(self, message: Message) -> None:
        flight = self._in_flight.pop(message.receipt, None)
        if flight is not None:
            _cancel(flight)
            self.deleted += 1

    async def release(self, message: Message) -> None:
        flight = self._in_flight.pop(message.receipt, None)
        if flight is None:
            return
        _cancel(flight)
        self._returned(message, self.release_delay)

    async def extend(self, messages: Sequence[Message], seconds: float) -> list[Message]:
        lost: list[Message] = []
        for message in messages:
            flight = self._in_flight.get(message.receipt)
            if flight is None:
                lost.append(message)
                continue
            _cancel(flight)
            flight.expiry = self._expire_after(seconds, message)
        return lost

    def _expire_after(self, seconds: float | None, message: Message) -> asyncio.TimerHandle | None:
        if seconds is None:
            return None
        return asyncio.get_running_loop().call_later(seconds, self._expired, message)

    def _expired(self, message: Message) -> None:
        if self._in_flight.pop(message.receipt, None) is not None:
            self._returned(message, 0.0)

    def _returned(self, message: Message, delay: float) -> None:
        """Back to the queue after ``delay``, or aside once received ``max_receives`` times."""
        count = self._receives.get(message.id, 0) + 1
        self._receives[message.id] = count
        if count >= self.max_receives:
            self.dead_letters.append(message)
            return
        original = replace(message, receipt=message.receipt.rsplit(".", 1)[0])
        if delay <= 0:
            self._requeue(original)
        else:
            asyncio.get_running_loop().call_later(delay, self._requeue, original)

    def _requeue(self, message: Message) -> None:
        self._ready.append(message)
        self._arrived.set()


def _cancel(flight: _Flight) -> None:
    if flight.expiry is not None:
        flight.expiry.cancel()
        flight.expiry = None
