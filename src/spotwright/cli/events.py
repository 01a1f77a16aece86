"""``spotwright events decode``: what spotwright makes of a payload, and what it would do.

For users debugging a queue message or an instance-metadata body: each payload is parsed
exactly as the handlers parse it and printed as the normalized event(s) with the action
the default policy gives each. A payload that does not parse is reported with the reason
and the others are still decoded; the exit code is 1 if any failed, 2 if the input could
not be read at all.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from spotwright.cli._errors import UserError
from spotwright.events import EventParseError, InterruptionEvent, UnknownEvent, parse_eventbridge
from spotwright.events._common import is_instance_id
from spotwright.events.actions import Action, plan_action
from spotwright.events.imds import parse_imds

__all__ = ["events_group"]

#: IMDS bodies do not name their instance; this stands in when --instance-id is not given.
PLACEHOLDER_INSTANCE = "i-00000000000000000"


@click.group("events")
def events_group() -> None:
    """Inspect interruption signals."""


@events_group.command("decode")
@click.argument("file", required=False, default="-")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.option(
    "--source",
    type=click.Choice(["sqs", "imds"]),
    default=None,
    help="Where the payloads come from (default: told apart by their shape).",
)
@click.option(
    "--instance-id",
    default=None,
    help=f"Instance the IMDS bodies were read on (default {PLACEHOLDER_INSTANCE}).",
)
@click.option("--node", default=None, help="Node the IMDS bodies were read on.")
def decode_command(
    file: str, as_json: bool, source: str | None, instance_id: str | None, node: str | None
) -> None:
    """Decode the payload(s) in FILE (default: standard input) and show their actions.

    FILE holds one payload, a JSON array of payloads or one payload per line. A payload is
    an EventBridge event as SQS delivers it (also SNS-wrapped, or an ASG notification), an
    IMDS body, or {"path": "<metadata path>", "body": ...} to say which path an IMDS body
    came from. The output of `aws sqs receive-message` is accepted as it is.
    """
    if instance_id is not None and not is_instance_id(instance_id):
        raise UserError(f"--instance-id: {instance_id!r} is not an EC2 instance id")
    text = _read(file)
    reader = _Decoder(
        source=source,
        instance_id=instance_id or PLACEHOLDER_INSTANCE,
        node=node,
        now=time.time(),
    )
    results = [reader.decode(item) for item in _split(text, source)]
    if not results:
        raise UserError(f"{_name(file)}: no payload found")
    failed = sum(1 for r in results if r.error is not None)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "items": [r.as_json() for r in results],
                    "decoded": len(results) - failed,
                    "failed": failed,
                },
                indent=2,
            )
        )
    else:
        for result in results:
            click.echo(result.as_text())
    click.echo(
        f"{len(results)} payload(s): {len(results) - failed} decoded, {failed} failed", err=True
    )
    if failed:
        sys.exit(1)


# --- input --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Item:
    """One payload: its JSON value, or the raw line when it is not JSON."""

    number: int
    line: int | None
    value: Any = None
    raw: str | None = None
    error: str | None = None


def _name(file: str) -> str:
    return "standard input" if file == "-" else file


def _read(file: str) -> str:
    try:
        data = sys.stdin.buffer.read() if file == "-" else Path(file).read_bytes()
    except OSError as exc:
        raise UserError(f"{_name(file)}: cannot read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UserError(f"{_name(file)}: not UTF-8 text ({exc.reason})") from None
    if not text.strip():
        raise UserError(f"{_name(file)}: empty input")
    return text


def _split(text: str, source: str | None) -> Iterator[_Item]:
    """The payloads of a whole-document JSON value, or of JSON lines."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        yield from _lines(text, source)
        return
    if isinstance(document, list) and not _is_maintenance_list(document, source):
        for number, value in enumerate(document, 1):
            yield _Item(number, None, value)
    elif isinstance(document, Mapping) and isinstance(document.get("Messages"), list):
        # `aws sqs receive-message` output: the payloads are the message bodies.
        for number, message in enumerate(document["Messages"], 1):
            yield _Item(number, None, message)
    else:
        yield _Item(1, None, document)


