"""``spotwright interrupt``: send a spot interruption to a target, ec2-spot-interrupter style.

Wiring only: options become an ``InterruptPlan``, ``--to`` picks the target's function in
``spotwright.interrupter`` from ``_TARGETS``, and each delivered signal is printed as one
line. ``--to`` names the kind of target and the positional TARGET is its address; AWS FIS,
the default, needs none (the instances are found in the region), the local ones do.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import click

from spotwright.cli._errors import UserError
from spotwright.interrupter import (
    InterruptError,
    InterruptPlan,
    Sent,
    instance_ids_from,
    interrupt_fis,
    interrupt_imds_mock,
    interrupt_queue,
)
from spotwright.model.durations import format_duration, parse_duration
from spotwright.observability.logs import configure_logging

__all__ = ["interrupt_command"]


class _TargetFailed(UserError):
    """The input was fine but the target could not be reached or refused: exit 1, not 2."""

    exit_code = 1


@dataclass(frozen=True, slots=True)
class _Settings:
    """The options beyond the plan; which apply depends on the target."""

    region: str | None = None
    profile: str | None = None
    role_name: str | None = None  # fis only, as are the next two
    clean: bool | None = None
    timeout: float | None = None


_Target = Callable[[str, InterruptPlan, _Settings], list[Sent]]
#: Options only the fis target takes, as shown in messages.
_FIS_ONLY = "--role-name, --clean/--no-clean and --timeout"


def _to_imds_mock(url: str, plan: InterruptPlan, _settings: _Settings) -> list[Sent]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(
            f"TARGET: expected the imds-mock's URL like http://127.0.0.1:1338, got {url!r}"
        )
    sent = asyncio.run(interrupt_imds_mock(url, plan))
    for record in sent:
        click.echo(record.describe())
    return sent


def _to_queue(url: str, plan: InterruptPlan, settings: _Settings) -> list[Sent]:
    def waiting(seconds: float, label: str) -> None:
        click.echo(f"waiting {format_duration(round(seconds))} before the {label}", err=True)

    return interrupt_queue(
        url,
        plan,
        region=settings.region,
        profile=settings.profile,
        on_sent=lambda record: click.echo(record.describe()),
        on_wait=waiting,
    )


def _to_fis(_address: str, plan: InterruptPlan, settings: _Settings) -> list[Sent]:
    return asyncio.run(
        interrupt_fis(
            plan,
            region=settings.region,
            profile=settings.profile,
            role_name=settings.role_name,
            clean=settings.clean is not False,
            timeout=600.0 if settings.timeout is None else settings.timeout,
            on_sent=lambda record: click.echo(record.describe()),
            on_progress=click.echo,
        )
    )


#: The targets ``--to`` accepts, each with a function taking (address, plan, settings).
_TARGETS: dict[str, _Target] = {"fis": _to_fis, "imds-mock": _to_imds_mock, "queue": _to_queue}
#: The targets that take no TARGET address.
_NO_ADDRESS = frozenset({"fis"})


def _seconds(option: str, text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise UserError(f"{option}: {exc}") from None


@click.command("interrupt", short_help="Send a spot interruption to a target.")
@click.argument("target", required=False, metavar="[TARGET]")
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
    default="fis",
    show_default=True,
    help="Where to send it: fis (AWS FIS interrupts the real instances; no TARGET), "
    "imds-mock (TARGET is its URL) or queue (TARGET is an SQS URL).",
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
@click.option(
    "--region",
    "-r",
    help="AWS region (default: for queue the URL's, then the profile's; for fis the profile's).",
)
@click.option("--profile", "-p", help="AWS profile for the fis and queue targets.")
@click.option(
    "--role-name",
    metavar="NAME",
    help="fis: the IAM role FIS assumes, created if missing "
    "[default: spotwright-fis-spot-interrupter].",
)
@click.option(
    "--clean/--no-clean",
    "clean",
    default=None,
    help="fis: delete the experiment template at the end [default: clean].",
)
@click.option(
    "--timeout",
    metavar="DURATION",
    help="fis: stop following (and stop) the experiment after this long [default: 10m].",
)
def interrupt_command(
    target: str | None,
    instance_ids: tuple[str, ...],
    to: str,
    delay: str,
    rebalance_first: str | None,
    region: str | None,
    profile: str | None,
    role_name: str | None,
    clean: bool | None,
    timeout: str | None,
) -> None:
    """Send a spot interruption: through AWS FIS to real instances, or to a local TARGET.

    \b
      spotwright interrupt -i i-0abc... --delay 15s            # AWS FIS, real instances
      spotwright interrupt -i i-1234567890abcdef0 --to imds-mock http://127.0.0.1:1338
      spotwright interrupt -i i-0abc... --to queue https://sqs.us-east-1.amazonaws.com/1234/q
    """
    if to in _NO_ADDRESS:
        if target is not None:
            raise UserError(f"--to {to} takes no TARGET (got {target!r})")
        if rebalance_first is not None:
            raise UserError(
                f"--rebalance-first does not apply to --to {to}: FIS sends the rebalance "
                "recommendation itself, when the experiment starts"
            )
    else:
        if target is None:
            raise UserError(f"--to {to} needs a TARGET: the {to}'s URL")
        if role_name is not None or clean is not None or timeout is not None:
            raise UserError(f"{_FIS_ONLY} apply to --to fis only")
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
    settings = _Settings(region, profile, role_name, clean, _seconds("--timeout", timeout))
    try:
        _TARGETS[to](target or "", plan, settings)
    except ValueError as exc:
        raise UserError(f"{to} {target}: {exc}" if target else f"{to}: {exc}") from None
    except InterruptError as exc:
        raise _TargetFailed(str(exc)) from None
