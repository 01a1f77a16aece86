"""``spotwright imds-mock`` over real HTTP: tokens, every path, notices, the control endpoint.

Each test starts the service on a free port of 127.0.0.1 and talks to it with an aiohttp
client. Time is a ``FakeClock`` handed to the mock, so "before the notice" and "after the
notice" are one ``advance()`` apart: nothing here sleeps.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from spotwright.events import EventKind, InterruptionEvent
from spotwright.events.imds import POLLED_PATHS, parse_imds
from spotwright.imds import (
    TOKEN_HEADER,
    TTL_HEADER,
    MockConfig,
    RunningMock,
    parse_time,
    scheduled_event,
    start_mock,
)

T0 = parse_time("2026-03-01T12:00:00Z", what="test")


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


Scenario = Callable[[RunningMock, aiohttp.ClientSession], Awaitable[None]]


def serve(scenario: Scenario, **options: Any) -> None:
    """Run ``scenario`` against a mock on a free port; ``options`` go to ``MockConfig``."""

    async def main() -> None:
        mock = await start_mock(MockConfig(port=0, **options))
        try:
            async with aiohttp.ClientSession(base_url=mock.url) as session:
                await scenario(mock, session)
        finally:
            await mock.aclose()

    asyncio.run(main())


async def get(
    session: aiohttp.ClientSession, path: str, token: str | None = None
) -> tuple[int, str, Any]:
    headers = {TOKEN_HEADER: token} if token is not None else {}
    async with session.get(path, headers=headers) as response:
        return response.status, await response.text(), response.headers


async def token(session: aiohttp.ClientSession, ttl: str = "21600") -> tuple[int, str, Any]:
    async with session.put("/latest/api/token", headers={TTL_HEADER: ttl}) as response:
        return response.status, await response.text(), response.headers


async def control(
    session: aiohttp.ClientSession, method: str, path: str, body: Any = None
) -> tuple[int, Any]:
    data = body if isinstance(body, str) else (None if body is None else json.dumps(body))
    async with session.request(method, f"/spotwright/v1/{path}", data=data) as response:
        return response.status, await response.json()


# -- tokens --------------------------------------------------------------------------------


def test_tokens_required_refuses_requests_without_a_valid_token() -> None:
    async def scenario(mock: RunningMock, session: aiohttp.ClientSession) -> None:
        assert (await get(session, "/latest/meta-data/instance-id"))[0] == 401
        assert (await get(session, "/latest/meta-data/", token="made-up"))[0] == 401
        status, issued, headers = await token(session, "60")
        assert (status, headers[TTL_HEADER]) == (200, "60") and issued
        status, body, headers = await get(session, "/latest/meta-data/instance-id", issued)
        assert (status, body) == (200, "i-1234567890abcdef0")
        assert headers[TTL_HEADER] == "60"
        assert headers["Content-Type"].startswith("text/plain")
        status, state = await control(session, "GET", "state")  # control needs no token
        assert status == 200
        assert (state["instanceId"], state["requireToken"]) == ("i-1234567890abcdef0", True)

    serve(scenario, require_token=True, clock=FakeClock())


def test_tokens_optional_allows_imdsv1_and_still_checks_a_token_that_is_sent() -> None:
    async def scenario(mock: RunningMock, session: aiohttp.ClientSession) -> None:
        status, body, headers = await get(session, "/latest/meta-data/instance-type")
        assert (status, body) == (200, "m4.xlarge")
        assert TTL_HEADER not in headers
        assert (await get(session, "/latest/meta-data/instance-type", "unknown"))[0] == 401

    serve(scenario, require_token=False)


def test_token_ttl_must_be_1_to_21600_seconds() -> None:
    async def scenario(mock: RunningMock, session: aiohttp.ClientSession) -> None:
        for bad in ("0", "21601", "-5", "abc", "1.5", ""):
            status, body, _ = await token(session, bad)
            assert status == 400, bad
            assert "1 to 21600" in body
        assert (await token(session, "1"))[0] == 200
        assert (await token(session, "21600"))[0] == 200
        async with session.put("/latest/api/token") as response:
            assert response.status == 400  # no TTL header at all
        async with session.get("/latest/api/token") as response:
            assert response.status == 405
        headers = {TTL_HEADER: "60", "X-Forwarded-For": "10.0.0.1"}
        async with session.put("/latest/api/token", headers=headers) as response:
            assert response.status == 403

    serve(scenario, require_token=True)


def test_an_expired_token_is_refused_even_when_tokens_are_optional() -> None:
    clock = FakeClock()

    async def scenario(mock: RunningMock, session: aiohttp.ClientSession) -> None:
        _, issued, _ = await token(session, "10")
        clock.advance(4)
        status, _, headers = await get(session, "/latest/meta-data/instance-id", issued)
        assert status == 200
        assert headers[TTL_HEADER] == "6"
        clock.advance(6)
        assert (await get(session, "/latest/meta-data/instance-id", issued))[0] == 401
        assert (await get(session, "/latest/meta-data/instance-id"))[0] == 200

    serve(scenario, clock=clock)


# -- the metadata tree ------------------------------------------------------------------------


def test_every_static_path_and_listing() -> None:
    async def scenario(mock: RunningMock, session: aiohttp.ClientSession) -> None:
        expected = {
            "instance-id": "i-0abc1234def567890",
            "instance-type": "c6g.large",
            "placement/availability-zone": "eu-west-1b",
            "placement/region": "eu-west-1",
            "local-hostname": "ip-10-1-2-3.eu-west-1.compute.internal",
            "hostname": "ip-10-1-2-3.eu-west-1.compute.internal",
            "local-ipv4": "10.1.2.3",
            "ami-id": "ami-0a887e401f7654935",
            "mac": "0e:49:61:0f:c3:11",
            "instance-life-cycle": "spot",
            "autoscaling/target-lifecycle-state": "InService",
            "events/maintenance/scheduled": "[]",
        }
        for path, body in expected.items():
            assert (await get(session, f"/latest/meta-data/{path}"))[:2] == (200, body), path
        status, listing, _ = await get(session, "/latest/meta-data/")
        assert status == 200
        entries = listing.split("\n")
        for entry in ("instance-id", "instance-type", "placement/", "events/", "autoscaling/"):
            assert entry in entries
        assert "spot/" not in entries  # no notice, so no spot directory
        placement = (await get(session, "/latest/meta-data/placement"))[1]
        assert placement == "availability-zone\nregion"
        assert (await get(session, "/latest/"))[1] == "dynamic/\nmeta-data/"
        assert (await get(session, "/"))[1] == "latest"
        status, text, _ = await get(session, "/latest/dynamic/instance-identity/document")
        wanted = {
            "instanceId": "i-0abc1234def567890",
            "region": "eu-west-1",
            "privateIp": "10.1.2.3",
        }
        assert status == 200 and wanted.items() <= json.loads(text).items()
        for missing in ("/latest/meta-data/nothing", "/latest/meta-data/spot/instance-action"):
            assert (await get(session, missing))[0] == 404
        async with session.post("/latest/meta-data/instance-id") as response:
            assert response.status == 405

    instance = {"instance_id": "i-0abc1234def567890", "instance_type": "c6g.large"}
    serve(scenario, zone="eu-west-1b", local_ipv4="10.1.2.3", **instance)


# -- notices scheduled at start ---------------------------------------------------------------


def test_spot_notice_is_absent_until_its_delay_then_the_same_on_every_poll() -> None:
    clock = FakeClock()

    async def scenario(mock: RunningMock, session: aiohttp.ClientSession) -> None:
        assert (await get(session, "/latest/meta-data/spot/instance-action"))[0] == 404
        assert (await get(session, "/latest/meta-data/spot/termination-time"))[0] == 404
        assert (await get(session, "/latest/meta-data/spot/"))[0] == 404
        clock.advance(29)
        assert (await get(session, "/latest/meta-data/spot/instance-action"))[0] == 404
        clock.advance(1)
        first = await get(session, "/latest/meta-data/spot/instance-action")
        clock.advance(7)
        second = await get(session, "/latest/meta-data/spot/instance-action")
        assert first[:2] == second[:2]
        assert json.loads(first[1]) == {"action": "stop", "time": "2026-03-01T12:02:30Z"}
        termination = await get(session, "/latest/meta-data/spot/termination-time")
        assert termination[:2] == (200, "2026-03-01T12:02:30Z")
        listing = (await get(session, "/latest/meta-data/spot/"))[1]
        assert listing == "instance-action\ntermination-time"

    serve(scenario, clock=clock, spot_delay=30, spot_action="stop")


def test_pinned_spot_time_past_is_served_as_pinned_future_appears_2_minutes_before() -> None:
    async def past(mock: RunningMock, session: aiohttp.ClientSession) -> None:
        for _ in range(3):
            status, body, _ = await get(session, "/latest/meta-data/spot/instance-action")
            assert status == 200
            assert json.loads(body) == {"action": "terminate", "time": "2020-04-24T17:11:44Z"}

    serve(past, spot_time=parse_time("2020-04-24T17:11:44Z", what="test"))
    clock = FakeClock()

    async def future(mock: RunningMock, session: aiohttp.ClientSession) -> None:
        assert (await get(session, "/latest/meta-data/spot/instance-action"))[0] == 404
        clock.now = T0 + 3600 - 120
        status, body, _ = await get(session, "/latest/meta-data/spot/instance-action")
        assert status == 200
        assert json.loads(body)["time"] == "2026-03-01T13:00:00Z"

    serve(future, clock=clock, spot_time=T0 + 3600)


def test_rebalance_recommendation_after_a_delay_and_pinned() -> None:
    clock = FakeClock()

    async def delayed(mock: RunningMock, session: aiohttp.ClientSession) -> None:
        path = "/latest/meta-data/events/recommendations/rebalance"
        assert (await get(session, path))[0] == 404
        clock.advance(10)
        status, body, _ = await get(session, path)
        assert status == 200
        assert json.loads(body) == {"noticeTime": "2026-03-01T12:00:10Z"}
        listing = (await get(session, "/latest/meta-data/events/recommendations/"))[1]
        assert listing == "rebalance"

    serve(delayed, clock=clock, rebalance_delay=10)

    async def pinned(mock: RunningMock, session: aiohttp.ClientSession) -> None:
        body = (await get(session, "/latest/meta-data/events/recommendations/rebalance"))[1]
        assert json.loads(body) == {"noticeTime": "2020-10-16T19:18:24Z"}

    serve(pinned, rebalance_time=parse_time("2020-10-16T19:18:24Z", what="test"))


def test_scheduled_events_use_aws_date_layout() -> None:
    event = scheduled_event(
        "system-reboot",
        now=T0,
        event_id="instance-event-0d59937288b749b32",
        description="scheduled reboot",
        not_before=parse_time("2019-01-21T09:00:43Z", what="test"),
        not_after=parse_time("2019-01-21T09:17:23Z", what="test"),
    )

    async def scenario(mock: RunningMock, session: aiohttp.ClientSession) -> None:
        status, body, _ = await get(session, "/latest/meta-data/events/maintenance/scheduled")
        assert status == 200
        assert json.loads(body) == [
            {
                "Code": "system-reboot",
                "Description": "scheduled reboot",
                "State": "active",
                "EventId": "instance-event-0d59937288b749b32",
                "NotBefore": "21 Jan 2019 09:00:43 GMT",
                "NotAfter": "21 Jan 2019 09:17:23 GMT",
                "NotBeforeDeadline": "30 Jan 2019 09:00:43 GMT",
            }
        ]

    serve(scenario, scheduled_events=(event,))


def test_target_lifecycle_state_turns_terminated_after_its_delay() -> None:
    clock = FakeClock()

    async def scenario(mock: RunningMock, session: aiohttp.ClientSession) -> None:
        path = "/latest/meta-data/autoscaling/target-lifecycle-state"
        assert (await get(session, path))[1] == "InService"
        clock.advance(60)
        assert (await get(session, path))[1] == "Terminated"

    serve(scenario, clock=clock, asg_terminate_delay=60)


def test_what_it_serves_is_what_spotwrights_imds_parser_reads() -> None:
    event = scheduled_event("system-reboot", now=T0, not_before=T0 + 3600)

    async def scenario(mock: RunningMock, session: aiohttp.ClientSession) -> None:
        kinds: dict[EventKind, InterruptionEvent] = {}
        for path in POLLED_PATHS:
            status, body, _ = await get(session, f"/latest/meta-data/{path}")
            assert status == 200, path
            for parsed in parse_imds(path, body, instance_id=mock.config.instance_id, now=T0):
                kinds[parsed.kind] = parsed
        assert kinds[EventKind.SPOT_INTERRUPTION].deadline == T0 + 60
        assert kinds[EventKind.REBALANCE_RECOMMENDATION].start == T0 - 60
        assert kinds[EventKind.SCHEDULED_CHANGE].deadline == T0 + 3600
        assert EventKind.ASG_LIFECYCLE_TERMINATE in kinds

    notices = {"spot_time": T0 + 60, "rebalance_time": T0 - 60, "scheduled_events": (event,)}
    serve(scenario, clock=FakeClock(), asg_target_state="Terminated", **notices)


# -- the control endpoint ---------------------------------------------------------------------


def test_control_raises_a_spot_notice_now_or_later() -> None:
    clock = FakeClock()

    async def scenario(mock: RunningMock, session: aiohttp.ClientSession) -> None:
        path = "/latest/meta-data/spot/instance-action"
        status, state = await control(session, "POST", "spot-interruption", {"delaySeconds": 20})
        assert status == 200
        assert state["spotInterruption"] == {
            "action": "terminate",
            "time": "2026-03-01T12:02:20Z",
            "noticeTime": "2026-03-01T12:00:20Z",
            "visible": False,
        }
        assert (await get(session, path))[0] == 404
        clock.advance(20)
        assert json.loads((await get(session, path))[1])["time"] == "2026-03-01T12:02:20Z"
        body = {"action": "hibernate", "instanceId": "i-1234567890abcdef0"}
        assert (await control(session, "POST", "spot-interruption", body))[0] == 200
        assert json.loads((await get(session, path))[1]) == {
            "action": "hibernate",
            "time": "2026-03-01T12:02:20Z",
        }
        pinned = {"time": "2026-03-01T12:01:00Z"}
        assert (await control(session, "POST", "spot-interruption", pinned))[0] == 200
        assert json.loads((await get(session, path))[1])["time"] == "2026-03-01T12:01:00Z"

    serve(scenario, clock=clock)


def test_control_rebalance_scheduled_events_lifecycle_and_reset() -> None:
    clock = FakeClock()

    async def scenario(mock: RunningMock, session: aiohttp.ClientSession) -> None:
        rebalance = "/latest/meta-data/events/recommendations/rebalance"
        assert (await control(session, "POST", "rebalance", None))[0] == 200
        assert json.loads((await get(session, rebalance))[1]) == {
            "noticeTime": "2026-03-01T12:00:00Z"
        }

        event = {
            "code": "instance-stop",
            "eventId": "instance-event-1234567890abcdef0",
            "notBefore": "2026-03-02T00:00:00Z",
        }
        status, state = await control(session, "POST", "scheduled-events", event)
        assert status == 200
        (listed,) = state["scheduledEvents"]
        assert listed["State"] == "active"
        assert listed["NotBefore"] == "2 Mar 2026 00:00:00 GMT"
        assert listed["NotAfter"] == "9 Mar 2026 00:00:00 GMT"
        cancel = {"eventId": "instance-event-1234567890abcdef0", "state": "canceled"}
        assert (await control(session, "POST", "scheduled-events", cancel))[0] == 200
        scheduled = "/latest/meta-data/events/maintenance/scheduled"
        (served,) = json.loads((await get(session, scheduled))[1])
        assert served == {**listed, "State": "canceled"}

        lifecycle = "/latest/meta-data/autoscaling/target-lifecycle-state"
        body = {"state": "Terminated", "delaySeconds": 5}
        status, state = await control(session, "POST", "lifecycle-state", body)
        assert state["lifecycleState"] == {
            "current": "InService",
            "pending": {"state": "Terminated", "at": "2026-03-01T12:00:05Z"},
        }
        assert (await get(session, lifecycle))[1] == "InService"
        clock.advance(5)
        assert (await get(session, lifecycle))[1] == "Terminated"

        status, state = await control(session, "DELETE", "notices")
        assert status == 200
        assert state["spotInterruption"] is None
        assert state["rebalanceRecommendation"] is None
        assert state["scheduledEvents"] == []
        assert (await get(session, rebalance))[0] == 404
        assert (await get(session, lifecycle))[1] == "InService"
        assert (await get(session, scheduled))[1] == "[]"

    serve(scenario, clock=clock)


def test_control_rejects_bad_input_with_a_clear_message() -> None:
    backwards = {"notBefore": "2026-03-02", "notAfter": "2026-03-01"}
    cases: list[tuple[str, Any, int, str]] = [
        ("spot-interruption", "{not json", 400, "not JSON"),
        ("spot-interruption", [1], 400, "must be a JSON object"),
        ("spot-interruption", {"delay": 5}, 400, "unknown field 'delay'"),
        ("spot-interruption", {"delaySeconds": -1}, 400, "delaySeconds"),
        ("spot-interruption", {"delaySeconds": True}, 400, "delaySeconds"),
        ("spot-interruption", {"delaySeconds": "5"}, 400, "delaySeconds"),
        ("spot-interruption", {"action": "reboot"}, 400, "terminate, stop, hibernate"),
        ("spot-interruption", {"delaySeconds": 1, "time": "2026-01-01T00:00:00Z"}, 400, "not both"),
        ("spot-interruption", {"time": "tomorrow"}, 400, "ISO-8601"),
        ("spot-interruption", {"instanceId": "i-0fedcba9876543210"}, 409, "serves i-1234"),
        ("rebalance", {"noticeTime": 7}, 400, "noticeTime"),
        ("scheduled-events", {"code": "reboot"}, 400, "system-reboot"),
        ("scheduled-events", {"state": "done"}, 400, "active, completed, canceled"),
        ("scheduled-events", {"eventId": "event-1"}, 400, "instance-event-"),
        ("scheduled-events", backwards, 400, "notAfter"),
        ("lifecycle-state", {}, 400, "state: required"),
        ("lifecycle-state", {"state": "Gone"}, 400, "InService"),
    ]

    async def scenario(mock: RunningMock, session: aiohttp.ClientSession) -> None:
        for path, body, expected_status, fragment in cases:
            status, answer = await control(session, "POST", path, body)
            assert status == expected_status, (path, body, answer)
            assert fragment in answer["error"], (path, body, answer)
        async with session.get("/spotwright/v1/rebalance") as response:
            assert response.status == 405
        status, state = await control(session, "GET", "state")
        assert state["spotInterruption"] is None and state["scheduledEvents"] == []

    serve(scenario)


# -- the command line -------------------------------------------------------------------------


def spotwright(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spotwright", *args], capture_output=True, text=True, timeout=120
    )


def test_cli_serves_until_interrupted_and_prints_its_url_first() -> None:
    options = (
        "--port 0 --require-token --instance-id i-0123456789abcdef0 "
        "--spot-itn-time 2020-04-24T17:11:44Z --scheduled-event "
        "code=instance-retirement,state=active,not-before=2026-05-01T00:00:00Z"
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "spotwright", "imds-mock", *options.split()],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url

        async def check() -> None:
            async with aiohttp.ClientSession(base_url=url) as session:
                assert (await get(session, "/latest/meta-data/instance-id"))[0] == 401
                _, issued, _ = await token(session)
                status, body, _ = await get(
                    session, "/latest/meta-data/spot/instance-action", issued
                )
                assert status == 200
                assert json.loads(body)["time"] == "2020-04-24T17:11:44Z"
                path = "/latest/meta-data/events/maintenance/scheduled"
                (event,) = json.loads((await get(session, path, issued))[1])
                assert event["Code"] == "instance-retirement"
                assert event["NotBefore"] == "1 May 2026 00:00:00 GMT"

        asyncio.run(check())
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert "imds-mock stopped" in stderr


def test_cli_refuses_bad_options_with_exit_code_2() -> None:
    cases = [
        (["--instance-id", "i-xyz"], "not an EC2 instance id"),
        (["--spot-itn-delay", "10s", "--spot-itn-time", "2026-01-01T00:00:00Z"], "not both"),
        (["--scheduled-event", "code=system-reboot,colour=red"], "--scheduled-event"),
    ]
    for args, fragment in cases:
        result = spotwright("imds-mock", "--port", "0", *args)
        assert result.returncode == 2, (args, result.stderr)
        assert fragment in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
