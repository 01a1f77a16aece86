"""The instance-metadata HTTP service: amazon-ec2-metadata-mock's paths, served by aiohttp.

Handlers such as the Node Termination Handler (and spotwright's own IMDS mode) can only be
tested end to end against something that speaks IMDS exactly: the token dance of IMDSv2,
404 for a notice that is not there yet, plain-text bodies even for JSON, directory
listings. This module is that service, started in-process by tests (``start_mock``) or from
``spotwright imds-mock``. The metadata tree is rebuilt from ``MockState`` on every request,
so a notice scheduled for later simply appears in the tree (and its directory listing)
when its time comes.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from spotwright.imds.control import add_control_routes
from spotwright.imds.state import (
    ACTIONS,
    LIFECYCLE_STATES,
    MockState,
    RebalanceNotice,
    ScheduledEvent,
    check_instance_id,
    iso_z,
    region_of_zone,
    spot_notice,
    whole_second,
)
from spotwright.observability import get_logger

__all__ = [
    "MAX_TOKEN_TTL",
    "TOKEN_HEADER",
    "TTL_HEADER",
    "MockConfig",
    "RunningMock",
    "TokenStore",
    "start_mock",
]

TOKEN_HEADER = "X-aws-ec2-metadata-token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
#: IMDS accepts token lifetimes from 1 s to 6 h.
MAX_TOKEN_TTL = 21600
_log = get_logger("imds-mock")
_INSTANCE_TYPE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9-]+$")
_MAC = re.compile(r"^[0-9a-f]{2}(?::[0-9a-f]{2}){5}$")
_AMI = re.compile(r"^ami-[0-9a-f]{8,17}$")


@dataclass(frozen=True, slots=True)
class MockConfig:
    """How to serve and what to announce; defaults are amazon-ec2-metadata-mock's.

    ``spot_delay``/``spot_time`` schedule a spot notice (raised ``spot_delay`` seconds after
    start, or with its action time pinned to the epoch ``spot_time``); the rebalance and
    Auto Scaling options work the same way. ``port`` 0 picks a free port. ``clock`` is the
    only source of time, so tests can move it instead of sleeping.
    """

    host: str = "127.0.0.1"
    port: int = 1338
    require_token: bool = False
    instance_id: str = "i-1234567890abcdef0"
    instance_type: str = "m4.xlarge"
    zone: str = "us-east-1a"
    ami_id: str = "ami-0a887e401f7654935"
    local_ipv4: str = "172.16.34.43"
    mac: str = "0e:49:61:0f:c3:11"
    account_id: str = "123456789012"
    architecture: str = "x86_64"
    life_cycle: str = "spot"
    spot_action: str = "terminate"
    spot_delay: float | None = None
    spot_time: float | None = None
    rebalance_delay: float | None = None
    rebalance_time: float | None = None
    scheduled_events: tuple[ScheduledEvent, ...] = ()
    asg_target_state: str = "InService"
    asg_terminate_delay: float | None = None
    clock: Callable[[], float] = field(default=time.time, compare=False)

    def __post_init__(self) -> None:
        """Refuse a configuration a real instance could not have, with the reason."""
        check_instance_id(self.instance_id)
        region_of_zone(self.zone)
        if not _INSTANCE_TYPE.match(self.instance_type):
            raise ValueError(f"expected an instance type like m5.large, got {self.instance_type!r}")
        if not _AMI.match(self.ami_id):
            raise ValueError(f"expected an AMI id like ami-0123456789abcdef0, got {self.ami_id!r}")
        if not _MAC.match(self.mac):
            raise ValueError(f"expected a MAC address like 0e:49:61:0f:c3:11, got {self.mac!r}")
        try:
            ipaddress.IPv4Address(self.local_ipv4)
        except ValueError:
            raise ValueError(f"expected an IPv4 address, got {self.local_ipv4!r}") from None
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be from 0 to 65535, got {self.port}")
        if self.spot_action not in ACTIONS:
            raise ValueError(f"spot action must be one of {', '.join(ACTIONS)}")
        if self.asg_target_state not in LIFECYCLE_STATES:
            raise ValueError(
                f"target lifecycle state must be one of {', '.join(LIFECYCLE_STATES)}, "
                f"got {self.asg_target_state!r}"
            )
        for name in ("spot", "rebalance"):
            delay, pinned = getattr(self, f"{name}_delay"), getattr(self, f"{name}_time")
            if delay is not None and pinned is not None:
                raise ValueError(f"give a {name} delay or a pinned {name} time, not both")
        for delay in (self.spot_delay, self.rebalance_delay, self.asg_terminate_delay):
            if delay is not None and not delay >= 0:
                raise ValueError(f"delays must be seconds, 0 or more, got {delay}")

    @property
    def region(self) -> str:
        return region_of_zone(self.zone)

    @property
    def local_hostname(self) -> str:
        """EC2's private DNS name: ``ip-a-b-c-d`` and the region's internal domain."""
        domain = "ec2.internal" if self.region == "us-east-1" else f"{self.region}.compute.internal"
        return f"ip-{self.local_ipv4.replace('.', '-')}.{domain}"

    def initial_state(self, state: MockState) -> None:
        """Schedule the configured notices against the moment the service starts."""
        start = state.now()
        if self.spot_delay is not None or self.spot_time is not None:
            notice = spot_notice(
                self.spot_action, now=start, delay=self.spot_delay, action_time=self.spot_time
            )
            state.schedule_spot(notice)
        if self.rebalance_time is not None:
            state.schedule_rebalance(RebalanceNotice(self.rebalance_time))
        elif self.rebalance_delay is not None:
            state.schedule_rebalance(RebalanceNotice(whole_second(start + self.rebalance_delay)))
        for event in self.scheduled_events:
            state.put_event(event)
        state.set_lifecycle(self.asg_target_state)
        if self.asg_terminate_delay is not None:
            state.set_lifecycle("Terminated", delay=self.asg_terminate_delay)


class TokenStore:
    """IMDSv2 session tokens and when each expires; expired ones are forgotten."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._expiry: dict[str, float] = {}

    def issue(self, ttl: int) -> str:
        now = self._clock()
        self._expiry = {token: at for token, at in self._expiry.items() if at > now}
        token = secrets.token_urlsafe(32)
        self._expiry[token] = now + ttl
        return token

    def remaining(self, token: str) -> int | None:
        """Whole seconds the token is still valid, or ``None`` if unknown or expired."""
        expires = self._expiry.get(token)
        now = self._clock()
        if expires is None or expires <= now:
            return None
        return max(1, math.ceil(expires - now))