def _lines(text: str, source: str | None) -> Iterator[_Item]:
    number = 0
    for line_number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        number += 1
        try:
            yield _Item(number, line_number, json.loads(line))
        except json.JSONDecodeError as exc:
            if source == "imds":  # a plain-text body: a lifecycle state or a timestamp
                yield _Item(number, line_number, raw=line.strip())
            else:
                hint = " (plain-text IMDS bodies need --source imds)" if source is None else ""
                yield _Item(number, line_number, error=f"not JSON ({exc.msg}){hint}")


def _is_maintenance_list(value: list[Any], source: str | None) -> bool:
    """Whether a top-level array is one scheduled-maintenance body, not a list of payloads."""
    if not value:
        return source == "imds"
    return all(isinstance(v, Mapping) and "EventId" in v and "detail-type" not in v for v in value)


# --- decoding -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Result:
    item: _Item
    source: str | None = None
    path: str | None = None
    events: tuple[tuple[InterruptionEvent, Action], ...] = ()
    error: str | None = None
    reason: str | None = None

    def label(self) -> str:
        where = f" at line {self.item.line}" if self.item.line is not None else ""
        return f"payload {self.item.number}{where}"

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"payload": self.item.number}
        if self.item.line is not None:
            out["line"] = self.item.line
        if self.error is not None:
            out["error"] = self.error
            out["reason"] = self.reason
            return out
        out["source"] = self.source
        if self.path is not None:
            out["path"] = self.path
        out["events"] = [_event_json(e, a) for e, a in self.events]
        return out

    def as_text(self) -> str:
        if self.error is not None:
            return f"{self.label()}: {self.error}: {self.reason}"
        origin = self.source or "?"
        if self.path is not None:
            origin += f" {self.path}"
        if not self.events:
            return f"{self.label()} ({origin}): no event, nothing to do"
        lines = [f"{self.label()} ({origin}): {len(self.events)} event(s)"]
        for event, action in self.events:
            lines.extend(_event_text(event, action))
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class _Decoder:
    source: str | None
    instance_id: str
    node: str | None
    now: float

    def decode(self, item: _Item) -> _Result:
        if item.error is not None:
            return _Result(item, error="malformed", reason=item.error)
        try:
            source, path, events = self._parse(item)
        except UnknownEvent as exc:
            return _Result(item, error="unknown", reason=str(exc))
        except EventParseError as exc:
            return _Result(item, error="malformed", reason=str(exc))
        planned = tuple((event, plan_action(event)) for event in events)
        return _Result(item, source=source, path=path, events=planned)

    def _parse(self, item: _Item) -> tuple[str, str | None, list[InterruptionEvent]]:
        if item.raw is not None:
            path = _plain_text_path(item.raw)
            return "imds", path, self._imds(path, item.raw)
        value = item.value
        if isinstance(value, Mapping) and isinstance(value.get("Body"), str):
            # One message of `aws sqs receive-message`: its body is the payload.
            if self.source == "imds":
                raise UnknownEvent("an SQS message (with a Body) given with --source imds")
            return "sqs", None, parse_eventbridge(value["Body"])
        if isinstance(value, Mapping) and "path" in value and "body" in value:
            if self.source == "sqs":
                raise UnknownEvent("an IMDS {path, body} payload given with --source sqs")
            body = value["body"]
            text = body if isinstance(body, str) else json.dumps(body)
            path = str(value["path"])
            return "imds", path, self._imds(path, text)
        source = self.source or _guess_source(value)
        if source == "sqs":
            if isinstance(value, str):
                return "sqs", None, parse_eventbridge(value)
            if not isinstance(value, Mapping):
                raise UnknownEvent(f"an SQS message is a JSON object, not {_type(value)}")
            return "sqs", None, parse_eventbridge(value)
        path = _imds_path(value)
        text = value if isinstance(value, str) else json.dumps(value)
        return "imds", path, self._imds(path, text)

    def _imds(self, path: str, text: str) -> list[InterruptionEvent]:
        return parse_imds(path, text, instance_id=self.instance_id, node=self.node, now=self.now)


