"""IMDS mode's signal source: poll this instance's metadata for interruption notices, forever.

A handler running on the node it protects has exactly one job that nothing else can do for
it: notice within seconds that EC2 is about to take the instance away. The most reported
failure of the Node Termination Handler in this mode is that it gives up instead: the
fourth time the same error comes back (an IMDS 401 after a token expired, 503s, a blocked
metadata endpoint; good polls in between do not reset the count) it panics, and the pod
crash-loops exactly when it is needed. So this source treats every failure as something to
log, count and wait out:

* IMDSv2 sessions: a token is requested with a TTL, refreshed a margin before it expires
  (the remaining TTL is re-read from every answer), and a 401 is answered by fetching a
  fresh token and repeating the request once;
* an optional fall-back to IMDSv1 when the token request is refused in a way that means
  "no IMDSv2 here" (403, 404, 405), retried with tokens now and then;
* a 2 s timeout per request, and exponential backoff after a failed round, up to a cap;
* nothing raised inside a round ever leaves the loop; the exporter's
  ``aws_instance_metadata_service_available`` stays at 0 while rounds fail.

Each round reads the polled paths; a 404 means "nothing announced". Bodies are turned into
normalized events by ``events.imds.parse_imds``, whose ids never depend on the time of the
read, so a notice present for two minutes is yielded once, not sixty times; a consumer that
failed to act on one can ``forget`` it to have it yielded again by the next round.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass

import aiohttp
from prometheus_client import CollectorRegistry, Counter

from spotwright.events.imds import POLLED_PATHS, normalize_path, parse_imds
from spotwright.events.model import (
    EventKind,
    EventParseError,
    InterruptionEvent,
    MalformedEvent,
)
from spotwright.observability.exporter import TerminationExporter
from spotwright.observability.logs import get_logger

__all__ = [
    "TOKEN_HEADER",
    "TTL_HEADER",
    "V1_FALLBACK_STATUSES",
    "ImdsClient",
    "ImdsError",
    "ImdsPoller",
    "PollerSettings",
    "falls_back_to_v1",
    "read_identity",
]

log = get_logger("imds")

TOKEN_PATH = "/latest/api/token"
METADATA_PREFIX = "/latest/meta-data/"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
#: Answers to the token PUT that mean "this endpoint does not do IMDSv2" rather than
#: "it is failing": forbidden (e.g. through a proxy), no such path, method not allowed.
V1_FALLBACK_STATUSES = frozenset({403, 404, 405})
#: IMDS accepts session tokens living from 1 s to 6 h.
_MAX_TTL = 21600
#: Paths whose 404 withdraws what the exporter shows (a notice that went away).
_WITHDRAWS = {
    "spot/instance-action": EventKind.SPOT_INTERRUPTION,
    "events/recommendations/rebalance": EventKind.REBALANCE_RECOMMENDATION,
}
_SEEN_LIMIT = 4096


@dataclass(frozen=True, slots=True)
class PollerSettings:
    """How to reach IMDS and how often; defaults are the Node Termination Handler's."""

    url: str = "http://169.254.169.254"
    poll_interval: float = 2.0
    request_timeout: float = 2.0
    token_ttl: int = _MAX_TTL
    #: Refresh the token this long before it expires, so no poll races its expiry.
    token_refresh_margin: float = 60.0
    imdsv1_fallback: bool = False
    #: In IMDSv1 mode, try to get a token again this often (the refusal may have been
    #: transient, and IMDSv2 may be made mandatory on a running instance).
    v1_retry_tokens_after: float = 300.0
    backoff_max: float = 30.0
    paths: tuple[str, ...] = POLLED_PATHS

    def __post_init__(self) -> None:
        """Refuse settings that would make the poller spin or never refresh its token."""
        if not self.poll_interval > 0:
            raise ValueError(f"poll interval must be positive, got {self.poll_interval}")
        if not self.request_timeout > 0:
            raise ValueError(f"request timeout must be positive, got {self.request_timeout}")
        if not 1 <= self.token_ttl <= _MAX_TTL:
            raise ValueError(f"token TTL must be 1 to {_MAX_TTL} seconds, got {self.token_ttl}")
        if not 0 <= self.token_refresh_margin < self.token_ttl:
            raise ValueError("the token refresh margin must be shorter than the token TTL")
        if self.backoff_max < self.poll_interval:
            raise ValueError("the backoff cap must not be shorter than the poll interval")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"expected an http:// URL for IMDS, got {self.url!r}")


