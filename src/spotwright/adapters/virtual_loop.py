"""An asyncio event loop whose clock is virtual.

The loop runs every ready callback as usual; when nothing is ready it does not wait for the
next timer, it moves its clock forward to it. Controllers written with ``asyncio.sleep`` and
timeouts therefore run unchanged, and a simulated day passes in seconds. There is no I/O in
a simulation, so the selector never blocks.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["SimulationStalled", "VirtualEventLoop", "run_virtual"]

T = TypeVar("T")


class SimulationStalled(RuntimeError):
    """Every task waits and no timer is set: nothing can ever happen again."""


class _JumpingSelector(selectors.SelectSelector):
    """A selector that, asked to wait ``timeout`` seconds, advances the clock instead."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise SimulationStalled("all tasks are waiting and no timer is pending")
        if timeout > 0:
            self.now += timeout
        return []


class VirtualEventLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._jumper = _JumpingSelector()
        super().__init__(self._jumper)

    def time(self) -> float:
        return self._jumper.now


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a fresh virtual loop and close the loop."""
    loop = VirtualEventLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        try:
            _cancel_all(loop)
        finally:
            loop.close()


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
