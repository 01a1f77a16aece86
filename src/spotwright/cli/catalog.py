"""``spotwright catalog``: build instance-type catalogs for a region from the live AWS APIs."""

from __future__ import annotations

import asyncio
import difflib
import sys
from datetime import UTC, datetime
from pathlib import Path

import click

from spotwright.catalog import CatalogError, load_catalog
from spotwright.cli._errors import UserError
from spotwright.observability.logs import configure_logging

__all__ = ["catalog"]


class AwsFailure(click.ClickException):
    """AWS refused or failed (credentials, permissions, network): exit code 1."""

    exit_code = 1

    def show(self, file: object = None) -> None:
        click.echo(f"spotwright: {self.message}", err=True)


@click.group("catalog")
def catalog() -> None:
    """Instance-type catalogs: the table of types and prices simulations use."""


def _check_region(region: str) -> None:
    """Refuse a region botocore does not know, before any call is made."""
    import botocore.session  # type: ignore[import-untyped]

    session = botocore.session.get_session()
    known: set[str] = set()
    for partition in session.get_available_partitions():
        known.update(session.get_available_regions("ec2", partition_name=partition))
    if region in known:
        return
    close = difflib.get_close_matches(region, sorted(known), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise UserError(f"--region: unknown AWS region {region!r}{hint}")


@catalog.command("refresh")
@click.option("--region", required=True, help="AWS region to build the catalog for.")
@click.option(
    "--out",
    "out",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="File to write (default: instance-types-REGION.csv; '-' for stdout).",
)
@click.option("--profile", default=None, help="Named profile from the AWS config files.")
@click.option(
    "--types",
    "patterns",
    multiple=True,
    metavar="PATTERN",
    help="Only these instance types (EC2 wildcards such as 'm7i.*'); repeatable.",
)
@click.option(
    "--pricing/--no-pricing",
    default=True,
    show_default=True,
    help="On-demand prices from the Pricing API (else the bundled us-east-1 prices).",
)
@click.option("--verbose", "-v", is_flag=True, help="Log every AWS call and retry.")
@click.option(
    "--endpoint-url",
    default=None,
    metavar="URL",
    help="Send the EC2 and Pricing calls to this endpoint (an emulator such as moto).",
)
def refresh_command(
    region: str,
    out: Path | None,
    profile: str | None,
    patterns: tuple[str, ...],
    pricing: bool,
    endpoint_url: str | None,
    verbose: bool,
) -> None:
    """Build a catalog for REGION from DescribeInstanceTypes, spot price history and prices.

    The file has the bundled catalog's format; use it with `load_catalog(path)`. See
    docs/catalog.md for where each column comes from.
    """
    region = region.strip()
    _check_region(region)
    configure_logging(level="debug" if verbose else "warning")
    from spotwright.adapters.aws._api import AwsCaller, make_client
    from spotwright.adapters.aws.catalog_build import CatalogBuild, build_catalog
    from spotwright.adapters.aws.pricing import PRICING_API_REGION
    from spotwright.catalog._loading import write_catalog
    from spotwright.ports.clock import LoopClock
    from spotwright.ports.cloud import CloudError

    try:
        fallback = load_catalog()
    except CatalogError as exc:  # pragma: no cover - broken installation
        raise click.ClickException(str(exc)) from exc

    async def run() -> CatalogBuild:
        clock = LoopClock()
        try:
            ec2 = AwsCaller(
                make_client("ec2", region=region, endpoint_url=endpoint_url, profile=profile),
                clock=clock,
            )
            prices = None
            if pricing:
                prices = AwsCaller(
                    make_client(
                        "pricing",
                        region=PRICING_API_REGION,
                        endpoint_url=endpoint_url,
                        profile=profile,
                    ),
                    clock=clock,
                )
        except Exception as exc:  # profile not found, bad config file...
            raise UserError(f"cannot set up AWS clients: {exc}") from exc
        return await build_catalog(
            region=region,
            ec2=ec2,
            pricing=prices,
            fallback=fallback,
            now=clock.now(),
            patterns=patterns,
            fallback_label="the bundled catalog",
        )

    try:
        build = asyncio.run(run())
    except CloudError as exc:
        raise AwsFailure(f"catalog refresh for {region} failed: {exc}") from exc
    if not build.types:
        raise AwsFailure(f"no usable instance type found in {region}")
    for note in build.notes:
        click.echo(f"spotwright: warning: {note}", err=True)
    text = write_catalog(build.types, region=region, comments=build.comments(datetime.now(tz=UTC)))
    target = out if out is not None else Path(f"instance-types-{region}.csv")
    if str(target) == "-":
        sys.stdout.write(text)
    else:
        try:
            target.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise UserError(f"--out: cannot write {target}: {exc}") from exc
    skipped = ", ".join(f"{n} {reason}" for reason, n in sorted(build.skipped.items()))
    spot = sum(1 for it in build.types if it.spot_savings_pct is not None)
    click.echo(
        f"wrote {len(build.types)} instance types ({spot} with spot figures) for {region}"
        f" to {'stdout' if str(target) == '-' else target}"
        + (f"; skipped {skipped}" if skipped else ""),
        err=True,
    )
