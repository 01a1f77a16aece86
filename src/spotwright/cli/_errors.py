"""Turning the project's own errors into clean CLI failures."""

from __future__ import annotations

import click

__all__ = ["UserError"]


class UserError(click.ClickException):
    """Bad input: printed as it is, exit code 2."""

    exit_code = 2

    def show(self, file: object = None) -> None:
        click.echo(f"spotwright: {self.message}", err=True)
