"""The IMDS poller against a real ``spotwright imds-mock`` over HTTP, tokens required.

What matters to a user of IMDS mode is that a notice is seen once and acted on once, and
that no failure of the metadata service, however long, ends the handler. The mock runs
in-process on a free port of 127.0.0.1 with a fake clock; notices are raised through its
control endpoint, as ``spotwright interrupt`` does. Rounds are driven either one by one
(``poll_once``) or through ``events()`` with an injected sleep that records the backoff
and scripts what happens between rounds, so nothing here waits for time to pass.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from spotwright.events import EventKind, InterruptionEvent
from spotwright.events.imds_source import (
    ImdsClient,
    ImdsPoller,
    PollerSettings,
    falls_back_to_v1,
    read_identity,
)
from spotwright.imds import CONTROL_PREFIX, MockConfig, RunningMock, parse_time, start_mock
from spotwright.observability.exporter import TerminationExporter

T0 = parse_time("2026-03-01T12:00:00Z", what="test")
INSTANCE = "i-1234567890abcdef0"
NODE = "ip-172-16-34-43.ec2.internal"


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def control(mock: RunningMock, path: str, body: dict[str, Any]) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{mock.url}{CONTROL_PREFIX}/{path}", data=json.dumps(body)) as answer,
    ):
        assert answer.status == 200, await answer.text()


def poller_for(
    url: str,
    clock: FakeClock,
    *,
    sleep: Callable[[float], Awaitable[None]] | None = None,
    session: aiohttp.ClientSession | None = None,
    monotonic: Callable[[], float] | None = None,
    **settings: Any,
) -> tuple[ImdsPoller, CollectorRegistry]:
    registry = CollectorRegistry()
    config = PollerSettings(url=url, **settings)
    client = ImdsClient(config, session=session, **({"monotonic": monotonic} if monotonic else {}))
    exporter = TerminationExporter(
        instance_id=INSTANCE, instance_type="m4.xlarge", registry=registry, clock=clock
    )
    poller = ImdsPoller(
        config,
        instance_id=INSTANCE,
        node=NODE,
        exporter=exporter,
        client=client,
        registry=registry,
        clock=clock,
        **({"sleep": sleep} if sleep else {}),
    )
    return poller, registry


def scrape(registry: CollectorRegistry) -> list[str]:
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if line.startswith("aws_")]


def errors(registry: CollectorRegistry, reason: str) -> float:
    return registry.get_sample_value("spotwright_imds_errors_total", {"reason": reason}) or 0.0


LABELS = f'instance_id="{INSTANCE}",instance_type="m4.xlarge"'


def test_a_notice_raised_through_the_control_endpoint_is_yielded_once() -> None:
    async def main() -> None:
        clock = FakeClock()
        mock = await start_mock(MockConfig(port=0, require_token=True, clock=clock))
        rounds: list[float] = []

        async def sleep(delay: float) -> None:
            rounds.append(delay)
            if len(rounds) == 2:
                await control(mock, "spot-interruption", {"delaySeconds": 0})
            if len(rounds) == 6:
                poller.stop()

        poller, registry = poller_for(mock.url, clock, sleep=sleep)
        try:
            seen = [event async for event in poller.events()]
        finally:
            await poller.aclose()
            await mock.aclose()
        assert rounds == [2.0] * 6, "every round succeeded, none backed off"
        [event] = seen
        assert event.kind is EventKind.SPOT_INTERRUPTION
        assert (event.instance_id, event.node, event.source) == (INSTANCE, NODE, "imds")
        assert event.deadline == T0 + 120
        assert poller.client.token_requests == 1, "one IMDSv2 session for all six rounds"
        assert scrape(registry) == [
            f"aws_instance_metadata_service_available{{{LABELS}}} 1.0",
            f'aws_instance_termination_imminent{{instance_action="terminate",{LABELS}}} 1.0',
            f"aws_instance_termination_in{{{LABELS}}} 120.0",
            f"aws_instance_rebalance_recommended{{{LABELS}}} 0.0",
        ]

    asyncio.run(main())


def test_a_maintenance_yields_once_when_scheduled_and_once_when_canceled() -> None:
    async def main() -> None:
        clock = FakeClock()
        async with await start_mock(MockConfig(port=0, require_token=True, clock=clock)) as mock:
            poller, _ = poller_for(mock.url, clock)
            try:
                assert await poller.poll_once() == []
                event_id = "instance-event-0123456789abcdef0"
                await control(
                    mock, "scheduled-events", {"code": "system-reboot", "eventId": event_id}
                )
                [active] = await poller.poll_once()
                assert await poller.poll_once() == []
                await control(mock, "scheduled-events", {"eventId": event_id, "state": "canceled"})
                [canceled] = await poller.poll_once()
                assert await poller.poll_once() == []
            finally:
                await poller.aclose()
        assert active.kind is EventKind.SCHEDULED_CHANGE
        assert canceled.kind is EventKind.SCHEDULED_CHANGE_CANCELED
        assert active.raw_id == canceled.raw_id == event_id

    asyncio.run(main())


def test_a_forgotten_event_is_yielded_again_while_it_is_still_announced() -> None:
    async def main() -> None:
        clock = FakeClock()
        async with await start_mock(MockConfig(port=0, require_token=True, clock=clock)) as mock:
            poller, _ = poller_for(mock.url, clock)
            try:
                await control(mock, "rebalance", {"delaySeconds": 0})
                [first] = await poller.poll_once()
                assert await poller.poll_once() == []
                poller.forget(first.id)
                [again] = await poller.poll_once()
            finally:
                await poller.aclose()
        assert again == first
        assert first.kind is EventKind.REBALANCE_RECOMMENDATION

    asyncio.run(main())


def test_an_expired_token_gets_a_401_then_a_fresh_token_and_the_read_is_repeated() -> None:
    async def main() -> None:
        clock = FakeClock()
        async with await start_mock(MockConfig(port=0, require_token=True, clock=clock)) as mock:
            poller, registry = poller_for(mock.url, clock, token_ttl=600)
            try:
                assert await poller.poll_once() == []
                # Time passes on the instance only: the poller still believes in its token.
                clock.now += 3600
                await control(mock, "spot-interruption", {"delaySeconds": 0})
                [event] = await poller.poll_once()
            finally:
                await poller.aclose()
        assert event.kind is EventKind.SPOT_INTERRUPTION
        assert poller.client.token_requests == 2
        assert (poller.available, poller.failures) == (True, 0)
        assert errors(registry, "unauthorized") == 0

    asyncio.run(main())


def test_the_token_is_refreshed_before_it_expires_without_waiting_for_a_401() -> None:
    async def main() -> None:
        clock = FakeClock()
        ticks = FakeClock(1000.0)
        async with await start_mock(MockConfig(port=0, require_token=True, clock=clock)) as mock:
            poller, _ = poller_for(
                mock.url, clock, monotonic=ticks, token_ttl=300, token_refresh_margin=30
            )
            try:
                await poller.poll_once()
                ticks.now += 260  # 40 s of life left: outside the margin, kept
                clock.now += 260
                await poller.poll_once()
                kept = poller.client.token_requests
                ticks.now += 20  # 20 s left: inside the margin, replaced before use
                clock.now += 20
                await poller.poll_once()
            finally:
                await poller.aclose()
        assert (kept, poller.client.token_requests) == (1, 2)
        assert poller.failures == 0

    asyncio.run(main())


def test_the_service_down_for_several_rounds_does_not_end_the_poller() -> None:
    async def main() -> None:
        clock = FakeClock()
        mock = await start_mock(MockConfig(port=0, require_token=True, clock=clock))
        port = int(mock.url.rsplit(":", 1)[1])
        delays: list[float] = []
        gauges: list[list[str]] = []
        current = [mock]

        async def sleep(delay: float) -> None:
            delays.append(delay)
            gauges.append(scrape(registry)[:1])
            if len(delays) == 1:
                await current[0].aclose()  # the metadata service goes away
            if len(delays) == 6:  # ...and comes back on the same address, notice raised
                config = MockConfig(port=port, require_token=True, clock=clock)
                current[0] = await start_mock(config)
                await control(current[0], "spot-interruption", {"delaySeconds": 0})
            if len(delays) == 8:
                poller.stop()

        poller, registry = poller_for(mock.url, clock, sleep=sleep, backoff_max=20)
        seen: list[InterruptionEvent] = []
        try:
            async for event in poller.events():
                seen.append(event)
        finally:
            await poller.aclose()
            await current[0].aclose()
        assert delays == [2.0, 4.0, 8.0, 16.0, 20.0, 20.0, 2.0, 2.0]
        down = [f"aws_instance_metadata_service_available{{{LABELS}}} 0.0"]
        up = [f"aws_instance_metadata_service_available{{{LABELS}}} 1.0"]
        assert gauges == [up, down, down, down, down, down, up, up]
        assert errors(registry, "unreachable") == 5
        assert [event.kind for event in seen] == [EventKind.SPOT_INTERRUPTION]

    asyncio.run(main())


def test_imdsv1_fallback_when_the_token_request_is_refused_and_tokens_are_optional() -> None:
    async def main(fallback: bool) -> tuple[list[InterruptionEvent], ImdsPoller, float]:
        clock = FakeClock()
        # The mock, like IMDS, refuses tokens to requests that came through a proxy.
        proxied = aiohttp.ClientSession(headers={"X-Forwarded-For": "192.0.2.10"})
        async with await start_mock(MockConfig(port=0, clock=clock)) as mock:
            poller, registry = poller_for(
                mock.url, clock, session=proxied, imdsv1_fallback=fallback
            )
            try:
                await control(mock, "spot-interruption", {"delaySeconds": 0})
                seen = await poller.poll_once()
            finally:
                await poller.aclose()
                await proxied.close()
        return seen, poller, errors(registry, "token")

    seen, poller, token_errors = asyncio.run(main(fallback=True))
    assert [event.kind for event in seen] == [EventKind.SPOT_INTERRUPTION]
    assert (poller.client.mode, poller.available, token_errors) == ("v1", True, 0)

    seen, poller, token_errors = asyncio.run(main(fallback=False))
    assert seen == []
    assert (poller.client.mode, poller.available, poller.failures) == ("v2", False, 1)
    assert token_errors >= 1


def test_which_token_refusals_fall_back_to_imdsv1() -> None:
    for status in (403, 404, 405):
        assert falls_back_to_v1(status, allowed=True)
        assert not falls_back_to_v1(status, allowed=False)
    for status in (400, 401, 429, 500, 503):
        assert not falls_back_to_v1(status, allowed=True)


def test_one_broken_path_does_not_hide_what_the_others_announce() -> None:
    """A 500 on one path and an unparseable body on another: the rebalance still comes."""

    async def main() -> None:
        async def token(_: web.Request) -> web.Response:
            return web.Response(
                text="t0ken", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}
            )

        async def metadata(request: web.Request) -> web.Response:
            path = request.match_info["tail"]
            if path == "spot/instance-action":
                return web.Response(text="<html>oops</html>")
            if path == "events/recommendations/rebalance":
                return web.Response(text='{"noticeTime": "2026-03-01T12:00:00Z"}')
            if path == "events/maintenance/scheduled":
                return web.Response(status=500, text="internal error")
            return web.Response(status=404)

        app = web.Application()
        app.router.add_put("/latest/api/token", token)
        app.router.add_get("/latest/meta-data/{tail:.*}", metadata)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        clock = FakeClock()
        poller, registry = poller_for(f"http://{host}:{port}", clock)
        try:
            [first] = await poller.poll_once()
            assert await poller.poll_once() == []
        finally:
            await poller.aclose()
            await runner.cleanup()
        assert first.kind is EventKind.REBALANCE_RECOMMENDATION
        assert errors(registry, "malformed") == 2  # counted on every round
        assert errors(registry, "http_500") == 2
        assert poller.available is False and poller.failures == 2
        assert f"aws_instance_rebalance_recommended{{{LABELS}}} 1.0" in scrape(registry)

    asyncio.run(main())


def test_the_instance_identity_is_read_from_imds() -> None:
    async def main() -> tuple[str, str]:
        config = MockConfig(port=0, require_token=True, instance_type="m5.large")
        async with await start_mock(config) as mock:
            client = ImdsClient(PollerSettings(url=mock.url))
            try:
                return await read_identity(client)
            finally:
                await client.aclose()

    assert asyncio.run(main()) == (INSTANCE, "m5.large")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"poll_interval": 0}, "poll interval"),
        ({"token_ttl": 0}, "token TTL"),
        ({"token_ttl": 60, "token_refresh_margin": 60}, "refresh margin"),
        ({"backoff_max": 1}, "backoff cap"),
        ({"url": "169.254.169.254"}, "http://"),
    ],
)
def test_settings_that_would_make_the_poller_misbehave_are_refused(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        PollerSettings(**options)
