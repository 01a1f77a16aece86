"""SqsQueue against moto's SQS: long polling, delete, release; real time, kept short."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from awsfakes import Injector, run

from spotwright.adapters.aws import SqsQueue


@pytest.fixture
def queue_url(client: Callable[..., Any]) -> str:
    sqs = client("sqs")
    name = f"interruptions-{uuid.uuid4().hex[:8]}"
    # A short visibility timeout, so "a deleted message never comes back" is observable.
    return str(sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "2"})["QueueUrl"])


def test_receive_delete_and_release(client: Callable[..., Any], queue_url: str) -> None:
    sqs = client("sqs")
    for body in ('{"n": 1}', '{"n": 2}'):
        sqs.send_message(QueueUrl=queue_url, MessageBody=body)

    async def main() -> None:
        queue = SqsQueue(queue_url, client=client("sqs"), release_delay=1)
        first = await queue.receive(max_messages=10, wait_seconds=1)
        assert sorted(m.body for m in first) == ['{"n": 1}', '{"n": 2}']
        done, foreign = sorted(first, key=lambda m: m.body)
        await queue.delete(done)
        await queue.release(foreign)
        # The released message comes back after its 1 s delay; the deleted one does not.
        started = time.monotonic()
        again = await queue.receive(max_messages=10, wait_seconds=5)
        assert [m.id for m in again] == [foreign.id]
        assert [m.body for m in again] == [foreign.body]
        assert again[0].receipt != foreign.receipt
        assert time.monotonic() - started < 4.5
        await queue.delete(again[0])
        time.sleep(2.5)  # past the queue's visibility timeout
        assert await queue.receive(max_messages=10, wait_seconds=1) == []

    run(main())


def test_an_empty_long_poll_waits_and_returns_nothing(
    client: Callable[..., Any], queue_url: str
) -> None:
    async def main() -> None:
        queue = SqsQueue(queue_url, client=client("sqs"))
        started = time.monotonic()
        assert await queue.receive(wait_seconds=1) == []
        assert time.monotonic() - started >= 0.9

    run(main())


def test_receive_stays_within_sqs_limits(client: Callable[..., Any], queue_url: str) -> None:
    sqs = client("sqs")
    calls = Injector(sqs).watch("ReceiveMessage")

    async def main() -> None:
        queue = SqsQueue(queue_url, client=sqs)
        await queue.receive(max_messages=50, wait_seconds=0.2)
        sent = calls.params["ReceiveMessage"][0]
        assert sent["MaxNumberOfMessages"] == 10
        assert sent["WaitTimeSeconds"] == 1
        assert queue.release_delay == 30.0  # the default

    run(main())
    # Never more than SQS's 20 s long poll (checked without waiting for it).
    from spotwright.adapters.aws.sqs import MAX_WAIT_SECONDS

    assert MAX_WAIT_SECONDS == 20


def test_deleting_twice_is_harmless(client: Callable[..., Any], queue_url: str) -> None:
    client("sqs").send_message(QueueUrl=queue_url, MessageBody="x")

    async def main() -> None:
        queue = SqsQueue(queue_url, client=client("sqs"))
        (message,) = await queue.receive(wait_seconds=1)
        await queue.delete(message)
        await queue.delete(message)

    run(main())


def test_the_region_comes_from_the_queue_url_or_must_be_given(aws_env: None) -> None:
    queue = SqsQueue("https://sqs.eu-west-1.amazonaws.com/123456789012/q")
    assert queue._sqs.client.meta.region_name == "eu-west-1"
    with pytest.raises(ValueError, match="region"):
        SqsQueue("http://127.0.0.1:5000/123456789012/q")
    with pytest.raises(ValueError, match="release_delay"):
        SqsQueue("https://sqs.eu-west-1.amazonaws.com/1/q", release_delay=-1)


def test_extend_keeps_messages_in_flight_past_the_queue_visibility_timeout(
    client: Callable[..., Any], queue_url: str
) -> None:
    sqs = client("sqs")
    for n in range(12):  # more than one batch call's worth
        sqs.send_message(QueueUrl=queue_url, MessageBody=f'{{"n": {n}}}')
    calls = Injector(sqs).watch("ChangeMessageVisibilityBatch")

    async def main() -> None:
        queue = SqsQueue(queue_url, client=sqs)
        held: list[Any] = []
        while len(held) < 12:
            held += await queue.receive(max_messages=10, wait_seconds=1)
        gone = held.pop()
        await queue.delete(gone)
        assert await queue.extend([*held, gone], 6) == [gone]
        assert [len(c["Entries"]) for c in calls.params["ChangeMessageVisibilityBatch"]] == [
            10,
            2,
        ]
        time.sleep(3)  # past the queue's 2 s: still invisible, thanks to the extension
        assert await queue.receive(max_messages=10, wait_seconds=0) == []
        for message in held:
            await queue.delete(message)

    run(main())