class ImdsError(Exception):
    """A request that got no usable answer; ``reason`` is the metric label for it."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def falls_back_to_v1(status: int, *, allowed: bool) -> bool:
    """Whether a refused token request means "use IMDSv1" rather than "IMDS is failing".

    Only when the operator allowed it: on an instance that requires IMDSv2, falling back
    would just trade a clear error for a stream of 401s.
    """
    return allowed and status in V1_FALLBACK_STATUSES


class ImdsClient:
    """Metadata GETs with an IMDSv2 session token (or IMDSv1 when allowed and needed).

    ``session`` may be given (tests pass one with extra headers); otherwise one is opened
    on first use and closed by ``aclose``. ``monotonic`` times the token's life.
    """

    def __init__(
        self,
        settings: PollerSettings,
        *,
        session: aiohttp.ClientSession | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self._session = session
        self._owns_session = session is None
        self._monotonic = monotonic
        self._base = settings.url.rstrip("/")
        self._token: str | None = None
        self._expires = 0.0
        #: Since when requests go without a token (IMDSv1), or None while using IMDSv2.
        self._v1_since: float | None = None
        #: Token requests made so far (each new IMDSv2 session is one).
        self.token_requests = 0

    @property
    def mode(self) -> str:
        return "v1" if self._v1_since is not None else "v2"

    async def get(self, path: str) -> tuple[int, bytes]:
        """GET ``path``: ``(200, body)`` or ``(404, b"")``; anything else raises ``ImdsError``."""
        for attempt in (1, 2):
            headers = await self._auth_headers()
            status, body, answer = await self._request("GET", path, headers)
            if status == 401 and attempt == 1:
                # The token expired or the service forgot it (restarted), or IMDSv2 became
                # mandatory while we were on v1: start a new session and ask again.
                self._token = None
                self._v1_since = None
                continue
            if status == 401:
                raise ImdsError("unauthorized", f"GET {path}: 401 even with a fresh token")
            if status in (200, 404):
                self._note_ttl(answer)
                return status, body if status == 200 else b""
            raise ImdsError(f"http_{status}", f"GET {path}: HTTP {status}")
        raise AssertionError("unreachable")  # pragma: no cover

    async def aclose(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
        self._session = None

    async def _auth_headers(self) -> dict[str, str]:
        now = self._monotonic()
        if self._v1_since is not None:
            if now - self._v1_since < self.settings.v1_retry_tokens_after:
                return {}
            self._v1_since = None
        if self._token is None or now >= self._expires - self.settings.token_refresh_margin:
            await self._fetch_token()
        return {} if self._token is None else {TOKEN_HEADER: self._token}

    async def _fetch_token(self) -> None:
        ttl = self.settings.token_ttl
        self.token_requests += 1
        status, body, answer = await self._request("PUT", TOKEN_PATH, {TTL_HEADER: str(ttl)})
        token = body.decode("utf-8", "replace").strip()
        if status == 200 and token:
            self._token = token
            granted = _seconds(answer.get(TTL_HEADER)) or ttl
            self._expires = self._monotonic() + granted
            return
        self._token = None
        if falls_back_to_v1(status, allowed=self.settings.imdsv1_fallback):
            log.warning("IMDSv2 token refused, falling back to IMDSv1", status=status)
            self._v1_since = self._monotonic()
            return
        hint = "" if status not in V1_FALLBACK_STATUSES else " (IMDSv1 fallback is off)"
        raise ImdsError("token", f"token request answered HTTP {status}{hint}")

    def _note_ttl(self, answer: Mapping[str, str]) -> None:
        """IMDS tells the token's remaining life on every answer: trust it over our count."""
        remaining = _seconds(answer.get(TTL_HEADER))
        if self._token is not None and remaining is not None:
            self._expires = self._monotonic() + remaining

    async def _request(
        self, method: str, path: str, headers: Mapping[str, str]
    ) -> tuple[int, bytes, Mapping[str, str]]:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        timeout = aiohttp.ClientTimeout(total=self.settings.request_timeout)
        try:
            async with self._session.request(
                method, self._base + path, headers=dict(headers), timeout=timeout
            ) as response:
                return response.status, await response.read(), response.headers
        except TimeoutError:
            raise ImdsError(
                "timeout", f"{method} {path}: no answer in {self.settings.request_timeout:g}s"
            ) from None
        except aiohttp.ClientError as exc:
            raise ImdsError(
                "unreachable", f"{method} {path}: {type(exc).__name__}: {exc}"
            ) from None


def _seconds(text: str | None) -> int | None:
    if text is None or not text.strip().isdigit():
        return None
    return int(text.strip())


async def read_identity(client: ImdsClient) -> tuple[str, str]:
    """The instance id and type, as IMDS states them (raises ``ImdsError``)."""
    values = []
    for leaf in ("instance-id", "instance-type"):
        status, body = await client.get(METADATA_PREFIX + leaf)
        if status != 200:
            raise ImdsError("identity", f"IMDS does not state this instance's {leaf}")
        values.append(body.decode("utf-8", "replace").strip())
    return values[0], values[1]


_ERRORS: weakref.WeakKeyDictionary[CollectorRegistry, Counter] = weakref.WeakKeyDictionary()


