"""Time, as the controllers see it.

Controllers never call ``time.time()`` or ``asyncio.sleep`` directly: they ask a Clock. Live,
it is the wall clock; in simulation it is the event loop's virtual time, which jumps to the
next timer whenever every task is waiting.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

__all__ = ["Clock", "LoopClock"]


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the Unix epoch."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class LoopClock:
    """A clock that reads the running event loop's time, offset to the epoch.

    On a normal loop this is the wall clock; on the simulator's virtual loop it is virtual
    time, which is how the same controller code runs in both worlds.
    """

    def __init__(self, epoch: float | None = None) -> None:
        #: With an epoch, loop time 0 is that moment (the virtual loop starts at 0);
        #: without one, the offset to the wall clock is taken at the first reading.
        self._offset: float | None = epoch

    def now(self) -> float:
        loop_time = asyncio.get_running_loop().time()
        if self._offset is None:
            self._offset = time.time() - loop_time
        return self._offset + loop_time

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))
