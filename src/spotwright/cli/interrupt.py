"""``spotwright interrupt``: send a spot interruption to a target, ec2-spot-interrupter style.

Wiring only: options become an ``InterruptPlan``, ``--to`` picks the target's function in
``spotwright.interrupter`` from ``_TARGETS``, and each delivered signal is printed as one
line. ``--to`` names the kind of target and the positional TARGET is its address, so a
target that needs no address (AWS FIS, to come) can be added to the table with its own
entry and become the default without changing how the local ones are written.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from urllib.parse import urlsplit

import click

from spotwright.cli._errors import UserError
from spotwright.interrupter import (
    InterruptError,
    InterruptPlan,
    Sent,
    instance_ids_from,
    interrupt_imds_mock,
    interrupt_queue,
)
from spotwright.model.durations import format_duration, parse_duration
from spotwright.observability.logs import configure_logging

__all__ = ["interrupt_command"]


class _TargetFailed(UserError):
    """The input was fine but the target could not be reached or refused: exit 1, not 2."""

    exit_code = 1


_Target = Callable[[str, InterruptPlan, str | None, str | None], list[Sent]]


def _to_imds_mock(
    url: str, plan: InterruptPlan, _region: str | None, _profile: str | None
) -> list[Sent]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(
            f"TARGET: expected the imds-mock's URL like http://127.0.0.1:1338, got {url!r}"
        )
    sent = asyncio.run(interrupt_imds_mock(url, plan))
    for record in sent:
        click.echo(record.describe())
    return sent


def _to_queue(url: str, plan: InterruptPlan, region: str | None, profile: str | None) -> list[Sent]:
    def waiting(seconds: float, label: str) -> None:
        click.echo(f"waiting {format_duration(round(seconds))} before the {label}", err=True)

    return interrupt_queue(
        url,
        plan,
        region=region,
        profile=profile,
        on_sent=lambda record: click.echo(record.describe()),
        on_wait=waiting,
    )


#: The targets ``--to`` accepts, each with a function taking (address, plan, region, profile).
_TARGETS: dict[str, _Target] = {"imds-mock": _to_imds_mock, "queue": _to_queue}


def _seconds(option: str, text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise UserError(f"{option}: {exc}") from None


@click.command("interrupt", short_help="Send a spot interruption to a target.")
@click.argument("target", required=False, metavar="TARGET")
@click.option(
    "--instance-ids",
    "-i",
    "instance_ids",
    multiple=True,
    required=True,
    metavar="IDS",
    help="Instances to interrupt: comma-separated and/or repeated.",
)
@click.option(
    "--to",
    "to",
    type=click.Choice(sorted(_TARGETS)),
    required=True,
    help="Where to send it: imds-mock (TARGET is its URL) or queue (TARGET is an SQS URL).",
)
@click.option(
    "--delay",
    "-d",
    default="15s",
    show_default=True,
    metavar="DURATION",
    help="How long until the interruption notice.",
)
@click.option(
    "--rebalance-first",
    metavar="DURATION",
    help="Also send a rebalance recommendation this long before the notice.",
)
@click.option("--region", "-r", help="AWS region (default: the queue URL's, then the profile's).")
@click.option("--profile", "-p", help="AWS profile for the queue target.")
def interrupt_command(
    target: str | None,
    instance_ids: tuple[str, ...],
    to: str,
    delay: str,
    rebalance_first: str | None,
    region: str | None,
    profile: str | None,
) -> None:
    """Send a spot interruption (optionally after a rebalance recommendation) to TARGET.

    \b
      spotwright interrupt -i i-1234567890abcdef0 --to imds-mock http://127.0.0.1:1338
      spotwright interrupt -i i-0abc... --to queue https://sqs.us-east-1.amazonaws.com/1234/q
    """
    if target is None:
        raise UserError(f"--to {to} needs a TARGET: the {to}'s URL")
    # Each delivery is printed on stdout already; logs only say what went wrong, on stderr.
    configure_logging(stream=sys.stderr, level="warning")
    try:
        plan = InterruptPlan(
            instance_ids=instance_ids_from(instance_ids),
            delay=_seconds("--delay", delay) or 0.0,
            rebalance_first=_seconds("--rebalance-first", rebalance_first),
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None
    try:
        _TARGETS[to](target, plan, region, profile)
    except ValueError as exc:
        raise UserError(f"{to} {target}: {exc}") from None
    except InterruptError as exc:
        raise _TargetFailed(str(exc)) from None
