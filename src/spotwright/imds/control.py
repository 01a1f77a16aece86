"""The mock's control endpoint: change what the instance announces while handlers poll it.

A test (or ``spotwright interrupt --to imds-mock``) needs to raise a notice at a chosen
moment without restarting the service, because restarting would also drop the handler's
tokens and connections, which is not what an interruption looks like. These routes live
under ``/spotwright/v1/`` so they can never collide with an IMDS path, take small JSON
bodies, check every field, and answer 400 with a message that names the field and what
was expected; they need no IMDS token, since they are not part of what is being mocked.

    POST   /spotwright/v1/spot-interruption  {"delaySeconds": 0, "action": "terminate"}
                                             or {"time": "<ISO action time>"}
    POST   /spotwright/v1/rebalance          {"delaySeconds": 0} or {"noticeTime": "<ISO>"}
    POST   /spotwright/v1/scheduled-events   {"code": "system-reboot", "state": "active", ...}
    POST   /spotwright/v1/lifecycle-state    {"state": "Terminated", "delaySeconds": 0}
    DELETE /spotwright/v1/notices            every notice removed, back to InService
    GET    /spotwright/v1/state              what is scheduled and what is visible now

The notice routes also take an optional ``instanceId``: a caller that means another
instance gets 409 instead of silently interrupting this one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web

from spotwright.imds.state import (
    ACTIONS,
    EVENT_CODES,
    EVENT_STATES,
    LIFECYCLE_STATES,
    MockState,
    RebalanceNotice,
    iso_z,
    parse_time,
    scheduled_event,
    spot_notice,
    whole_second,
)
from spotwright.observability import get_logger

if TYPE_CHECKING:
    from spotwright.imds.mock import MockConfig

__all__ = ["CONTROL_PREFIX", "MAX_DELAY_SECONDS", "add_control_routes"]

CONTROL_PREFIX = "/spotwright/v1"
#: A longer delay is almost certainly milliseconds typed as seconds.
MAX_DELAY_SECONDS = 30 * 86400.0
_log = get_logger("imds-mock")


class _BadRequest(Exception):
    """A request the control endpoint refuses; the message goes back to the caller."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _error(message: str, status: int = 400) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def _body(request: web.Request, allowed: tuple[str, ...]) -> dict[str, Any]:
    """The request's JSON object (an empty body is ``{}``), with only ``allowed`` keys."""
    text = await request.text()
    if not text.strip():
        return {}
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _BadRequest(f"request body is not JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(body, dict):
        raise _BadRequest(f"request body must be a JSON object, not {type(body).__name__}")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise _BadRequest(f"unknown field {unknown[0]!r}; this endpoint takes {', '.join(allowed)}")
    return body


def _delay(body: Mapping[str, Any]) -> float | None:
    value = body.get("delaySeconds")
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 <= value <= MAX_DELAY_SECONDS
    ):
        raise _BadRequest(
            f"delaySeconds: expected a number of seconds from 0 to {MAX_DELAY_SECONDS:.0f}, "
            f"got {json.dumps(value)}"
        )
    return float(value)


def _string(body: Mapping[str, Any], key: str, allowed: tuple[str, ...] = ()) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise _BadRequest(f"{key}: expected a non-empty string, got {json.dumps(value)}")
    if allowed and value not in allowed:
        raise _BadRequest(f"{key}: expected one of {', '.join(allowed)}, got {value!r}")
    return value


def _time(body: Mapping[str, Any], key: str) -> float | None:
    text = _string(body, key)
    if text is None:
        return None
    try:
        return parse_time(text, what=key)
    except ValueError as exc:
        raise _BadRequest(str(exc)) from None


def _one_of(body: Mapping[str, Any], first: str, second: str) -> None:
    if body.get(first) is not None and body.get(second) is not None:
        raise _BadRequest(f"give {first} or {second}, not both")


