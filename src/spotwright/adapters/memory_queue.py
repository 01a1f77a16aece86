"""An in-memory stand-in for an SQS queue, with SQS's delivery semantics.

Received messages are in flight (invisible) until deleted or released; a released message
is delivered again after a visibility delay, and after ``max_receives`` deliveries it is
moved aside, as an SQS redrive policy would move it to a dead-letter queue. The simulator's
market publishes EventBridge events into it, and the interruption controller reads it
exactly as it reads SQS live.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import deque
from collections.abc import Mapping
from typing import Any

from spotwright.ports.queue import Message

__all__ = ["MemoryQueue"]


class MemoryQueue:
    def __init__(self, *, release_delay: float = 30.0, max_receives: int = 5) -> None:
        self.release_delay = release_delay
        self.max_receives = max_receives
        self._receives: dict[str, int] = {}
        self.dead_letters: list[Message] = []
        self._ready: deque[Message] = deque()
        self._in_flight: dict[str, Message] = {}
        self._ids = itertools.count(1)
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

    async def receive(self, max_messages: int = 10, wait_seconds: float = 20.0) -> list[Message]:
        if not self._ready:
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), wait_seconds)
            except TimeoutError:
                return []
        batch: list[Message] = []
        while self._ready and len(batch) < max_messages:
            message = self._ready.popleft()
            self._in_flight[message.receipt] = message
            batch.append(message)
        return batch

    async def delete(self, message: Message) -> None:
        if self._in_flight.pop(message.receipt, None) is not None:
            self.deleted += 1

    async def release(self, message: Message) -> None:
        if self._in_flight.pop(message.receipt, None) is None:
            return
        count = self._receives.get(message.id, 0) + 1
        self._receives[message.id] = count
        if count >= self.max_receives:
            self.dead_letters.append(message)
            return
        asyncio.get_running_loop().call_later(self.release_delay, self._requeue, message)

    def _requeue(self, message: Message) -> None:
        self._ready.append(message)
        self._arrived.set()
