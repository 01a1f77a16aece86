"""``spotwright interrupt``'s logic: deliver a spot interruption to something that listens.

ec2-spot-interrupter asks AWS FIS to interrupt real instances; before that is worth the
money, a handler is tried against local stand-ins, and this module drives them with the
same plan (which instances, how long until the notice, whether a rebalance recommendation
comes first):

* ``imds-mock``: a running ``spotwright imds-mock`` is told, through its control endpoint,
  to raise the notices itself at the planned moments, so this returns at once and a
  handler polling IMDS sees them appear on time;
* ``queue``: the EventBridge events EC2 would emit are put straight into an SQS queue, each
  when it is due (this waits), in exactly the shape the EventBridge-to-SQS rule delivers,
  built by the same functions the simulated market uses.

and for real instances on AWS:

* ``fis``: an AWS FIS experiment with the action aws:ec2:send-spot-instance-interruptions,
  as ec2-spot-interrupter runs it (``spotwright.adapters.aws.fis``): FIS sends the rebalance
  recommendation at once and the notice after the delay, and EC2 then really interrupts the
  instances. This waits until the experiment is over.

The CLI only chooses one and prints records.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from spotwright.adapters._market_signals import (
    REBALANCE,
    SPOT_WARNING,
    iso_z,
    rebalance_recommendation,
    spot_interruption_warning,
)
from spotwright.events._common import is_instance_id
from spotwright.imds.state import parse_time
from spotwright.observability import get_logger

if TYPE_CHECKING:
    import aiohttp

    from spotwright.adapters.aws.fis import FisClients
    from spotwright.ports.clock import Clock

__all__ = [
    "LABELS",
    "NOTICE_SECONDS",
    "InterruptError",
    "InterruptPlan",
    "Sent",
    "instance_ids_from",
    "interrupt_fis",
    "interrupt_imds_mock",
    "interrupt_queue",
    "queue_location",
]

#: EC2 acts this long after the interruption warning.
NOTICE_SECONDS = 120.0
#: What each EventBridge detail-type is called in messages to people.
LABELS = {REBALANCE: "rebalance recommendation", SPOT_WARNING: "spot interruption warning"}
_REGION = re.compile(r"(?:^|\.)([a-z]{2}(?:-gov|-iso[a-z]?)?-[a-z]+-\d+)\.")
_AWS_DOMAINS = (".amazonaws.com", ".amazonaws.com.cn")
_log = get_logger("interrupter")


class InterruptError(Exception):
    """A target could not be reached or refused the interruption; the text says why."""


@dataclass(frozen=True, slots=True)
class InterruptPlan:
    """What to send: the notice ``delay`` seconds from now, and optionally a rebalance
    recommendation ``rebalance_first`` seconds before it (so at most ``delay``)."""

    instance_ids: tuple[str, ...]
    delay: float = 15.0
    rebalance_first: float | None = None

    def __post_init__(self) -> None:
        if not self.instance_ids:
            raise ValueError("give at least one instance id")
        for instance_id in self.instance_ids:
            if not is_instance_id(instance_id):
                raise ValueError(
                    f"{instance_id!r} is not an EC2 instance id "
                    "(i- and 8 to 17 lowercase hex digits)"
                )
        if len(set(self.instance_ids)) != len(self.instance_ids):
            raise ValueError("an instance id is given twice")
        if not 0 <= self.delay < float("inf"):
            raise ValueError(f"the delay must be 0 s or more, not {self.delay}")
        first = self.rebalance_first
        if first is not None and not 0 <= first <= self.delay:
            raise ValueError(
                f"a rebalance recommendation {first:g} s before the notice would be due before "
                f"now with a delay of {self.delay:g} s; use a delay of at least {first:g} s"
            )

    def steps(self) -> list[tuple[float, str]]:
        """(seconds from now, detail-type) of what is raised, in order."""
        out = []
        if self.rebalance_first is not None:
            out.append((self.delay - self.rebalance_first, REBALANCE))
        out.append((self.delay, SPOT_WARNING))
        return out


@dataclass(frozen=True, slots=True)
class Sent:
    """One signal delivered (or scheduled) for one instance."""

    instance_id: str
    kind: str  # the EventBridge detail-type
    at: float  # when it is (or will be) raised, epoch seconds
    reference: str  # what the target calls it: a message id, the mock's URL

    def describe(self) -> str:
        text = f"{self.instance_id}: {LABELS[self.kind]} at {iso_z(self.at)}"
        if self.kind == SPOT_WARNING:
            text += f"; EC2 would terminate it at {iso_z(self.at + NOTICE_SECONDS)}"
        return f"{text} ({self.reference})"


# -- imds-mock ---------------------------------------------------------------------------


async def interrupt_imds_mock(url: str, plan: InterruptPlan) -> list[Sent]:
    """Have the mock at ``url`` raise the planned notices; returns when they are scheduled.

    A mock serves a single instance, so the plan must name exactly one (``ValueError``
    otherwise); the mock itself checks that it is its own and refuses any other, which is
    an ``InterruptError``, as is a mock that cannot be reached.
    """
    if len(plan.instance_ids) != 1:
        raise ValueError(
            f"an imds-mock serves one instance; got {len(plan.instance_ids)} instance ids"
        )
    import aiohttp  # only this target needs it, and it is slow to import

    from spotwright.imds.control import CONTROL_PREFIX

    instance_id = plan.instance_ids[0]
    base = url.rstrip("/")
    sent: list[Sent] = []
    timeout = aiohttp.ClientTimeout(total=10)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for offset, kind in plan.steps():
                body: dict[str, Any] = {"delaySeconds": offset}
                if kind == REBALANCE:
                    path = "rebalance"
                else:
                    path, body["action"] = "spot-interruption", "terminate"
                state = await _post(session, f"{base}{CONTROL_PREFIX}/{path}", body, instance_id)
                sent.append(Sent(instance_id, kind, _scheduled_at(state, kind), base))
                _log.info("notice scheduled on imds-mock", kind=kind, instance_id=instance_id)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise InterruptError(
            f"cannot reach the imds-mock at {base}: {str(exc) or 'timed out'}"
        ) from None
    return sent


async def _post(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], instance_id: str
) -> dict[str, Any]:
    async with session.post(url, json={**body, "instanceId": instance_id}) as response:
        text = await response.text()
        try:
            answer = json.loads(text)
        except json.JSONDecodeError:
            answer = None
        if not isinstance(answer, dict):
            raise InterruptError(
                f"{url} answered {response.status} without the imds-mock's JSON; "
                "is it a spotwright imds-mock?"
            )
        if response.status != 200:
            raise InterruptError(f"the imds-mock refused: {answer.get('error', text)}")
        return answer


def _scheduled_at(state: dict[str, Any], kind: str) -> float:
    key = "spotInterruption" if kind == SPOT_WARNING else "rebalanceRecommendation"
    notice = state.get(key) or {}
    return parse_time(str(notice.get("noticeTime", "")), what=f"{key}.noticeTime")


# -- SQS ---------------------------------------------------------------------------------


def queue_location(queue_url: str) -> tuple[str | None, str | None]:
    """(region if the URL names one, endpoint URL or ``None`` for AWS) of an SQS queue URL.

    AWS queue URLs name their region (``sqs.eu-west-1.amazonaws.com``); any other host is
    taken to be an emulator (moto, LocalStack) and talked to directly.
    """
    parts = urlsplit(queue_url)
    host = parts.hostname or ""
    if parts.scheme not in ("http", "https") or not host or parts.path.count("/") < 2:
        raise ValueError(
            f"expected an SQS queue URL like "
            f"https://sqs.us-east-1.amazonaws.com/123456789012/name, got {queue_url!r}"
        )
    if host == "queue.amazonaws.com":
        return "us-east-1", None  # the legacy name of us-east-1's endpoint
    found = _REGION.search(host)
    endpoint = None if host.endswith(_AWS_DOMAINS) else f"{parts.scheme}://{parts.netloc}"
    return (found.group(1) if found else None), endpoint


def interrupt_queue(
    queue_url: str,
    plan: InterruptPlan,
    *,
    region: str | None = None,
    profile: str | None = None,
    on_sent: Callable[[Sent], None] = lambda _: None,
    on_wait: Callable[[float, str], None] = lambda _seconds, _label: None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
) -> list[Sent]:
    """Put the planned EventBridge events into the queue, each when it is due.

    ``on_wait(seconds, label)`` is called before each wait and ``on_sent`` after each
    message, so a caller can show progress; ``clock`` and ``sleep`` are injectable so
    tests can check the pacing without waiting.

    Raises ``ValueError`` for a URL that is not a queue's or an unknown profile, and
    ``InterruptError`` when SQS cannot be reached or refuses (checked with
    GetQueueAttributes before any waiting, so a typo does not cost the delay first).

    Every message body is the event JSON that an EventBridge rule targeting the queue
    delivers; each event's ``time`` is the moment it is actually sent, so a consumer's
    two-minute deadline is honest even if sending was slow.
    """
    url_region, endpoint = queue_location(queue_url)
    client = _sqs_client(region or url_region, endpoint, profile)
    event_region: str = client.meta.region_name
    fifo = queue_url.endswith(".fifo")
    _call(lambda: client.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"]))
    ids = rng or random.Random()
    start = clock()
    sent: list[Sent] = []
    for offset, kind in plan.steps():
        wait = start + offset - clock()
        if wait > 0:
            on_wait(wait, LABELS[kind])
            sleep(wait)
        now = clock()
        for instance_id in plan.instance_ids:
            event = _event(kind, ids, now=now, region=event_region, instance_id=instance_id)
            answer = _call(partial(_send, client, queue_url, event, fifo=fifo))
            record = Sent(instance_id, kind, now, f"message {answer.get('MessageId', '?')}")
            _log.info(
                "event sent to queue", kind=kind, instance_id=instance_id, event_id=event["id"]
            )
            on_sent(record)
            sent.append(record)
    return sent


def _send(client: Any, queue_url: str, event: dict[str, Any], *, fifo: bool) -> Any:
    message: dict[str, str] = {"QueueUrl": queue_url, "MessageBody": json.dumps(event)}
    if fifo:
        # A FIFO queue needs a group (one per instance keeps its events in order) and a
        # deduplication id; the event id is what EventBridge itself would use.
        message["MessageGroupId"] = event["detail"]["instance-id"]
        message["MessageDeduplicationId"] = event["id"]
    return client.send_message(**message)


def _event(
    kind: str, rng: random.Random, *, now: float, region: str, instance_id: str
) -> dict[str, Any]:
    if kind == REBALANCE:
        return rebalance_recommendation(rng, now=now, region=region, instance_id=instance_id)
    return spot_interruption_warning(rng, now=now, region=region, instance_id=instance_id)


def _sqs_client(region: str | None, endpoint: str | None, profile: str | None) -> Any:
    """An SQS client; the region falls back to the profile's, then to us-east-1."""
    import boto3  # type: ignore[import-untyped, unused-ignore]
    import botocore.exceptions  # type: ignore[import-untyped, unused-ignore]

    try:
        session = boto3.session.Session(profile_name=profile)
    except botocore.exceptions.ProfileNotFound as exc:
        raise ValueError(str(exc)) from None
    chosen = region or session.region_name or "us-east-1"
    return session.client("sqs", region_name=chosen, endpoint_url=endpoint)


