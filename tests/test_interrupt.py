"""``spotwright interrupt`` against its local targets, end to end over real HTTP.

``--to imds-mock`` is checked against a real ``spotwright imds-mock`` served in the test's
event loop while the command runs as a subprocess; ``--to queue`` against moto in server
mode (real boto3 over HTTP), reading the messages back and parsing them with the same
``parse_eventbridge`` the interruption controller uses in queue mode.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from collections.abc import Iterator
from typing import Any

import aiohttp
import boto3  # type: ignore[import-untyped, unused-ignore]
import pytest
from moto.server import ThreadedMotoServer

from spotwright.events import EventKind, parse_eventbridge
from spotwright.imds import MockConfig, start_mock
from spotwright.interrupter import (
    InterruptError,
    InterruptPlan,
    Sent,
    instance_ids_from,
    interrupt_queue,
    queue_location,
)

INSTANCE = "i-0123456789abcdef0"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


async def spotwright(*args: str) -> tuple[int, str, str]:
    """Run the CLI in a subprocess without blocking the loop that serves the mock."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "spotwright",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **CREDENTIALS},
    )
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def run_cli(*args: str) -> tuple[int, str, str]:
    return asyncio.run(spotwright(*args))


# -- --to imds-mock -------------------------------------------------------------------------


def test_interrupt_to_imds_mock_makes_instance_action_appear() -> None:
    async def main() -> None:
        mock = await start_mock(MockConfig(port=0, instance_id=INSTANCE))
        try:
            code, out, err = await spotwright(
                "interrupt",
                "--instance-ids",
                INSTANCE,
                "--to",
                "imds-mock",
                mock.url,
                "--delay",
                "0",
            )
            assert code == 0, err
            assert f"{INSTANCE}: spot interruption warning at" in out
            async with (
                aiohttp.ClientSession(base_url=mock.url) as session,
                session.get("/latest/meta-data/spot/instance-action") as response,
            ):
                assert response.status == 200
                body = json.loads(await response.text())
            assert body["action"] == "terminate"
            notice = mock.state.spot
            assert notice is not None
            assert notice.action_time - notice.notice_time == 120
        finally:
            await mock.aclose()

    asyncio.run(main())


def test_interrupt_to_imds_mock_with_a_rebalance_recommendation_first() -> None:
    async def main() -> None:
        mock = await start_mock(MockConfig(port=0, instance_id=INSTANCE))
        try:
            code, out, err = await spotwright(
                "interrupt",
                "-i",
                INSTANCE,
                "--to",
                "imds-mock",
                mock.url,
                "--delay",
                "10m",
                "--rebalance-first",
                "10m",
            )
            assert code == 0, err
            lines = out.splitlines()
            assert lines[0].startswith(f"{INSTANCE}: rebalance recommendation at")
            assert lines[1].startswith(f"{INSTANCE}: spot interruption warning at")
            async with aiohttp.ClientSession(base_url=mock.url) as session:
                path = "/latest/meta-data/events/recommendations/rebalance"
                async with session.get(path) as response:
                    assert response.status == 200
                async with session.get("/latest/meta-data/spot/instance-action") as response:
                    assert response.status == 404  # due in ten minutes
            spot, rebalance = mock.state.spot, mock.state.rebalance
            assert spot is not None and rebalance is not None
            assert spot.notice_time - rebalance.notice_time == 600
        finally:
            await mock.aclose()

    asyncio.run(main())


def test_interrupt_to_imds_mock_refused_or_unreachable_exits_1() -> None:
    async def main() -> None:
        mock = await start_mock(MockConfig(port=0, instance_id=INSTANCE))
        try:
            other = "i-0fedcba9876543210"
            code, _, err = await spotwright(
                "interrupt", "-i", other, "--to", "imds-mock", mock.url, "--delay", "0"
            )
            assert code == 1
            assert f"this mock serves {INSTANCE}, not {other}" in err
            assert mock.state.spot is None
        finally:
            await mock.aclose()
        code, _, err = await spotwright(
            "interrupt", "-i", INSTANCE, "--to", "imds-mock", f"http://127.0.0.1:{free_port()}"
        )
        assert code == 1
        assert "cannot reach the imds-mock" in err
        assert "Traceback" not in err

    asyncio.run(main())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# -- --to queue ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def sqs(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    return boto3.client("sqs", endpoint_url=moto_endpoint, region_name="us-east-1")


def receive_all(sqs: Any, queue_url: str, expected: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for _ in range(10):  # moto returns what is there at once; no waiting involved
        answer = sqs.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=10, AttributeNames=["All"]
        )
        messages.extend(answer.get("Messages", []))
        if len(messages) >= expected:
            break
    return messages