def _metadata_tree(config: MockConfig, state: MockState, started: float) -> dict[str, str]:
    """Every leaf under ``/latest/`` that exists right now, with its body."""
    meta = {
        "ami-id": config.ami_id,
        "ami-launch-index": "0",
        "hostname": config.local_hostname,
        "instance-id": config.instance_id,
        "instance-life-cycle": config.life_cycle,
        "instance-type": config.instance_type,
        "local-hostname": config.local_hostname,
        "local-ipv4": config.local_ipv4,
        "mac": config.mac,
        "placement/availability-zone": config.zone,
        "placement/region": config.region,
        "services/domain": "amazonaws.com",
        "services/partition": "aws",
        "autoscaling/target-lifecycle-state": state.lifecycle_state(),
        "events/maintenance/scheduled": _json([event.body() for event in state.visible_events()]),
    }
    spot = state.visible_spot()
    if spot is not None:
        meta["spot/instance-action"] = _json(spot.body())
        meta["spot/termination-time"] = iso_z(spot.action_time)
    rebalance = state.visible_rebalance()
    if rebalance is not None:
        meta["events/recommendations/rebalance"] = _json(rebalance.body())
    tree = {f"meta-data/{path}": body for path, body in meta.items()}
    tree["dynamic/instance-identity/document"] = _json(_identity(config, started), indent=2)
    return tree


def _identity(config: MockConfig, started: float) -> dict[str, Any]:
    return {
        "accountId": config.account_id,
        "architecture": config.architecture,
        "availabilityZone": config.zone,
        "billingProducts": None,
        "devpayProductCodes": None,
        "marketplaceProductCodes": None,
        "imageId": config.ami_id,
        "instanceId": config.instance_id,
        "instanceType": config.instance_type,
        "kernelId": None,
        "pendingTime": iso_z(started),
        "privateIp": config.local_ipv4,
        "ramdiskId": None,
        "region": config.region,
        "version": "2017-09-30",
    }


def _json(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, indent=indent)