def _error_counter(registry: CollectorRegistry) -> Counter:
    """One counter per registry, however many pollers report to it."""
    counter = _ERRORS.get(registry)
    if counter is None:
        counter = Counter(
            "spotwright_imds_errors",
            "Metadata requests without a usable answer, and bodies that did not parse",
            ["reason"],
            registry=registry,
        )
        _ERRORS[registry] = counter
    return counter


class ImdsPoller:
    """Poll the interruption paths of one instance and yield each new event once.

    ``clock`` is the wall clock handed to the parsers (the time of each read); ``sleep``
    waits between rounds, so tests can drive rounds without waiting. The exporter, when
    given, is updated after every round, so a scrape never touches IMDS.
    """

    def __init__(
        self,
        settings: PollerSettings,
        *,
        instance_id: str,
        node: str | None,
        exporter: TerminationExporter | None = None,
        client: ImdsClient | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.settings = settings
        self.instance_id = instance_id
        self.node = node
        self.exporter = exporter
        self.client = client if client is not None else ImdsClient(settings)
        self.errors = _error_counter(registry if registry is not None else CollectorRegistry())
        self._clock = clock
        self._sleep = sleep
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._bad_bodies: dict[str, str] = {}
        self._stopping = False
        #: Rounds in a row that met an error; 0 after a clean round.
        self.failures = 0
        #: Whether the last round got a usable answer for every path (None before any).
        self.available: bool | None = None

    def next_delay(self) -> float:
        """The poll interval, doubled for each failed round in a row, up to the cap."""
        interval = self.settings.poll_interval
        if self.failures == 0:
            return interval
        return min(self.settings.backoff_max, interval * 2.0 ** min(self.failures, 30))

    def forget(self, event_id: str) -> None:
        """Yield this event again when a later round still reads it (its action failed)."""
        self._seen.pop(event_id, None)

    def stop(self) -> None:
        """End ``events()`` after the current round or wait."""
        self._stopping = True

    async def events(self) -> AsyncIterator[InterruptionEvent]:
        """Every new event, round after round, until ``stop()``; errors never end it."""
        self._stopping = False
        while not self._stopping:
            for event in await self.poll_once():
                yield event
            if self._stopping:
                break
            await self._sleep(self.next_delay())

    async def poll_once(self) -> list[InterruptionEvent]:
        """One round over every path; the events not yielded before, in path order."""
        fresh: list[InterruptionEvent] = []
        errors: list[ImdsError] = []
        for event in await self._read_all(errors):
            if event.id not in self._seen:
                self._seen[event.id] = None
                fresh.append(event)
        while len(self._seen) > _SEEN_LIMIT:
            self._seen.popitem(last=False)
        self._round_done(errors)
        return fresh

    async def _read_all(self, errors: list[ImdsError]) -> list[InterruptionEvent]:
        """Read each path; one failing path does not hide what the others announce."""
        events: list[InterruptionEvent] = []
        for path in self.settings.paths:
            try:
                events.extend(await self._read(normalize_path(path)))
            except ImdsError as exc:
                errors.append(exc)
                if exc.reason in ("unreachable", "timeout", "token"):
                    break  # every other path would fail the same way, and wait as long
            except Exception as exc:  # a bug here must not end the poller either
                errors.append(ImdsError("internal", f"{path}: {type(exc).__name__}: {exc}"))
        return events

    async def _read(self, path: str) -> list[InterruptionEvent]:
        status, body = await self.client.get(METADATA_PREFIX + path)
        withdrawn = _WITHDRAWS.get(path)
        if status == 404:
            if withdrawn is not None and self.exporter is not None:
                self.exporter.withdraw(withdrawn)
            self._bad_bodies.pop(path, None)
            return []
        try:
            events = parse_imds(
                path, body, instance_id=self.instance_id, node=self.node, now=self._clock()
            )
        except EventParseError as exc:
            reason = "malformed" if isinstance(exc, MalformedEvent) else "unknown"
            self.errors.labels(reason).inc()
            if self._bad_bodies.get(path) != str(exc):  # once per distinct body, not per poll
                self._bad_bodies[path] = str(exc)
                log.warning("ignoring a metadata body that does not parse", error=str(exc))
            return []
        self._bad_bodies.pop(path, None)
        if self.exporter is not None:
            for event in events:
                self.exporter.observe(event)
        return events

    def _round_done(self, errors: list[ImdsError]) -> None:
        ok = not errors
        if self.exporter is not None:
            self.exporter.metadata_service(ok)
        self.available = ok
        if ok:
            if self.failures:
                log.info("metadata service answering again", failed_rounds=self.failures)
            self.failures = 0
            return
        self.failures += 1
        for error in errors:
            self.errors.labels(error.reason).inc()
        log.warning(
            "metadata service poll failed",
            error=str(errors[0]),
            errors=len(errors),
            failed_rounds=self.failures,
            retry_in=f"{self.next_delay():g}s",
        )

    async def aclose(self) -> None:
        self.stop()
        await self.client.aclose()