def test_interrupt_to_queue_delivers_events_parse_eventbridge_understands(sqs: Any) -> None:
    queue_url = sqs.create_queue(QueueName="interruptions")["QueueUrl"]
    second = "i-0fedcba9876543210"
    code, out, err = run_cli(
        "interrupt",
        "--instance-ids",
        f"{INSTANCE},{second}",
        "--to",
        "queue",
        queue_url,
        "--delay",
        "0",
        "--rebalance-first",
        "0",
    )
    assert code == 0, err
    assert out.count("rebalance recommendation at") == 2
    assert out.count("spot interruption warning at") == 2
    messages = receive_all(sqs, queue_url, 4)
    events = [event for m in messages for event in parse_eventbridge(m["Body"], source="sqs")]
    by_kind = {(e.kind, e.instance_id): e for e in events}
    assert len(by_kind) == 4
    for instance_id in (INSTANCE, second):
        warning = by_kind[(EventKind.SPOT_INTERRUPTION, instance_id)]
        assert warning.deadline == warning.start + 120
        assert warning.action == "terminate"
        assert warning.source == "sqs"
        assert warning.region == "us-east-1"
        rebalance = by_kind[(EventKind.REBALANCE_RECOMMENDATION, instance_id)]
        assert rebalance.deadline is None
        assert rebalance.start <= warning.start
    body = json.loads(messages[0]["Body"])
    assert body["source"] == "aws.ec2"
    assert body["detail-type"] in (
        "EC2 Spot Instance Interruption Warning",
        "EC2 Instance Rebalance Recommendation",
    )


def test_interrupt_queue_waits_until_each_event_is_due(sqs: Any, moto_endpoint: str) -> None:
    queue_url = sqs.create_queue(QueueName="paced.fifo", Attributes={"FifoQueue": "true"})[
        "QueueUrl"
    ]
    now = [1_767_225_600.0]
    waits: list[tuple[float, str]] = []
    sent: list[Sent] = []

    def sleep(seconds: float) -> None:
        now[0] += seconds

    records = interrupt_queue(
        queue_url,
        InterruptPlan((INSTANCE,), delay=90, rebalance_first=60),
        on_sent=sent.append,
        on_wait=lambda seconds, kind: waits.append((seconds, kind)),
        clock=lambda: now[0],
        sleep=sleep,
    )
    assert records == sent
    assert waits == [(30.0, "rebalance recommendation"), (60.0, "spot interruption warning")]
    assert [r.at - 1_767_225_600.0 for r in records] == [30.0, 90.0]
    messages = receive_all(sqs, queue_url, 2)
    events = [e for m in messages for e in parse_eventbridge(m["Body"])]
    assert [e.kind for e in events] == [
        EventKind.REBALANCE_RECOMMENDATION,
        EventKind.SPOT_INTERRUPTION,
    ]
    assert events[1].start == 1_767_225_600.0 + 90
    assert events[1].deadline == events[1].start + 120
    assert messages[0]["Attributes"]["MessageGroupId"] == INSTANCE


def test_interrupt_queue_failures_are_interrupt_errors(sqs: Any, moto_endpoint: str) -> None:
    missing = f"{moto_endpoint}/123456789012/no-such-queue"
    with pytest.raises(InterruptError, match="SQS refused"):
        interrupt_queue(missing, InterruptPlan((INSTANCE,), delay=0))
    code, _, err = run_cli("interrupt", "-i", INSTANCE, "--to", "queue", missing, "--delay", "0")
    assert code == 1
    assert "SQS refused" in err
    assert "Traceback" not in err


def test_queue_location_reads_region_and_endpoint() -> None:
    assert queue_location("https://sqs.eu-west-1.amazonaws.com/123456789012/q") == (
        "eu-west-1",
        None,
    )
    assert queue_location("https://us-west-2.queue.amazonaws.com/123456789012/q") == (
        "us-west-2",
        None,
    )
    assert queue_location("https://queue.amazonaws.com/123456789012/q") == ("us-east-1", None)
    assert queue_location("http://127.0.0.1:5000/123456789012/q") == (
        None,
        "http://127.0.0.1:5000",
    )
    with pytest.raises(ValueError, match="SQS queue URL"):
        queue_location("sqs://queue")


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["-i", INSTANCE, "--to", "carrier-pigeon", "http://x"], "'carrier-pigeon' is not one of"),
        (["-i", "i-nothex!", "--to", "imds-mock", "http://127.0.0.1:1"], "not an EC2 instance id"),
        (["-i", INSTANCE, "--to", "imds-mock"], "needs a TARGET"),
        (
            ["-i", f"{INSTANCE},i-0fedcba9876543210", "--to", "imds-mock", "http://h"],
            "serves one instance",
        ),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(args: list[str], fragment: str) -> None:
    code, _, err = run_cli("interrupt", *args)
    assert code == 2, err
    assert fragment in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("ids", "delay", "first", "fragment"),
    [
        ((), 0.0, None, "at least one instance id"),
        (("0123456789abcdef0",), 0.0, None, "not an EC2 instance id"),
        (("i-0123",), 0.0, None, "not an EC2 instance id"),
        ((INSTANCE, INSTANCE), 0.0, None, "given twice"),
        ((INSTANCE,), -1.0, None, "0 s or more"),
        ((INSTANCE,), 15.0, 60.0, "use a delay of at least 60 s"),
    ],
)
def test_plans_refuse_what_cannot_be_sent(
    ids: tuple[str, ...], delay: float, first: float | None, fragment: str
) -> None:
    with pytest.raises(ValueError, match=fragment):
        InterruptPlan(ids, delay=delay, rebalance_first=first)


def test_instance_ids_may_be_repeated_or_comma_separated() -> None:
    assert instance_ids_from([f"{INSTANCE}, i-0fedcba9876543210", "i-0aaaabbbbccccdddd"]) == (
        INSTANCE,
        "i-0fedcba9876543210",
        "i-0aaaabbbbccccdddd",
    )