def _call(request: Callable[[], Any]) -> Any:
    """One SQS call; every failure becomes an ``InterruptError`` saying what went wrong."""
    import botocore.exceptions  # type: ignore[import-untyped, unused-ignore]

    try:
        return request()
    except botocore.exceptions.NoCredentialsError:
        raise InterruptError(
            "no AWS credentials found (set AWS_PROFILE, or AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY)"
        ) from None
    except botocore.exceptions.ClientError as exc:
        error = exc.response.get("Error", {})
        raise InterruptError(
            f"SQS refused: {error.get('Code', 'error')}: {error.get('Message', exc)}"
        ) from None
    except botocore.exceptions.BotoCoreError as exc:
        raise InterruptError(f"cannot reach SQS: {exc}") from None


# -- AWS FIS ------------------------------------------------------------------------------


async def interrupt_fis(
    plan: InterruptPlan,
    *,
    region: str | None = None,
    profile: str | None = None,
    role_name: str | None = None,
    clean: bool = True,
    timeout: float = 600.0,
    on_sent: Callable[[Sent], None] = lambda _: None,
    on_progress: Callable[[str], None] = lambda _: None,
    clock: Clock | None = None,
    clients: FisClients | None = None,
    poll_seconds: float | None = None,
) -> list[Sent]:
    """Interrupt real spot instances through an AWS FIS experiment, and follow it to the end.

    The plan's instances must be running spot instances of one region (``region``, else the
    profile's); its delay is when the notice comes, at most 13 minutes. FIS always sends a
    rebalance recommendation when the experiment starts, so ``rebalance_first`` cannot be
    chosen. ``on_sent`` gets the planned signals as soon as the experiment runs (the
    recommendation now, the notice after the delay) and ``on_progress`` one line per step
    (role, template, each state of the experiment, clean-up). ``timeout`` bounds how long
    the experiment is followed; it is stopped then. ``clock`` and ``clients`` are injectable,
    so tests follow an experiment on moto without waiting.

    Returns the signals once the experiment completed. Raises ``ValueError`` for input that
    cannot work (unknown, stopped or on-demand instances, all named; a role FIS cannot
    assume; a delay out of range; no region) and ``InterruptError`` when AWS refuses a step
    or the experiment fails, is stopped or times out, with the reason.
    """
    from spotwright.adapters.aws.fis import (
        DEFAULT_ROLE_NAME,
        POLL_SECONDS,
        FisClients,
        FisError,
        FisInterrupter,
    )
    from spotwright.ports.clock import LoopClock

    if plan.rebalance_first is not None:
        raise ValueError(
            "FIS sends the rebalance recommendation itself, when the experiment starts; "
            "drop --rebalance-first"
        )
    sent: list[Sent] = []

    def started(experiment_id: str, at: float) -> None:
        reference = f"FIS experiment {experiment_id}"
        for offset, kind in ((0.0, REBALANCE), (plan.delay, SPOT_WARNING)):
            for instance_id in plan.instance_ids:
                record = Sent(instance_id, kind, at + offset, reference)
                sent.append(record)
                on_sent(record)

    interrupter = FisInterrupter(
        clients or FisClients.connect(region, profile),
        clock=clock or LoopClock(),
        role_name=role_name or DEFAULT_ROLE_NAME,
        clean=clean,
        timeout=timeout,
        poll_seconds=poll_seconds or POLL_SECONDS,
        say=on_progress,
        on_started=started,
    )
    try:
        outcome = await interrupter.run(plan.instance_ids, plan.delay)
    except FisError as exc:
        raise InterruptError(str(exc)) from None
    if not outcome.completed:
        ended = "timed out" if outcome.status == "timeout" else outcome.status
        raise InterruptError(f"FIS experiment {outcome.experiment_id} {ended}: {outcome.reason}")
    _log.info("fis experiment completed", experiment_id=outcome.experiment_id)
    return sent


def instance_ids_from(values: Sequence[str]) -> tuple[str, ...]:
    """``--instance-ids`` as given: repeated and/or comma-separated, blanks dropped."""
    return tuple(part.strip() for value in values for part in value.split(",") if part.strip())
