"""Report each step of an interruption action to a webhook, without ever slowing a drain.

Teams want a chat message (Slack, Chime, Feishu, a custom receiver) when a node is being
taken away. The Node Termination Handler sends one POST per event with a 5 s timeout, does
not retry, and only logs a failure, so notifications go missing exactly when the network
is busy (its issues #534 and #724); its default body is shaped for Slack only (#161). Here:

* the body is a template with ``${field}`` placeholders (``string.Template``), checked when
  it is loaded: every placeholder must be a known field, and the body it renders must be
  JSON. Values are inserted JSON-escaped, so ``"${detail}"`` stays valid JSON whatever the
  detail says;
* reports go into a bounded queue that one background task delivers in order, so the
  handler's call returns at once and a dead receiver can never hold up an eviction;
* each delivery is retried with exponential backoff on timeouts, connection errors, 408,
  425, 429 and 5xx, up to a bounded number of attempts; other 4xx answers (a wrong URL or
  body) are given up at once, since repeating them cannot help.
"""

from __future__ import annotations

import asyncio
import json
import string
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

import aiohttp
from prometheus_client import CollectorRegistry, Counter

from spotwright.observability.logs import get_logger

__all__ = ["DEFAULT_TEMPLATE", "FIELDS", "StepReport", "WebhookReporter", "WebhookTemplate"]

log = get_logger("webhook")

#: The placeholders a template may use.
FIELDS = (
    "kind",
    "instance_id",
    "node",
    "action",
    "step",
    "result",
    "time",
    "detail",
    "event_id",
)
#: A body Slack, Mattermost and most chat webhooks accept.
DEFAULT_TEMPLATE = (
    '{"text": "[spotwright] ${kind} on node ${node} (${instance_id}): '
    '${action}, step ${step}: ${result} at ${time}. ${detail}"}'
)
_RETRY_STATUSES = frozenset({408, 425, 429})


@dataclass(frozen=True, slots=True)
class StepReport:
    """One step the handler took (or tried), in the words a template can use.

    ``time`` is epoch seconds; templates see it as ISO-8601 UTC.
    """

    kind: str
    instance_id: str
    node: str
    action: str
    step: str
    result: str
    time: float
    detail: str
    event_id: str

    def fields(self) -> dict[str, str]:
        values = {key: str(value) for key, value in asdict(self).items()}
        values["time"] = datetime.fromtimestamp(self.time, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return values


_SAMPLE = StepReport(
    kind="spot_interruption",
    instance_id="i-0123456789abcdef0",
    node="ip-10-0-0-1.ec2.internal",
    action="cordon-and-drain",
    step="drain",
    result="ok",
    time=0.0,
    detail='a "quoted" detail\nover two lines',
    event_id="spot-interruption-0123456789abcdef",
)


class WebhookTemplate:
    """A ``${field}`` template, refused at load time rather than at the first interruption."""

    def __init__(self, text: str) -> None:
        template = string.Template(text)
        if not template.is_valid():
            raise ValueError(
                "webhook template: a '$' must start a ${field} placeholder (write $$ for '$')"
            )
        unknown = sorted(set(template.get_identifiers()) - set(FIELDS))
        if unknown:
            raise ValueError(
                f"webhook template: unknown field(s) {', '.join(unknown)}; "
                f"the fields are {', '.join(FIELDS)}"
            )
        self._template = template
        try:
            json.loads(self.render(_SAMPLE))
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"webhook template: the body it renders is not JSON ({exc.msg} at "
                f"line {exc.lineno} column {exc.colno})"
            ) from None

    def render(self, report: StepReport) -> str:
        # Escaped as the inside of a JSON string: the template supplies the quotes.
        values = {key: json.dumps(value)[1:-1] for key, value in report.fields().items()}
        return self._template.substitute(values)


_COUNTERS: weakref.WeakKeyDictionary[CollectorRegistry, Counter] = weakref.WeakKeyDictionary()


def _deliveries(registry: CollectorRegistry) -> Counter:
    counter = _COUNTERS.get(registry)
    if counter is None:
        counter = Counter(
            "spotwright_webhook_deliveries",
            "Webhook reports by outcome: sent, failed (gave up after retries), dropped "
            "(queue full), retried (attempts after the first)",
            ["result"],
            registry=registry,
        )
        _COUNTERS[registry] = counter
    return counter


