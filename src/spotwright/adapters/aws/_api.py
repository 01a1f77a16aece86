"""The one path every AWS call of the adapters takes: rate limit, retry, thread, errors.

boto3 is synchronous and the controllers are asyncio, so each call runs in the default
thread pool through ``asyncio.to_thread``; boto3 clients are thread-safe, sessions are not,
so clients are created once, up front. Around the call:

* a client-side token bucket (``TokenBucket``) keeps a burst of launches under EC2's request
  rate limits instead of provoking them;
* throttling (``RequestLimitExceeded``, ``Throttling`` and kin), 5xx answers, dropped
  connections and answers that arrive malformed (cut short, failing their checksum, or
  not parseable, which botocore raises as ``ResponseParserError``, a plain ``Exception``
  outside its own hierarchy, e.g. when a proxy or an overloaded endpoint answers with an
  HTML page) are retried with capped, jittered exponential backoff, so one bad answer
  delays a batch of launches instead of failing it. botocore's own retries are switched
  off in the clients made here (``make_client``), so there is exactly one retry policy;
* whatever still fails is raised as the port's ``CloudError`` carrying the AWS error code
  (for a failure without one, the botocore exception's class name), never as a botocore
  exception.

Only operations declared in ``_operations.OPERATIONS`` may be called; that is what keeps the
generated IAM policy complete. All waiting goes through the injected Clock.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any, Final

import boto3  # type: ignore[import-untyped]
import botocore.config  # type: ignore[import-untyped]
import botocore.exceptions  # type: ignore[import-untyped]
import botocore.parsers  # type: ignore[import-untyped]
from botocore import xform_name

from spotwright.adapters.aws._operations import is_declared
from spotwright.observability.logs import get_logger
from spotwright.ports.clock import Clock
from spotwright.ports.cloud import CloudError

__all__ = [
    "THROTTLING_CODES",
    "AwsCaller",
    "RetryPolicy",
    "TokenBucket",
    "make_client",
]

log = get_logger("aws.api")

#: Error codes AWS answers with when a caller is over its request rate.
THROTTLING_CODES: Final = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "SlowDown",
        "PriorLaunchThrottle",
    }
)
#: Server-side failures that a later attempt usually gets past.
SERVER_ERROR_CODES: Final = frozenset(
    {"InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable", "ServerInternal"}
)
#: Failures on the way, not answers from AWS: a later attempt usually gets past them.
#: ``ResponseParserError`` is not a ``BotoCoreError``; the others are.
_TRANSIENT_ERRORS: Final = (
    botocore.exceptions.ConnectionError,
    botocore.exceptions.HTTPClientError,  # incl. read timeouts, streams cut short
    botocore.exceptions.IncompleteReadError,
    botocore.exceptions.ChecksumError,
    botocore.parsers.ResponseParserError,
)


def make_client(
    service: str,
    *,
    region: str,
    endpoint_url: str | None = None,
    profile: str | None = None,
    session: boto3.session.Session | None = None,
    max_pool_connections: int = 32,
) -> Any:
    """A boto3 client for the adapters: botocore retries off (``AwsCaller`` retries).

    ``endpoint_url`` points it at an emulator such as moto's server; ``profile`` picks a
    named profile from the shared AWS config.
    """
    if session is None:
        session = boto3.session.Session(profile_name=profile, region_name=region)
    config = botocore.config.Config(
        region_name=region,
        retries={"total_max_attempts": 1, "mode": "standard"},
        max_pool_connections=max_pool_connections,
        connect_timeout=10,
        read_timeout=60,  # above SQS's 20 s long poll
    )
    return session.client(service, region_name=region, endpoint_url=endpoint_url, config=config)


class TokenBucket:
    """At most ``rate`` calls per second on average, ``burst`` at once; waits on the clock."""

    def __init__(self, clock: Clock, *, rate: float, burst: int) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("a token bucket needs rate > 0 and burst >= 1")
        self._clock = clock
        self.rate = rate
        self.burst = burst
        self._tokens = float(burst)
        self._stamp: float | None = None

    async def acquire(self) -> None:
        while True:
            now = self._clock.now()
            if self._stamp is not None:
                self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return
            await self._clock.sleep((1.0 - self._tokens) / self.rate)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Up to ``attempts`` tries; the n-th wait is uniform in [0, min(cap, base * 2**n)]."""

    attempts: int = 5
    base_seconds: float = 0.25
    cap_seconds: float = 10.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0.0, min(self.cap_seconds, self.base_seconds * 2**attempt))


def error_code(exc: BaseException) -> str:
    """The AWS error code of a botocore exception (its class name when there is none)."""
    if isinstance(exc, botocore.exceptions.ClientError):
        return str(exc.response.get("Error", {}).get("Code") or "Unknown")
    return type(exc).__name__


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, botocore.exceptions.ClientError):
        code = error_code(exc)
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return code in THROTTLING_CODES or code in SERVER_ERROR_CODES or int(status) >= 500
    return isinstance(exc, _TRANSIENT_ERRORS)


def _to_cloud_error(exc: BaseException) -> CloudError:
    if isinstance(exc, botocore.exceptions.ClientError):
        message = str(exc.response.get("Error", {}).get("Message") or exc)
        return CloudError(error_code(exc), message)
    return CloudError(type(exc).__name__, str(exc))


class AwsCaller:
    """Calls one boto3 client's operations the way the module docstring describes."""

    def __init__(
        self,
        client: Any,
        *,
        clock: Clock,
        limiter: TokenBucket | None = None,
        retry: RetryPolicy | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.client = client
        self.service = str(client.meta.service_model.service_name)
        self._clock = clock
        self._limiter = limiter
        self._retry = retry or RetryPolicy()
        self._rng = rng or random.Random()

    async def call(self, operation: str, /, **params: Any) -> dict[str, Any]:
        """One API call, e.g. ``await ec2.call("DescribeSubnets", Filters=[...])``."""
        if not is_declared(self.service, operation):
            raise AssertionError(
                f"{self.service}:{operation} is not declared in _operations.OPERATIONS"
            )
        method = getattr(self.client, xform_name(operation))
        attempt = 0
        while True:
            if self._limiter is not None:
                await self._limiter.acquire()
            try:
                response: dict[str, Any] = await asyncio.to_thread(method, **params)
            except (
                botocore.exceptions.ClientError,
                botocore.exceptions.BotoCoreError,
                botocore.parsers.ResponseParserError,
            ) as exc:
                attempt += 1
                if not _retryable(exc) or attempt >= self._retry.attempts:
                    raise _to_cloud_error(exc) from exc
                delay = self._retry.delay(attempt, self._rng)
                log.debug(
                    "retrying aws call",
                    operation=f"{self.service}:{operation}",
                    error=error_code(exc),
                    attempt=attempt,
                    delay=f"{delay:.2f}s",
                )
                await self._clock.sleep(delay)
                continue
            response.pop("ResponseMetadata", None)
            return response

    async def collect(self, operation: str, key: str, /, **params: Any) -> list[Any]:
        """Every item under ``key`` across all pages (``NextToken``), each page retried."""
        items: list[Any] = []
        token: str | None = None
        while True:
            page_params = dict(params)
            if token:
                page_params["NextToken"] = token
            page = await self.call(operation, **page_params)
            items.extend(page.get(key) or ())
            token = page.get("NextToken")
            if not token:
                return items
