"""``spotwright catalog refresh`` and the catalog it builds, against moto's EC2."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from awsfakes import REGION, Injector, json_response, run

from spotwright.adapters.aws._api import AwsCaller, RetryPolicy
from spotwright.adapters.aws.catalog_build import build_catalog
from spotwright.catalog import load_catalog
from spotwright.catalog._loading import write_catalog
from spotwright.ports.clock import LoopClock


def spotwright(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spotwright", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_refresh_writes_a_catalog_that_load_catalog_reads(
    moto_endpoint: str, tmp_path: Path
) -> None:
    out = tmp_path / "eu.csv"
    result = spotwright(
        "catalog",
        "refresh",
        "--region",
        "eu-west-1",
        "--endpoint-url",
        moto_endpoint,
        "--no-pricing",
        "--types",
        "m5.*",
        "--types",
        "m6g.large",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert f"to {out}" in result.stderr
    catalog = load_catalog(out)
    assert catalog.region == "eu-west-1"
    assert "m6g.large" in catalog and "m5.large" in catalog and "m5.24xlarge" in catalog
    assert all(name.startswith("m5.") or name == "m6g.large" for name in catalog.names())
    bundled = load_catalog()
    for name in ("m5.large", "m6g.large"):
        assert catalog.get(name).allocatable == bundled.get(name).allocatable
        assert catalog.get(name).od_price == bundled.get(name).od_price  # fallback prices
        assert catalog.get(name).interruption_band == bundled.get(name).interruption_band
        # moto's spot price is a constant $0.00001: the largest saving a row may carry.
        assert catalog.get(name).spot_savings_pct == 99
    assert "bundled catalog" in out.read_text().splitlines()[3]


def cli_in_process(*args: str) -> Any:
    """Run the click command here (faster than a subprocess), restoring the log setup."""
    import structlog
    from click.testing import CliRunner

    from spotwright.cli import cli

    saved = structlog.get_config()
    try:
        return CliRunner().invoke(cli, list(args))
    finally:
        structlog.configure(**saved)


def test_refresh_to_stdout(moto_endpoint: str) -> None:
    result = cli_in_process(
        "catalog",
        "refresh",
        "--region",
        REGION,
        "--endpoint-url",
        moto_endpoint,
        "--no-pricing",
        "--types",
        "c5.large",
        "--out",
        "-",
    )
    assert result.exit_code == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if not line.startswith("#")]
    assert rows[0].startswith("name,family,category")
    assert [row.split(",")[0] for row in rows[1:]] == ["c5.large"]
    assert "wrote 1 instance types" in result.stderr


def test_a_bad_region_is_refused_with_exit_code_2() -> None:
    result = spotwright("catalog", "refresh", "--region", "mars-1")
    assert result.returncode == 2
    assert result.stderr == "spotwright: --region: unknown AWS region 'mars-1'\n"


def test_a_mistyped_region_gets_suggestions() -> None:
    result = cli_in_process("catalog", "refresh", "--region", "us-est-1")
    assert result.exit_code == 2
    assert "unknown AWS region 'us-est-1'; did you mean" in result.stderr
    assert "us-east-1" in result.stderr


def test_an_unreachable_endpoint_fails_with_exit_code_1(aws_env: None) -> None:
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    result = cli_in_process(
        "catalog", "refresh", "--region", REGION, "--endpoint-url", closed, "--no-pricing"
    )
    assert result.exit_code == 1
    assert result.stderr.startswith(f"spotwright: catalog refresh for {REGION} failed: ")
    assert "EndpointConnectionError" in result.stderr


def _product(instance_type: str, usd: str, unit: str = "Hrs") -> str:
    return json.dumps(
        {
            "product": {"attributes": {"instanceType": instance_type, "regionCode": REGION}},
            "terms": {
                "OnDemand": {
                    "T1": {"priceDimensions": {"D1": {"unit": unit, "pricePerUnit": {"USD": usd}}}}
                }
            },
        }
    )


def test_pricing_api_prices_win_over_the_fallback_catalog(
    client: Callable[..., Any],
) -> None:
    pricing_client = client("pricing")
    pages = Injector(pricing_client).answer(
        "GetProducts",
        json_response(
            {
                "FormatVersion": "aws_v1",
                "PriceList": [_product("m5.large", "0.5"), _product("m5.large", "0", "Hrs")],
                "NextToken": "page-2",
            }
        ),
        json_response({"FormatVersion": "aws_v1", "PriceList": [_product("c5.large", "0.25")]}),
    )

    async def main() -> Any:
        clock = LoopClock()
        fast = RetryPolicy(attempts=2, base_seconds=0.01)
        return await build_catalog(
            region=REGION,
            ec2=AwsCaller(client("ec2"), clock=clock, retry=fast),
            pricing=AwsCaller(pricing_client, clock=clock, retry=fast),
            fallback=load_catalog(),
            now=clock.now(),
            patterns=("m5.large", "c5.large", "m5.xlarge"),
        )

    build = run(main())
    prices = {it.name: it.od_price for it in build.types}
    assert prices["m5.large"] == 0.5
    assert prices["c5.large"] == 0.25
    assert prices["m5.xlarge"] == load_catalog().get("m5.xlarge").od_price  # not in the API
    assert pages.sent["GetProducts"] == 2
    filters = {f["Field"]: f["Value"] for f in pages.params["GetProducts"][0]["Filters"]}
    assert filters["regionCode"] == REGION
    assert filters["operatingSystem"] == "Linux"
    assert build.price_source.startswith("Pricing API")


def test_write_catalog_round_trips_the_bundled_catalog(tmp_path: Path) -> None:
    bundled = load_catalog()
    path = tmp_path / "copy.csv"
    write_catalog(bundled, path, region=bundled.region, comments=["a copy"])
    again = load_catalog(path)
    assert again.types == bundled.types
    assert again.region == bundled.region
