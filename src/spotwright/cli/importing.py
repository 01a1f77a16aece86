"""``spotwright import``: bring other tools' configuration over as spotwright's own CRDs."""

from __future__ import annotations

from pathlib import Path

import click

from spotwright.cli._errors import UserError
from spotwright.model.karpenter_import import ImportFailed, Note, convert_files, to_yaml

__all__ = ["import_group"]


@click.group("import")
def import_group() -> None:
    """Convert configuration written for other tools."""


@import_group.command("karpenter")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "--out",
    type=click.Path(path_type=Path, dir_okay=False, writable=True),
    help="Write the YAML here instead of to standard output.",
)
@click.option("--strict", is_flag=True, help="Exit 1 if any field was left out.")
def import_karpenter(files: tuple[Path, ...], out: Path | None, strict: bool) -> None:
    """Convert Karpenter NodePools and EC2NodeClasses (FILE... may hold many documents).

    Prints spotwright.io/v1alpha1 NodePool and EC2NodeClass YAML. Every field left out
    or rewritten is reported on standard error with its path; invalid input exits 2.
    """
    try:
        result = convert_files(files)
    except ImportFailed as exc:
        _report(exc.notes)
        raise UserError(str(exc)) from exc
    _report(result.notes)
    text = to_yaml(result.documents)
    if out is None:
        click.echo(text, nl=False)
    else:
        try:
            out.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise UserError(f"{out}: {exc.strerror or exc}") from exc
    if strict and result.dropped:
        click.echo(f"spotwright: {len(result.dropped)} field(s) left out (--strict)", err=True)
        raise SystemExit(1)


def _report(notes: list[Note]) -> None:
    for note in notes:
        click.echo(f"spotwright: {note}", err=True)