class WebhookReporter:
    """POST a rendered template for every ``StepReport`` it is called with.

    Calling the reporter only queues the report; ``flush`` waits until the queue is empty
    (at shutdown, and in tests). ``sleep`` waits between attempts, so tests can hold or
    skip the backoff without waiting.
    """

    def __init__(
        self,
        url: str,
        template: WebhookTemplate | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        attempts: int = 5,
        backoff_min: float = 1.0,
        backoff_max: float = 30.0,
        timeout: float = 5.0,
        queue_size: int = 1000,
        registry: CollectorRegistry | None = None,
        session: aiohttp.ClientSession | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if attempts < 1:
            raise ValueError(f"webhook attempts must be at least 1, got {attempts}")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"expected an http:// or https:// webhook URL, got {url!r}")
        self.url = url
        self.template = template or WebhookTemplate(DEFAULT_TEMPLATE)
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        self.attempts = attempts
        self.backoff_min = backoff_min
        self.backoff_max = backoff_max
        self.timeout = timeout
        self.counter = _deliveries(registry if registry is not None else CollectorRegistry())
        self._queue: asyncio.Queue[str] = asyncio.Queue(queue_size)
        self._session = session
        self._owns_session = session is None
        self._sleep = sleep
        self._worker: asyncio.Task[None] | None = None
        self.sent = 0
        self.failed = 0
        self.dropped = 0

    def __call__(self, report: StepReport) -> None:
        """Queue a report; returns at once, whatever the receiver is doing."""
        try:
            self._queue.put_nowait(self.template.render(report))
        except asyncio.QueueFull:
            self.dropped += 1
            self.counter.labels("dropped").inc()
            log.warning("webhook queue full, report dropped", step=report.step, node=report.node)
            return
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._deliver_all())

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued report was sent or given up; False on timeout."""
        try:
            await asyncio.wait_for(self._queue.join(), timeout)
        except TimeoutError:
            return False
        return True

    async def aclose(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        if self._owns_session and self._session is not None:
            await self._session.close()
        self._session = None

    async def _deliver_all(self) -> None:
        while True:
            body = await self._queue.get()
            try:
                await self._deliver(body)
            except Exception as exc:  # one report's failure must not stop the next ones
                log.error("webhook delivery failed", error=f"{type(exc).__name__}: {exc}")
            finally:
                self._queue.task_done()

    async def _deliver(self, body: str) -> None:
        for attempt in range(1, self.attempts + 1):
            started = time.monotonic()
            retry_after, error = await self._post(body)
            if error is None:
                self.sent += 1
                self.counter.labels("sent").inc()
                log.debug(
                    "webhook sent", attempt=attempt, took=f"{time.monotonic() - started:.2f}s"
                )
                return
            if retry_after is None or attempt == self.attempts:
                self.failed += 1
                self.counter.labels("failed").inc()
                log.error("webhook given up", error=error, attempts=attempt, url=self.url)
                return
            self.counter.labels("retried").inc()
            delay = min(self.backoff_max, max(retry_after, self.backoff_min * 2 ** (attempt - 1)))
            log.warning("webhook failed, retrying", error=error, attempt=attempt, retry_in=delay)
            await self._sleep(delay)

    async def _post(self, body: str) -> tuple[float | None, str | None]:
        """``(None, None)`` when delivered; else whether to retry (a minimum wait) and why."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        try:
            async with self._session.post(
                self.url,
                data=body.encode(),
                headers=self.headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout),
            ) as response:
                status = response.status
                wait = _retry_after(response.headers.get("Retry-After"))
        except TimeoutError:
            return 0.0, f"no answer in {self.timeout:g}s"
        except aiohttp.ClientError as exc:
            return 0.0, f"{type(exc).__name__}: {exc}"
        if 200 <= status < 300:
            return None, None
        if status in _RETRY_STATUSES or status >= 500:
            return wait, f"HTTP {status}"
        return None, f"HTTP {status} (not retried: the request itself was refused)"


def _retry_after(text: str | None) -> float:
    """A receiver's ``Retry-After`` in seconds (the date form is rare and ignored)."""
    if text is None:
        return 0.0
    try:
        return max(0.0, float(text.strip()))
    except ValueError:
        return 0.0
