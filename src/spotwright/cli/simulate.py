"""``spotwright simulate``: replay a scenario and show what it would cost and disrupt."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from spotwright.catalog import CatalogError, load_catalog
from spotwright.cli._errors import UserError
from spotwright.cli._summary import render_summary
from spotwright.model.durations import format_duration, parse_duration
from spotwright.model.errors import ScenarioError
from spotwright.model.scenario import (
    bundled_example,
    default_scenario_path,
    examples_dir,
    load_scenario,
)
from spotwright.observability.logs import configure_logging
from spotwright.simulation import EPOCH, simulate

__all__ = ["simulate_command"]


@click.command("simulate")
@click.argument("scenario", required=False, type=click.Path(path_type=Path, dir_okay=False))
@click.option("--seed", type=int, default=None, help="Random seed (default: the scenario's).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON summary on stdout.")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Format of the controllers' log lines.",
)
@click.option("--until", "until_text", default=None, help="Stop early, e.g. 30m.")
@click.option("--quiet", "-q", is_flag=True, help="No log lines, only the summary.")
@click.option(
    "--catalog",
    "catalog_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Instance-type catalog (default: the bundled us-east-1 one; see catalog refresh).",
)
def simulate_command(
    scenario: Path | None,
    seed: int | None,
    as_json: bool,
    log_format: str,
    until_text: str | None,
    quiet: bool,
    catalog_path: Path | None,
) -> None:
    """Replay SCENARIO (default: the bundled GPU story) on a simulated spot market.

    SCENARIO is a file, or the name of a bundled example (``mixed-node-group``).
    """
    until = None
    if until_text is not None:
        try:
            until = parse_duration(until_text)
        except ValueError as exc:
            raise UserError(f"--until: {exc}") from exc
    path = _resolve(scenario)
    try:
        catalog = load_catalog(catalog_path)
        parsed = load_scenario(path, catalog)
    except (ScenarioError, CatalogError) as exc:
        raise UserError(str(exc)) from exc
    if parsed.region != catalog.region:
        raise UserError(
            f"{path}: spec.region: the catalog has prices for {catalog.region} only, got "
            f"{parsed.region}; build one with `spotwright catalog refresh --region "
            f"{parsed.region} --out FILE` and pass --catalog FILE"
        )

    log_stream = sys.stderr if as_json else sys.stdout
    console = Console(file=log_stream)
    show_bar = console.is_terminal and not quiet

    def progress_hook(fraction: float, simulated: float) -> None:
        if bar is not None:
            bar.update(
                task,
                completed=fraction * 100,
                description=f"simulated {format_duration(simulated)}",
            )

    bar: Progress | None = None
    task: Any = None
    if show_bar:
        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        task = bar.add_task("simulating", total=100)

    def sink(line: str) -> None:
        if quiet:
            return
        if bar is not None:
            bar.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            print(line, file=log_stream)

    configure_logging(fmt="json" if log_format == "json" else "text", sink=sink, clock=_virtual_now)
    if bar is not None:
        bar.start()
    try:
        summary = simulate(
            parsed,
            catalog,
            seed=seed,
            until=until,
            progress=progress_hook if bar is not None else None,
        )
    finally:
        if bar is not None:
            bar.stop()
    if as_json:
        click.echo(json.dumps(summary))
    else:
        render_summary(summary, Console(file=sys.stdout))


def _resolve(scenario: Path | None) -> Path:
    """The file to load: the argument if it exists, else the bundled example of that name."""
    if scenario is None:
        return default_scenario_path()
    if scenario.exists() or scenario.parent != Path("."):
        return scenario
    bundled = bundled_example(scenario.name)
    if bundled.exists():
        return bundled
    names = ", ".join(sorted(p.stem for p in examples_dir().glob("*.yaml")))
    raise UserError(f"{scenario}: no such file, and no bundled example of that name ({names})")


def _virtual_now() -> float:
    """Log timestamps in simulated time: the virtual loop's clock, from the run's epoch."""
    try:
        return asyncio.get_running_loop().time() + EPOCH
    except RuntimeError:
        return EPOCH