def _listing(tree: dict[str, str], prefix: str) -> str | None:
    """The directory listing IMDS gives for ``prefix``: children, sub-directories with ``/``."""
    children: set[str] = set()
    start = f"{prefix}/" if prefix else ""
    for path in tree:
        if path.startswith(start):
            head, slash, _ = path[len(start) :].partition("/")
            children.add(head + slash)
    return "\n".join(sorted(children)) if children else None


def _text(body: str, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    # Real IMDS serves every body, JSON included, as text/plain.
    return web.Response(text=body, status=status, content_type="text/plain", headers=headers)


class _Metadata:
    """The request handlers for ``/latest/...``: tokens first, then the tree."""

    def __init__(self, config: MockConfig, state: MockState, tokens: TokenStore) -> None:
        self._config = config
        self._state = state
        self._tokens = tokens
        self._started = state.now()

    def _authorize(self, request: web.Request) -> dict[str, str] | None:
        """Headers for the answer, or ``None`` when the request must get 401.

        A token that is sent is always checked, even when tokens are optional: IMDS answers
        401 to an expired token rather than falling back to IMDSv1.
        """
        token = request.headers.get(TOKEN_HEADER)
        if token is None:
            return None if self._config.require_token else {}
        remaining = self._tokens.remaining(token)
        return None if remaining is None else {TTL_HEADER: str(remaining)}

    async def root(self, request: web.Request) -> web.Response:
        headers = self._authorize(request)
        if headers is None:
            return _text("Unauthorized", 401)
        return _text("latest", headers=headers)

    async def token(self, request: web.Request) -> web.Response:
        if request.method != "PUT":
            return _text("Method Not Allowed", 405, {"Allow": "PUT"})
        if "X-Forwarded-For" in request.headers:
            # IMDS refuses tokens to anything that came through a proxy.
            return _text("Forbidden", 403)
        raw = request.headers.get(TTL_HEADER, "").strip()
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_TOKEN_TTL:
            return _text(f"{TTL_HEADER} must be a whole number from 1 to {MAX_TOKEN_TTL}", 400)
        ttl = int(raw)
        _log.debug("issued token", ttl=ttl)
        return _text(self._tokens.issue(ttl), headers={TTL_HEADER: str(ttl)})

    async def metadata(self, request: web.Request) -> web.Response:
        if request.method not in ("GET", "HEAD"):
            return _text("Method Not Allowed", 405, {"Allow": "GET, HEAD"})
        headers = self._authorize(request)
        if headers is None:
            return _text("Unauthorized", 401)
        path = request.match_info["tail"].strip("/")
        tree = _metadata_tree(self._config, self._state, self._started)
        if path in tree:
            return _text(tree[path], headers=headers)
        listing = _listing(tree, path)
        if listing is None:
            return _text("Not Found", 404)
        return _text(listing, headers=headers)


@dataclass(slots=True)
class RunningMock:
    """A mock serving on ``url`` until ``aclose()``; ``state`` is its live state."""

    url: str
    config: MockConfig
    state: MockState
    _runner: web.AppRunner

    async def aclose(self) -> None:
        await self._runner.cleanup()

    async def __aenter__(self) -> RunningMock:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def build_app(config: MockConfig, state: MockState) -> web.Application:
    """The aiohttp application: metadata under ``/latest``, control under ``/spotwright``."""
    metadata = _Metadata(config, state, TokenStore(state.now))
    app = web.Application()
    app.router.add_get("/", metadata.root)
    app.router.add_route("*", "/latest/api/token", metadata.token)
    app.router.add_route("*", "/latest{tail:(/.*)?}", metadata.metadata)
    add_control_routes(app, config, state)
    return app


async def start_mock(config: MockConfig) -> RunningMock:
    """Start serving ``config`` on its host and port; raises ``OSError`` if it cannot bind."""
    state = MockState(config.clock)
    config.initial_state(state)
    runner = web.AppRunner(build_app(config, state), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, config.host, config.port).start()
    except BaseException:
        await runner.cleanup()
        raise
    host, port = runner.addresses[0][:2]
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1" if host == "0.0.0.0" else "::1"
    shown = f"[{host}]" if ":" in host else host
    _log.info("serving instance metadata", instance_id=config.instance_id, port=port)
    return RunningMock(f"http://{shown}:{port}", config, state, runner)
