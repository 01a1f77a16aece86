"""``spotwright imds-mock``: serve a fake instance-metadata service until Ctrl-C.

Wiring only: options become a ``MockConfig`` (bad values are a ``UserError``), the service
is ``spotwright.imds.start_mock``, and the first line on stdout is its URL so a script can
start it in the background and read where to point a handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from typing import TYPE_CHECKING

import click

from spotwright.catalog import load_catalog
from spotwright.cli._errors import UserError
from spotwright.imds import (
    ACTIONS,
    LIFECYCLE_STATES,
    ScheduledEvent,
    parse_time,
    scheduled_event_from_spec,
)
from spotwright.model.durations import parse_duration
from spotwright.observability.logs import configure_logging

if TYPE_CHECKING:
    from spotwright.imds import MockConfig

__all__ = ["imds_mock_command"]


def _seconds(option: str, text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise UserError(f"{option}: {exc}") from None


def _time(option: str, text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_time(text, what=option)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _architecture(instance_type: str) -> str:
    """The identity document's ``architecture``, from the catalog when the type is in it."""
    catalog = load_catalog()
    if instance_type in catalog and catalog.get(instance_type).arch == "arm64":
        return "arm64"
    return "x86_64"


def _events(specs: tuple[str, ...], now: float) -> tuple[ScheduledEvent, ...]:
    events = []
    for spec in specs:
        try:
            events.append(scheduled_event_from_spec(spec, now=now))
        except ValueError as exc:
            raise UserError(f"--scheduled-event {spec!r}: {exc}") from None
    return tuple(events)


async def _serve(config: MockConfig) -> None:
    from spotwright.imds import CONTROL_PREFIX, start_mock

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # no signal handlers on Windows
            loop.add_signal_handler(signum, stop.set)
    try:
        mock = await start_mock(config)
    except OSError as exc:
        raise UserError(
            f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}"
        ) from None
    try:
        click.echo(mock.url)
        tokens = "required" if config.require_token else "optional"
        click.echo(
            f"serving {config.instance_id} ({config.instance_type}, {config.zone}); "
            f"IMDSv2 tokens {tokens}; control: {mock.url}{CONTROL_PREFIX}/state; "
            "Ctrl-C to stop",
            err=True,
        )
        await stop.wait()
    finally:
        await mock.aclose()
    click.echo("imds-mock stopped", err=True)


@click.command("imds-mock", short_help="Serve a fake EC2 instance-metadata service.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=int, default=1338, show_default=True, help="Port to listen on (0: any free)."
)
@click.option(
    "--require-token/--no-require-token",
    default=False,
    show_default=True,
    help="Require IMDSv2 session tokens (401 without one).",
)
@click.option("--instance-id", default="i-1234567890abcdef0", show_default=True)
@click.option("--instance-type", default="m4.xlarge", show_default=True)
@click.option("--zone", default="us-east-1a", show_default=True, help="Availability zone.")
@click.option("--local-ipv4", default="172.16.34.43", show_default=True)
@click.option(
    "--spot-action",
    type=click.Choice(ACTIONS),
    default="terminate",
    show_default=True,
    help="What the spot notice says EC2 will do.",
)
@click.option(
    "--spot-itn-delay", metavar="DURATION", help="Raise the spot notice this long after start."
)
@click.option(
    "--spot-itn-time",
    metavar="ISO8601",
    help="Pin the notice's action time; it appears 2 minutes before.",
)
@click.option(
    "--rebalance-delay",
    metavar="DURATION",
    help="Raise a rebalance recommendation this long after start.",
)
@click.option("--rebalance-time", metavar="ISO8601", help="Pin the recommendation's noticeTime.")
@click.option(
    "--scheduled-event",
    "scheduled_events",
    multiple=True,
    metavar="SPEC",
    help="A scheduled event: a code, or code=...,state=...,id=...,not-before=... (repeatable).",
)
@click.option(
    "--asg-target-state",
    type=click.Choice(LIFECYCLE_STATES),
    default="InService",
    show_default=True,
    help="autoscaling/target-lifecycle-state at start.",
)
@click.option(
    "--asg-terminate-delay",
    metavar="DURATION",
    help="Switch the target lifecycle state to Terminated this long after start.",
)
@click.option(
    "--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True
)
def imds_mock_command(
    host: str,
    port: int,
    require_token: bool,
    instance_id: str,
    instance_type: str,
    zone: str,
    local_ipv4: str,
    spot_action: str,
    spot_itn_delay: str | None,
    spot_itn_time: str | None,
    rebalance_delay: str | None,
    rebalance_time: str | None,
    scheduled_events: tuple[str, ...],
    asg_target_state: str,
    asg_terminate_delay: str | None,
    log_format: str,
) -> None:
    """Serve an EC2 instance-metadata mock (amazon-ec2-metadata-mock's paths) until Ctrl-C."""
    if spot_itn_delay is not None and spot_itn_time is not None:
        raise UserError("give --spot-itn-delay or --spot-itn-time, not both")
    if rebalance_delay is not None and rebalance_time is not None:
        raise UserError("give --rebalance-delay or --rebalance-time, not both")
    from spotwright.imds import MockConfig  # the server side, imported only to serve

    try:
        config = MockConfig(
            host=host,
            port=port,
            require_token=require_token,
            instance_id=instance_id,
            instance_type=instance_type,
            zone=zone,
            local_ipv4=local_ipv4,
            architecture=_architecture(instance_type),
            spot_action=spot_action,
            spot_delay=_seconds("--spot-itn-delay", spot_itn_delay),
            spot_time=_time("--spot-itn-time", spot_itn_time),
            rebalance_delay=_seconds("--rebalance-delay", rebalance_delay),
            rebalance_time=_time("--rebalance-time", rebalance_time),
            scheduled_events=_events(scheduled_events, time.time()),
            asg_target_state=asg_target_state,
            asg_terminate_delay=_seconds("--asg-terminate-delay", asg_terminate_delay),
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None
    configure_logging(fmt="json" if log_format == "json" else "text", stream=sys.stderr)
    asyncio.run(_serve(config))