def _guess_source(value: Any) -> str:
    if isinstance(value, Mapping) and (
        "detail-type" in value
        or value.get("Type") == "Notification"
        or "LifecycleTransition" in value
        or str(value.get("Event", "")).startswith("autoscaling:")
    ):
        return "sqs"
    return "imds"


def _imds_path(value: Any) -> str:
    """The metadata path a body came from, told by its shape."""
    if isinstance(value, Mapping):
        if "action" in value or "time" in value:
            return "spot/instance-action"
        if "noticeTime" in value:
            return "events/recommendations/rebalance"
    if isinstance(value, list):
        return "events/maintenance/scheduled"
    if isinstance(value, str):
        return _plain_text_path(value)
    raise UnknownEvent(
        f"cannot tell what this {_type(value)} is: not an EventBridge event, an ASG "
        "notification or the body of a known IMDS path (wrap it as "
        '{"path": ..., "body": ...} to say which path)'
    )


def _plain_text_path(text: str) -> str:
    """Plain-text IMDS bodies: a timestamp (spot/termination-time) or a lifecycle state."""
    if text.strip()[:1].isdigit():
        return "spot/termination-time"
    return "autoscaling/target-lifecycle-state"


_JSON_TYPES: dict[type, str] = {dict: "object", list: "array", str: "string"}


def _type(value: object) -> str:
    """The JSON name of a decoded value's type, for messages."""
    return _JSON_TYPES.get(type(value), type(value).__name__)


# --- output -------------------------------------------------------------------------------


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    moment = datetime.fromtimestamp(epoch, UTC)
    spec = "seconds" if moment.microsecond == 0 else "milliseconds"
    return moment.isoformat(timespec=spec).replace("+00:00", "Z")


def _event_json(event: InterruptionEvent, action: Action) -> dict[str, Any]:
    return {
        "id": event.id,
        "kind": event.kind.value,
        "instance_id": event.instance_id,
        "node": event.node,
        "source": event.source,
        "start": _iso(event.start),
        "deadline": _iso(event.deadline),
        "raw_id": event.raw_id,
        "action": event.action,
        "state": event.state,
        "region": event.region,
        "detail": event.detail,
        "lifecycle": None
        if event.lifecycle is None
        else {
            "asg_name": event.lifecycle.asg_name,
            "hook_name": event.lifecycle.hook_name,
            "token": event.lifecycle.token,
            "transition": event.lifecycle.transition,
        },
        "plan": {
            "action": action.name.value,
            "steps": [step.value for step in action.steps],
            "deadline": _iso(action.deadline),
            "at_deadline": action.at_deadline,
            "taint": None if action.taint is None else str(action.taint),
            "heartbeat_interval": action.heartbeat_interval,
            "reason": action.reason,
        },
    }


def _event_text(event: InterruptionEvent, action: Action) -> list[str]:
    lines = [f"  {event.kind.value} {event.instance_id or '(no instance)'}  id {event.id}"]
    lines.append(f"    {event.detail}")
    when = f"    notice {_iso(event.start)}"
    if event.deadline is not None:
        when += f", deadline {_iso(event.deadline)} ({event.deadline - event.start:+.0f} s)"
    lines.append(when)
    facts = [f"source {event.source}", f"raw id {event.raw_id}"]
    facts += [f"node {event.node}"] if event.node else []
    facts += [f"region {event.region}"] if event.region else []
    lines.append("    " + ", ".join(facts))
    steps = ", ".join(step.value for step in action.steps) or "no steps"
    lines.append(f"    action {action.name.value}: {steps}")
    if action.deadline is not None:
        lines.append(f"      drain by {_iso(action.deadline)}, then {action.at_deadline}")
    lines.append(f"      {action.reason}")
    return lines
