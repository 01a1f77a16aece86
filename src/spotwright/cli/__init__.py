"""The ``spotwright`` command line: wiring and output only, no logic of its own."""

from __future__ import annotations

import os
import sys
import traceback

import click

from spotwright.cli.bench import bench
from spotwright.cli.catalog import catalog
from spotwright.cli.controller import controller_command
from spotwright.cli.events import events_group
from spotwright.cli.handler import handler_command
from spotwright.cli.imds_mock import imds_mock_command
from spotwright.cli.importing import import_group
from spotwright.cli.interrupt import interrupt_command
from spotwright.cli.simulate import simulate_command

__all__ = ["cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="spotwright")
def cli() -> None:
    """Run Kubernetes workloads on EC2 Spot: provision, handle interruptions, simulate."""


cli.add_command(simulate_command)
cli.add_command(bench)
cli.add_command(import_group)
cli.add_command(catalog)
cli.add_command(events_group)
cli.add_command(controller_command)
cli.add_command(imds_mock_command)
cli.add_command(interrupt_command)
cli.add_command(handler_command)


def main() -> None:
    """Entry point: a failure is a message and an exit code, never a traceback."""
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # the last line of defence for the user interface
        if os.environ.get("SPOTWRIGHT_DEBUG"):
            traceback.print_exc()
        click.echo(
            f"spotwright: internal error: {type(exc).__name__}: {exc}\n"
            "(set SPOTWRIGHT_DEBUG=1 for the traceback, and please report it)",
            err=True,
        )
        sys.exit(70)