class _Control:
    """The route handlers: each changes the state and returns all of it, or raises
    ``_BadRequest`` before changing anything."""

    def __init__(self, config: MockConfig, state: MockState) -> None:
        self._config = config
        self._state = state

    def _check_instance(self, body: Mapping[str, Any]) -> None:
        wanted = _string(body, "instanceId")
        if wanted is not None and wanted != self._config.instance_id:
            raise _BadRequest(
                f"this mock serves {self._config.instance_id}, not {wanted}", status=409
            )

    def state(self) -> dict[str, Any]:
        config = self._config
        return {
            "instanceId": config.instance_id,
            "instanceType": config.instance_type,
            "availabilityZone": config.zone,
            "region": config.region,
            "requireToken": config.require_token,
            **self._state.snapshot(),
        }

    async def get_state(self, _: web.Request) -> dict[str, Any]:
        return self.state()

    async def spot(self, request: web.Request) -> dict[str, Any]:
        body = await _body(request, ("action", "delaySeconds", "time", "instanceId"))
        self._check_instance(body)
        _one_of(body, "delaySeconds", "time")
        action = _string(body, "action", ACTIONS) or "terminate"
        notice = spot_notice(
            action, now=self._state.now(), delay=_delay(body), action_time=_time(body, "time")
        )
        self._state.schedule_spot(notice)
        _log.info(
            "spot interruption scheduled",
            action=action,
            notice_time=iso_z(notice.notice_time),
            action_time=iso_z(notice.action_time),
        )
        return self.state()

    async def rebalance(self, request: web.Request) -> dict[str, Any]:
        body = await _body(request, ("delaySeconds", "noticeTime", "instanceId"))
        self._check_instance(body)
        _one_of(body, "delaySeconds", "noticeTime")
        pinned = _time(body, "noticeTime")
        when = (
            pinned
            if pinned is not None
            else whole_second(self._state.now() + (_delay(body) or 0.0))
        )
        self._state.schedule_rebalance(RebalanceNotice(when))
        _log.info("rebalance recommendation scheduled", notice_time=iso_z(when))
        return self.state()

    async def scheduled(self, request: web.Request) -> dict[str, Any]:
        fields = (
            "code",
            "state",
            "eventId",
            "description",
            "notBefore",
            "notAfter",
            "notBeforeDeadline",
            "instanceId",
        )
        body = await _body(request, fields)
        self._check_instance(body)
        state = _string(body, "state", EVENT_STATES) or "active"
        event_id = _string(body, "eventId")
        given = {key for key, value in body.items() if value is not None} - {"instanceId"}
        if event_id in self._state.events and given <= {"eventId", "state"}:
            # Only a new state for a known event: cancel or complete it, keep the rest.
            event = self._state.with_event_state(event_id, state)
        else:
            try:
                event = scheduled_event(
                    _string(body, "code", EVENT_CODES) or "system-reboot",
                    now=self._state.now(),
                    state=state,
                    event_id=event_id,
                    description=_string(body, "description"),
                    not_before=_time(body, "notBefore"),
                    not_after=_time(body, "notAfter"),
                    not_before_deadline=_time(body, "notBeforeDeadline"),
                )
            except ValueError as exc:
                raise _BadRequest(str(exc)) from None
        self._state.put_event(event)
        _log.info("scheduled event set", event_id=event.event_id, code=event.code, state=state)
        return self.state()

    async def lifecycle(self, request: web.Request) -> dict[str, Any]:
        body = await _body(request, ("state", "delaySeconds", "instanceId"))
        self._check_instance(body)
        state = _string(body, "state", LIFECYCLE_STATES)
        if state is None:
            raise _BadRequest(f"state: required, one of {', '.join(LIFECYCLE_STATES)}")
        self._state.set_lifecycle(state, delay=_delay(body))
        _log.info("target lifecycle state set", state=state, delay=body.get("delaySeconds"))
        return self.state()

    async def reset(self, _: web.Request) -> dict[str, Any]:
        self._state.reset()
        _log.info("notices reset")
        return self.state()


_Handler = Callable[[web.Request], Awaitable[dict[str, Any]]]


def _json_route(handler: _Handler) -> Callable[[web.Request], Awaitable[web.Response]]:
    """Wrap a handler returning a dict: 200 with it as JSON, or the error it raised."""

    async def route(request: web.Request) -> web.Response:
        try:
            return web.json_response(await handler(request))
        except _BadRequest as exc:
            return _error(str(exc), exc.status)

    return route


def add_control_routes(app: web.Application, config: MockConfig, state: MockState) -> None:
    control = _Control(config, state)
    routes = app.router
    routes.add_get(f"{CONTROL_PREFIX}/state", _json_route(control.get_state))
    routes.add_post(f"{CONTROL_PREFIX}/spot-interruption", _json_route(control.spot))
    routes.add_post(f"{CONTROL_PREFIX}/rebalance", _json_route(control.rebalance))
    routes.add_post(f"{CONTROL_PREFIX}/scheduled-events", _json_route(control.scheduled))
    routes.add_post(f"{CONTROL_PREFIX}/lifecycle-state", _json_route(control.lifecycle))
    routes.add_delete(f"{CONTROL_PREFIX}/notices", _json_route(control.reset))
