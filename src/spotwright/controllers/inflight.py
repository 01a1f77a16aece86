"""Keeping interruption messages in flight until what they asked for is over.

A message is deleted once its action has finished (the node claim is gone, the lifecycle
hook completed), not when the action started: if the controller dies in between, the
message is delivered again and the next process picks the action up from it. While the
action runs, the message's visibility is extended every third of ``visibility`` seconds,
for all waiting messages in batches of ten, ten calls at a time, so a long drain never
lets it reappear; after a crash it reappears within ``visibility`` seconds.

One background task does the waiting for every held message (it runs only while some are
held), checking each message's ``done`` condition every ``poll`` seconds; a message that
could not be kept (its receipt went stale) is let go, since its redelivered copy will be
handled again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from spotwright.observability.logs import get_logger
from spotwright.observability.metrics import Metrics
from spotwright.ports.clock import Clock
from spotwright.ports.queue import Message, MessageQueue

__all__ = ["MessageKeeper"]

log = get_logger("interruption")

T = TypeVar("T")
#: Messages per ChangeMessageVisibilityBatch (SQS's limit), and queue calls at once.
_BATCH = 10
_PARALLEL = 10


@dataclass(slots=True)
class _Held:
    message: Message
    #: Delete the message once this holds; None: until ``let_go``.
    done: Callable[[], bool] | None
    extend_at: float


class MessageKeeper:
    def __init__(
        self,
        queue: MessageQueue,
        clock: Clock,
        metrics: Metrics,
        *,
        visibility: float,
        poll: float = 1.0,
    ) -> None:
        if visibility <= 0 or poll <= 0:
            raise ValueError("visibility and poll must be positive")
        self.queue = queue
        self.clock = clock
        self.metrics = metrics
        self.visibility = visibility
        self.poll = min(poll, visibility / 3)
        self._held: dict[str, _Held] = {}
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._held)

    def hold(
        self, message: Message, done: Callable[[], bool] | None = None, *, first_in: float = 0.0
    ) -> None:
        """Keep ``message`` in flight; delete it once ``done()`` holds (None: never, the
        caller lets it go and deletes or releases it itself).

        A message held already keeps its schedule and gets the new ``done``. A new one is
        first extended after ``first_in`` seconds: the handler holds every message at its
        receipt, and most are over long before the queue's own visibility timeout.
        """
        held = self._held.get(message.receipt)
        if held is not None:
            held.done = done
        else:
            self._held[message.receipt] = _Held(message, done, self.clock.now() + first_in)
        self.metrics.messages_held.set(len(self._held))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._keep())

    def let_go(self, message: Message) -> None:
        """Stop keeping ``message`` in flight (the caller deletes or releases it now)."""
        self._held.pop(message.receipt, None)
        self.metrics.messages_held.set(len(self._held))

    def holds(self, message: Message) -> bool:
        return message.receipt in self._held

    async def close(self) -> None:
        """Stop: messages still held reappear on the queue when their visibility ends."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._held.clear()
        self.metrics.messages_held.set(0)

    async def _keep(self) -> None:
        while self._held:
            await self.clock.sleep(self.poll)
            try:
                await self._pass()
            except Exception as exc:  # SQS unreachable: try again at the next pass
                log.warning(
                    "could not tend the messages in flight, retrying",
                    error=f"{type(exc).__name__}: {exc}",
                )
            self.metrics.messages_held.set(len(self._held))

    async def _pass(self) -> None:
        finished = [h for h in self._held.values() if h.done is not None and h.done()]
        await self._each(finished, self._delete)
        now = self.clock.now()
        due = [h for h in self._held.values() if h.extend_at <= now]
        for held in due:
            held.extend_at = now + self.visibility / 3
        chunks = [due[i : i + _BATCH] for i in range(0, len(due), _BATCH)]
        await self._each(chunks, self._extend)

    async def _each(self, items: Sequence[T], call: Callable[[T], Awaitable[None]]) -> None:
        """``call`` on every item, ``_PARALLEL`` at a time: with a thousand messages held,
        one call after the other would not keep up with their visibility."""
        limit = asyncio.Semaphore(_PARALLEL)

        async def one(item: T) -> None:
            async with limit:
                await call(item)

        results = await asyncio.gather(*(one(i) for i in items), return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                raise result

    async def _delete(self, held: _Held) -> None:
        await self.queue.delete(held.message)
        self._held.pop(held.message.receipt, None)
        log.info("deleted message, its action is over", message_id=held.message.id)

    async def _extend(self, chunk: list[_Held]) -> None:
        lost = await self.queue.extend([h.message for h in chunk], self.visibility)
        for message in lost:
            if self._held.pop(message.receipt, None) is not None:
                log.warning(
                    "message went back to the queue before its action was over; "
                    "it is handled again when it is delivered again",
                    message_id=message.id,
                )
