"""The step webhook against a real HTTP receiver on 127.0.0.1.

A receiver is a tiny aiohttp server that records every POST and answers with a chosen
status. The handler runs for real on the in-memory cluster (pods with no grace period,
a clock that moves on when slept on), so what is checked is what a chat channel would
get: one templated JSON body per step, in order, and that a receiver answering 500 is
retried a bounded number of times and then given up while the drain finishes regardless.
The backoff between attempts goes through an injected sleep, so nothing here waits.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from spotwright.adapters.memory_cluster import MemoryCluster
from spotwright.cli.handler import NoCloud
from spotwright.controllers.context import Context
from spotwright.controllers.node_handler import NodeHandler
from spotwright.events import InterruptionEvent
from spotwright.events._imds_common import iso
from spotwright.events.imds import parse_imds
from spotwright.model.objects import Deployment, Node, Pod
from spotwright.model.resources import Resources
from spotwright.observability.metrics import Metrics
from spotwright.observability.webhook import (
    DEFAULT_TEMPLATE,
    StepReport,
    WebhookReporter,
    WebhookTemplate,
)

T = TypeVar("T")
T0 = 1_772_366_400.0  # 2026-03-01T12:00:00Z
INSTANCE = "i-0a1b2c3d4e5f60718"
NODE = "ip-10-0-0-1.ec2.internal"
STEPS = [
    "received",
    "taint",
    "cordon",
    "exclude-from-load-balancers",
    "launch-replacement",
    "drain",
]


class Receiver:
    """A webhook endpoint answering ``status`` to every POST, which it keeps."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.bodies: list[str] = []
        self.content_types: list[str] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _post(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.text())
        self.content_types.append(request.headers.get("Content-Type", ""))
        return web.Response(status=self.status)

    async def __aenter__(self) -> Receiver:
        app = web.Application()
        app.router.add_post("/hook", self._post)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}/hook"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


class StepClock:
    """A Context clock that moves on when slept on: the drain loop needs no wall time."""

    def __init__(self, now: float = T0) -> None:
        self._now = now

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        self._now += max(0.0, seconds)
        await asyncio.sleep(0)


async def node_with_pods(replicas: int = 2) -> tuple[Context, MemoryCluster]:
    clock = StepClock()
    cluster = MemoryCluster(clock)
    allocatable = Resources.from_k8s({"cpu": "4", "memory": "16Gi", "pods": 110})
    cluster.register_node(Node(name=NODE, allocatable=allocatable, ready=True))
    template = Pod(name="", labels={"app": "web"}, grace_seconds=0)
    cluster.apply_deployment(Deployment(name="web", replicas=replicas, template=template))
    for _ in range(5):
        await asyncio.sleep(0)  # the scheduler's pass binds them
    assert len(cluster.pods_on(NODE)) == replicas
    ctx = Context(
        cluster=cluster,
        cloud=NoCloud(),
        clock=clock,
        metrics=Metrics(),
        nodepools=[],
        instance_types={},
    )
    return ctx, cluster


def spot_notice(now: float) -> InterruptionEvent:
    body = json.dumps({"action": "terminate", "time": iso(math.floor(now) + 120)})
    [event] = parse_imds("spot/instance-action", body, instance_id=INSTANCE, node=NODE, now=now)
    return event


def run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(main())


def test_every_step_reaches_the_receiver_as_the_templated_json_body() -> None:
    template = WebhookTemplate(
        '{"node": "${node}", "kind": "${kind}", "instance": "${instance_id}", '
        '"action": "${action}", "step": "${step}", "result": "${result}", '
        '"at": "${time}", "detail": "${detail}", "event": "${event_id}"}'
    )

    async def main() -> tuple[Receiver, InterruptionEvent, MemoryCluster]:
        ctx, cluster = await node_with_pods()
        async with Receiver() as receiver:
            reporter = WebhookReporter(receiver.url, template)
            handler = NodeHandler(ctx, NODE, listeners=[reporter])
            event = spot_notice(ctx.clock.now())
            assert await handler.handle(event) is True
            assert await reporter.flush(timeout=10)
            await reporter.aclose()
        return receiver, event, cluster

    receiver, event, cluster = run(main)
    bodies = [json.loads(text) for text in receiver.bodies]
    assert [body["step"] for body in bodies] == STEPS
    for body in bodies:
        assert (body["node"], body["instance"], body["event"]) == (NODE, INSTANCE, event.id)
        assert (body["kind"], body["action"], body["result"]) == (
            "spot_interruption",
            "cordon-and-drain",
            "ok",
        )
        assert body["at"].startswith("2026-03-01T12:0") and body["at"].endswith("Z")
    assert "drained in" in bodies[-1]["detail"]
    assert set(receiver.content_types) == {"application/json"}
    assert cluster.pods_on(NODE) == []


