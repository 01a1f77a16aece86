"""Merge calls that arrive close together into one, like Karpenter's EC2 batchers.

A provisioning round creates many node claims at once, often several with exactly the same
launch request. Sending one CreateFleet per claim spends the account's request rate for
nothing, so identical requests are held for a short window and sent as one call
(TotalTargetCapacity = N); terminations are merged the same way. A window closes when no
new item arrived for ``idle`` seconds, when it has lasted ``max_wait`` seconds, or when it
holds ``max_items`` items. Time is the injected Clock's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from spotwright.ports.clock import Clock

__all__ = ["Batcher"]

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
R = TypeVar("R")

#: Runs one batch: one result or exception per item, in the items' order.
Execute = Callable[[K, Sequence[T]], Awaitable[Sequence["R | BaseException"]]]


@dataclass
class _Window(Generic[T, R]):
    first: float
    last: float
    items: list[T] = field(default_factory=list)
    futures: list[asyncio.Future[R]] = field(default_factory=list)
    closed: bool = False


class Batcher(Generic[K, T, R]):
    def __init__(
        self,
        execute: Execute[K, T, R],
        *,
        clock: Clock,
        idle: float,
        max_wait: float,
        max_items: int,
    ) -> None:
        self._execute = execute
        self._clock = clock
        self.idle = idle
        self.max_wait = max_wait
        self.max_items = max_items
        self._open: dict[K, _Window[T, R]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: How many batches were executed (for logs and tests).
        self.batches = 0

    async def submit(self, key: K, item: T) -> R:
        """Add ``item`` to the open window of ``key`` and wait for its own result."""
        loop = asyncio.get_running_loop()
        now = self._clock.now()
        window = self._open.get(key)
        if window is None:
            window = _Window(first=now, last=now)
            self._open[key] = window
            task = loop.create_task(self._run(key, window))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        future: asyncio.Future[R] = loop.create_future()
        window.items.append(item)
        window.futures.append(future)
        window.last = now
        if len(window.items) >= self.max_items:
            self._close(key, window)
        return await future

    def _close(self, key: K, window: _Window[T, R]) -> None:
        window.closed = True
        if self._open.get(key) is window:
            del self._open[key]

    async def _run(self, key: K, window: _Window[T, R]) -> None:
        while not window.closed:
            now = self._clock.now()
            deadline = min(window.last + self.idle, window.first + self.max_wait)
            if now >= deadline:
                break
            await self._clock.sleep(deadline - now)
        self._close(key, window)
        self.batches += 1
        try:
            results = await self._execute(key, list(window.items))
        except BaseException as exc:  # every waiter gets the failure
            for future in window.futures:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        if len(results) != len(window.futures):
            error = RuntimeError(f"batch returned {len(results)} results for {len(window.futures)}")
            results = [error] * len(window.futures)
        for future, result in zip(window.futures, results, strict=True):
            if future.done():  # the caller gave up (cancelled)
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)

    async def close(self) -> None:
        """Wait for the windows in flight to finish (for an orderly shutdown)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
