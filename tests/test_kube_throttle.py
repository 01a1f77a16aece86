"""The client-side throttle: its rate, and urgent requests overtaking bulk ones (for a
token, and for a connection of the HTTP pool)."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

from lightkube import AsyncClient

from spotwright.adapters.kube.client import NODES, Api, Priority, TokenBucket


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


class PooledTransport:
    """A stand-in for lightkube over an HTTP pool of ``connections``, handed out first come
    first served; every request holds its connection until ``release`` is set."""

    def __init__(self, connections: int) -> None:
        self.pool = asyncio.Semaphore(connections)
        self.release = asyncio.Event()
        self.evictions_sent = 0
        self.patched: list[str] = []

    async def create(self, obj: object, name: str = "", namespace: str | None = None) -> object:
        async with self.pool:
            self.evictions_sent += 1
            await self.release.wait()
        return obj

    async def patch(self, _cls: object, name: str, patch: object, **_: object) -> dict[str, Any]:
        async with self.pool:
            self.patched.append(name)
        return {"metadata": {"name": name}}


def test_a_taint_patch_is_not_stuck_behind_evictions_holding_the_pool() -> None:
    async def run() -> tuple[list[str], int]:
        transport = PooledTransport(connections=10)
        api = Api(cast(AsyncClient, transport), qps=1000, burst=1000, bulk_in_flight=4)
        evictions = [asyncio.create_task(api.evict("default", f"web-{i}")) for i in range(40)]
        await asyncio.sleep(0.01)  # every eviction is queued or on the wire
        taint = {"spec": {"taints": [{"key": "karpenter.sh/disrupted"}]}}
        await asyncio.wait_for(api.patch(NODES, "ip-10-0-0-1", taint), 5)  # hang guard only
        sent = transport.evictions_sent
        transport.release.set()
        await asyncio.gather(*evictions)
        return transport.patched, sent

    patched, sent_before_taint = asyncio.run(run())
    assert patched == ["ip-10-0-0-1"]
    assert sent_before_taint == 4  # the lane's share, the other six connections free


def test_every_eviction_still_goes_out_through_the_bulk_lane() -> None:
    async def run() -> int:
        transport = PooledTransport(connections=10)
        transport.release.set()
        api = Api(cast(AsyncClient, transport), qps=1000, burst=1000, bulk_in_flight=2)
        await asyncio.gather(*(api.evict("default", f"web-{i}") for i in range(25)))
        return transport.evictions_sent

    assert asyncio.run(run()) == 25
