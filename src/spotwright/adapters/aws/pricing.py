"""Spot and on-demand prices from the live APIs.

Spot prices are per pool (instance type x zone) and change in steps, so
DescribeSpotPriceHistory asked from "now" returns, per pool, the price in force: the latest
row of each pool is its price. On-demand list prices come from the Pricing API, which only
answers in a few regions (us-east-1 among them) and returns each product as a JSON document
in a string; callers fall back to the bundled catalog when it is not reachable.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from spotwright.adapters.aws._api import AwsCaller

__all__ = [
    "LINUX_PRODUCTS",
    "PRICING_API_REGION",
    "fetch_on_demand_prices",
    "fetch_spot_prices",
    "latest_spot_prices",
    "parse_price_list",
]

#: Product descriptions of Linux spot pools (EC2 reports VPC pools with the suffix).
LINUX_PRODUCTS: Final = ("Linux/UNIX", "Linux/UNIX (Amazon VPC)")
#: The Pricing API endpoint region used for every region's prices.
PRICING_API_REGION: Final = "us-east-1"


def latest_spot_prices(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], float]:
    """(instance type, zone) -> the price of the most recent row for that pool."""
    latest: dict[tuple[str, str], tuple[datetime, float]] = {}
    for row in rows:
        try:
            key = (str(row["InstanceType"]), str(row["AvailabilityZone"]))
            price = float(row["SpotPrice"])
        except (KeyError, TypeError, ValueError):
            continue
        stamp = row.get("Timestamp")
        if not isinstance(stamp, datetime):
            stamp = datetime.min.replace(tzinfo=UTC)
        elif stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=UTC)
        if price <= 0:
            continue
        previous = latest.get(key)
        if previous is None or stamp >= previous[0]:
            latest[key] = (stamp, price)
    return {key: price for key, (_, price) in latest.items()}


#: Instance type names per DescribeSpotPriceHistory call when asking for specific types.
_TYPES_PER_CALL: Final = 100


async def fetch_spot_prices(
    ec2: AwsCaller, now: float, instance_types: Sequence[str] | None = None
) -> dict[tuple[str, str], float]:
    """The current Linux spot price of every pool in the caller's region.

    With ``instance_types``, only those types' pools are asked for (in chunks); without,
    every pool of the region (one paginated listing).
    """
    params: dict[str, Any] = {
        "StartTime": datetime.fromtimestamp(now, tz=UTC),
        "ProductDescriptions": list(LINUX_PRODUCTS),
    }
    if instance_types is None:
        rows = await ec2.collect("DescribeSpotPriceHistory", "SpotPriceHistory", **params)
        return latest_spot_prices(rows)
    names = sorted(set(instance_types))
    rows = []
    for start in range(0, len(names), _TYPES_PER_CALL):
        chunk = names[start : start + _TYPES_PER_CALL]
        rows.extend(
            await ec2.collect(
                "DescribeSpotPriceHistory", "SpotPriceHistory", InstanceTypes=chunk, **params
            )
        )
    return latest_spot_prices(rows)


def parse_price_list(documents: Iterable[str | Mapping[str, Any]]) -> dict[str, float]:
    """Instance type -> USD per hour from Pricing API ``PriceList`` documents.

    Each document is one product with its on-demand terms; the hourly price is the
    ``pricePerUnit.USD`` of the dimension whose unit is ``Hrs``. Products without a positive
    hourly price (reserved-only, zero-priced placeholders) are skipped; when a type appears
    twice, the lower price wins.
    """
    prices: dict[str, float] = {}
    for document in documents:
        try:
            product = json.loads(document) if isinstance(document, str) else document
            name = product["product"]["attributes"]["instanceType"]
            terms = product["terms"]["OnDemand"]
        except (KeyError, TypeError, ValueError):
            continue
        for term in terms.values():
            for dimension in term.get("priceDimensions", {}).values():
                if dimension.get("unit") != "Hrs":
                    continue
                try:
                    price = float(dimension["pricePerUnit"]["USD"])
                except (KeyError, TypeError, ValueError):
                    continue
                if price > 0 and price < prices.get(name, float("inf")):
                    prices[name] = price
    return prices


async def fetch_on_demand_prices(pricing: AwsCaller, region: str) -> dict[str, float]:
    """Linux, shared-tenancy, no-license on-demand prices of every type in ``region``."""

    def term(field: str, value: str) -> dict[str, str]:
        return {"Type": "TERM_MATCH", "Field": field, "Value": value}

    documents = await pricing.collect(
        "GetProducts",
        "PriceList",
        ServiceCode="AmazonEC2",
        Filters=[
            term("regionCode", region),
            term("operatingSystem", "Linux"),
            term("tenancy", "Shared"),
            term("preInstalledSw", "NA"),
            term("capacitystatus", "Used"),
            term("licenseModel", "No License required"),
        ],
    )
    return parse_price_list(documents)
