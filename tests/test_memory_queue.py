"""The in-memory queue keeps SQS's promises: nothing lost, released messages come back."""

from __future__ import annotations

import asyncio

from spotwright.adapters.memory_queue import MemoryQueue
from spotwright.adapters.virtual_loop import run_virtual


def test_received_message_is_invisible_until_deleted_or_released() -> None:
    async def main() -> tuple[int, int, int]:
        queue = MemoryQueue(release_delay=30)
        queue.put({"detail-type": "x"})
        first = await queue.receive(wait_seconds=0.1)
        empty = await queue.receive(wait_seconds=1)
        await queue.release(first[0])
        again = await queue.receive(wait_seconds=60)
        await queue.delete(again[0])
        return len(first), len(empty), len(queue)

    assert run_virtual(main()) == (1, 0, 0)


def test_long_poll_returns_as_soon_as_a_message_arrives() -> None:
    async def main() -> float:
        queue = MemoryQueue()
        loop = asyncio.get_running_loop()
        loop.call_later(3, queue.put, "hello")
        got = await queue.receive(wait_seconds=20)
        assert [m.body for m in got] == ["hello"]
        return loop.time()

    assert run_virtual(main()) == 3


def test_a_message_nobody_owns_ends_in_dead_letters_after_max_receives() -> None:
    async def main() -> int:
        queue = MemoryQueue(release_delay=1, max_receives=3)
        queue.put("not ours")
        for _ in range(3):
            batch = await queue.receive(wait_seconds=5)
            for m in batch:
                await queue.release(m)
        return len(queue.dead_letters)

    assert run_virtual(main()) == 1


def test_a_message_not_deleted_within_its_visibility_comes_back_with_a_new_receipt() -> None:
    async def main() -> None:
        queue = MemoryQueue(visibility_timeout=30)
        queue.put("notice")
        [first] = await queue.receive(wait_seconds=1)
        assert await queue.receive(wait_seconds=29) == []  # still in flight
        [again] = await queue.receive(wait_seconds=5)
        assert (again.id, again.body) == (first.id, first.body)
        assert again.receipt != first.receipt
        await queue.delete(first)  # a stale receipt deletes nothing, as in SQS
        assert (queue.deleted, queue.in_flight) == (0, 1)
        await queue.delete(again)
        assert (queue.deleted, len(queue)) == (1, 0)

    run_virtual(main())


def test_extending_keeps_a_message_in_flight_and_reports_stale_receipts() -> None:
    async def main() -> None:
        queue = MemoryQueue(visibility_timeout=30)
        queue.put("held")
        queue.put("deleted")
        held, deleted = await queue.receive(wait_seconds=1)
        await queue.delete(deleted)
        for _ in range(5):  # 100 s in all, well past the 30 s timeout
            await asyncio.sleep(20)
            assert await queue.extend([held, deleted], 30) == [deleted]
        assert queue.in_flight == 1 and await queue.receive(wait_seconds=25) == []
        [back] = await queue.receive(wait_seconds=10)  # not extended any more: it returns
        assert back.id == held.id

    run_virtual(main())
