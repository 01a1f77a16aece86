"""The virtual loop must run ordinary asyncio code, only faster, and in order."""

from __future__ import annotations

import asyncio
import time

import pytest

from spotwright.adapters.virtual_loop import SimulationStalled, run_virtual
from spotwright.ports.clock import LoopClock


def test_a_simulated_day_passes_without_waiting() -> None:
    async def main() -> float:
        await asyncio.sleep(86_400)
        return asyncio.get_running_loop().time()

    started = time.perf_counter()
    assert run_virtual(main()) == pytest.approx(86_400)
    assert time.perf_counter() - started < 5


def test_timers_fire_in_time_order_across_tasks() -> None:
    seen: list[tuple[str, float]] = []

    async def worker(name: str, delay: float) -> None:
        await asyncio.sleep(delay)
        seen.append((name, asyncio.get_running_loop().time()))

    async def main() -> None:
        await asyncio.gather(worker("late", 30), worker("early", 1), worker("mid", 10))

    run_virtual(main())
    assert seen == [("early", 1.0), ("mid", 10.0), ("late", 30.0)]


def test_wait_for_timeouts_use_virtual_time() -> None:
    async def main() -> float:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), 20)
        return asyncio.get_running_loop().time()

    assert run_virtual(main()) == pytest.approx(20)


def test_clock_reads_epoch_plus_virtual_time() -> None:
    async def main() -> float:
        clock = LoopClock(epoch=1_000.0)
        await clock.sleep(5)
        return clock.now()

    assert run_virtual(main()) == pytest.approx(1_005.0)


def test_a_deadlock_is_reported_not_hung() -> None:
    async def main() -> None:
        await asyncio.Event().wait()

    with pytest.raises(SimulationStalled):
        run_virtual(main())