def test_a_failing_receiver_is_retried_then_given_up_without_holding_up_the_drain() -> None:
    async def main() -> tuple[Receiver, WebhookReporter, list[float], CollectorRegistry, bool]:
        ctx, cluster = await node_with_pods()
        gate = asyncio.Event()
        delays: list[float] = []

        async def held(delay: float) -> None:
            delays.append(delay)
            await gate.wait()  # every backoff waits until the test lets it go

        async with Receiver(status=500) as receiver:
            registry = CollectorRegistry()
            reporter = WebhookReporter(
                receiver.url, attempts=3, backoff_min=1, registry=registry, sleep=held
            )
            handler = NodeHandler(ctx, NODE, listeners=[reporter])
            drained = await handler.handle(spot_notice(ctx.clock.now()))
            drained = drained and cluster.pods_on(NODE) == []
            assert (reporter.sent, reporter.failed) == (0, 0), "nothing given up yet"
            gate.set()
            assert await reporter.flush(timeout=10)
            await reporter.aclose()
        return receiver, reporter, delays, registry, drained

    receiver, reporter, delays, registry, drained = run(main)
    assert drained, "the drain finished while the webhook was still backing off"
    assert len(receiver.bodies) == 3 * len(STEPS)
    assert (reporter.sent, reporter.failed) == (0, len(STEPS))
    assert delays == [1.0, 2.0] * len(STEPS)

    def count(result: str) -> float | None:
        labels = {"result": result}
        return registry.get_sample_value("spotwright_webhook_deliveries_total", labels)

    assert (count("failed"), count("retried")) == (len(STEPS), 2 * len(STEPS))


def test_a_refused_request_is_not_repeated() -> None:
    async def main() -> tuple[Receiver, WebhookReporter, list[float]]:
        delays: list[float] = []

        async def sleep(delay: float) -> None:
            delays.append(delay)

        async with Receiver(status=404) as receiver:
            reporter = WebhookReporter(receiver.url, attempts=5, sleep=sleep)
            reporter(report())
            assert await reporter.flush(timeout=10)
            await reporter.aclose()
        return receiver, reporter, delays

    receiver, reporter, delays = run(main)
    assert (len(receiver.bodies), reporter.failed, delays) == (1, 1, [])


def test_an_unreachable_receiver_is_retried_like_a_5xx() -> None:
    async def main() -> tuple[WebhookReporter, list[float]]:
        async with Receiver() as receiver:
            url = receiver.url  # closed when the block ends: connections are refused
        delays: list[float] = []

        async def sleep(delay: float) -> None:
            delays.append(delay)

        reporter = WebhookReporter(url, attempts=4, backoff_min=0.5, backoff_max=1, sleep=sleep)
        reporter(report())
        assert await reporter.flush(timeout=10)
        await reporter.aclose()
        return reporter, delays

    reporter, delays = run(main)
    assert (reporter.failed, delays) == (1, [0.5, 1.0, 1.0])


def test_a_full_queue_drops_reports_instead_of_blocking_the_caller() -> None:
    async def main() -> WebhookReporter:
        reporter = WebhookReporter("http://127.0.0.1:9/hook", queue_size=1)
        for _ in range(3):
            reporter(report())
        await reporter.aclose()
        return reporter

    assert run(main).dropped == 2


def report(**changes: Any) -> StepReport:
    fields: dict[str, Any] = {
        "kind": "spot_interruption",
        "instance_id": INSTANCE,
        "node": NODE,
        "action": "cordon-and-drain",
        "step": "drain",
        "result": "ok",
        "time": T0,
        "detail": "drained in 12s",
        "event_id": "spot-interruption-0123456789abcdef",
    }
    fields.update(changes)
    return StepReport(**fields)


def test_values_are_escaped_so_the_body_stays_json() -> None:
    detail = 'PDB "web" refused\nretrying \\ later'
    body = json.loads(WebhookTemplate(DEFAULT_TEMPLATE).render(report(detail=detail)))
    assert detail in body["text"]
    assert "2026-03-01T12:00:00Z" in body["text"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"text": "${node} ${nodename}"}', "unknown field.*nodename.*the fields are"),
        ('{"text": "costs $5"}', r"write \$\$"),
        ('{"text": ${node}}', "not JSON"),
        ("node=${node}", "not JSON"),
    ],
)
def test_a_bad_template_is_refused_when_loaded(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WebhookTemplate(text)
