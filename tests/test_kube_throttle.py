"""The client-side token bucket: its rate, and urgent requests overtaking bulk ones."""

from __future__ import annotations

import asyncio
import time

from spotwright.adapters.kube.client import Priority, TokenBucket


def test_burst_then_rate() -> None:
    async def run() -> float:
        bucket = TokenBucket(qps=50, burst=5)
        started = time.monotonic()
        for _ in range(15):
            await bucket.acquire()
        return time.monotonic() - started

    took = asyncio.run(run())
    assert 0.15 <= took <= 0.5, took  # 5 at once, then 10 at 50/s


def test_waiting_requests_are_served_by_priority_then_arrival() -> None:
    async def run() -> list[str]:
        bucket = TokenBucket(qps=100, burst=1)
        await bucket.acquire()  # the bucket is now empty: everyone below waits
        served: list[str] = []

        async def one(name: str, priority: Priority) -> None:
            await bucket.acquire(priority)
            served.append(name)

        tasks = [asyncio.create_task(one(f"evict-{i}", Priority.BULK)) for i in range(3)]
        await asyncio.sleep(0)
        tasks.append(asyncio.create_task(one("taint", Priority.NORMAL)))
        tasks.append(asyncio.create_task(one("lease", Priority.LEASE)))
        cancelled = asyncio.create_task(one("gave-up", Priority.LEASE))
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.gather(*tasks)
        return served

    assert asyncio.run(run()) == ["lease", "taint", "evict-0", "evict-1", "evict-2"]
