"""What EC2 offers this cluster, discovered from the live APIs and cached.

The Cloud port's ``instance_types()`` and ``offerings()`` are synchronous (the scheduler
calls them in its hot path), so discovery fills caches ahead of time and the port serves
from them. Each part is refreshed on its own interval, measured on the injected Clock:

* every 5 min, instance types and the zones offering them (DescribeInstanceTypes,
  DescribeInstanceTypeOfferings);
* every 12 h, spot and on-demand prices (DescribeSpotPriceHistory, Pricing GetProducts if
  enabled);
* every minute, subnets, security groups and AMIs (DescribeSubnets, DescribeSecurityGroups,
  SSM GetParameter).

An offering is an (instance type, zone, capacity type) where the type is offered in the
zone, a selected subnet is in that zone (one of the default selector's, or of a node class
resolved so far: ``add_zones``), and (for spot) the pool has a spot price. Which of those
zones a NodePool may use is its node class's business (``nodeclasses``). On-demand
prices come from the Pricing API when enabled, else from a catalog (by default the bundled
one, whose prices are us-east-1's). A failed refresh keeps serving the previous data and
tries again 30 s later; only a first fetch that fails is an error.
"""

from __future__ import annotations

import asyncio
import fnmatch
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

from spotwright.adapters.aws._api import AwsCaller
from spotwright.adapters.aws.instance_types import instance_type_from_api
from spotwright.adapters.aws.pricing import fetch_on_demand_prices, fetch_spot_prices
from spotwright.catalog import Catalog
from spotwright.catalog._types import InstanceType
from spotwright.model import labels as wk
from spotwright.observability.logs import get_logger
from spotwright.ports.clock import Clock
from spotwright.ports.cloud import CloudError, Offering

__all__ = [
    "DEFAULT_AMI_PARAMETER",
    "Discovery",
    "RefreshIntervals",
    "SelectorTerm",
    "Subnet",
    "ami_variant",
    "fetch_instance_types",
    "find_security_groups",
    "find_subnets",
]

log = get_logger("aws.discovery")

#: The EKS-optimized AL2023 AMI for a Kubernetes version, architecture and flavour.
DEFAULT_AMI_PARAMETER: Final = (
    "/aws/service/eks/optimized-ami/{version}/amazon-linux-2023/{arch}/{flavor}"
    "/recommended/image_id"
)
#: After a failed refresh, the stale data is served this long before trying again.
RETRY_AFTER_FAILURE_SECONDS: Final = 30.0

V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class SelectorTerm:
    """Selects subnets or security groups: all ``tags`` must match (``*`` = any value),
    and the name (security groups only), or the resource has exactly ``id``. A list of
    terms selects the union (Karpenter's ``subnetSelectorTerms``)."""

    tags: Mapping[str, str] = field(default_factory=dict)
    id: str | None = None
    name: str | None = None

    def filters(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.name:
            out.append({"Name": "group-name", "Values": [self.name]})
        for key, value in sorted(self.tags.items()):
            if value == "*":
                out.append({"Name": "tag-key", "Values": [key]})
            else:
                out.append({"Name": f"tag:{key}", "Values": [value]})
        return out


@dataclass(frozen=True, slots=True)
class Subnet:
    id: str
    zone: str
    available_ips: int


@dataclass(frozen=True, slots=True)
class RefreshIntervals:
    instance_types: float = 300.0
    prices: float = 12 * 3600.0
    network: float = 60.0


def ami_variant(instance_type: InstanceType) -> tuple[str, str]:
    """(architecture, flavour) of the EKS-optimized AMI a type needs."""
    arch = "arm64" if instance_type.arch == "arm64" else "x86_64"
    flavor = "nvidia" if instance_type.allocatable.gpu > 0 else "standard"
    return arch, flavor


async def fetch_instance_types(
    ec2: AwsCaller, patterns: Sequence[str] = ()
) -> tuple[dict[str, set[str]], dict[str, Mapping[str, Any]]]:
    """(type -> zones offering it, type -> DescribeInstanceTypes record) for the region.

    ``patterns`` (shell-style, as EC2 filters take them: ``m5.*``) restrict the types. With
    a wildcard among them the offerings are listed unfiltered and matched here, because not
    every EC2 implementation honours wildcards in DescribeInstanceTypeOfferings filters
    (moto does not); exact names are passed as a filter.
    """

    def wanted(name: str) -> bool:
        return not patterns or any(fnmatch.fnmatchcase(name, p) for p in patterns)

    filters = [{"Name": "instance-type", "Values": list(patterns)}] if patterns else []
    exact = not any(ch in p for p in patterns for ch in "*?[")
    offered = await ec2.collect(
        "DescribeInstanceTypeOfferings",
        "InstanceTypeOfferings",
        LocationType="availability-zone",
        Filters=filters if exact else [],
    )
    zones: dict[str, set[str]] = {}
    for row in offered:
        name = str(row["InstanceType"])
        if wanted(name):
            zones.setdefault(name, set()).add(str(row["Location"]))
    records = await ec2.collect("DescribeInstanceTypes", "InstanceTypes", Filters=filters)
    by_name = {
        str(r["InstanceType"]): r
        for r in records
        if str(r.get("InstanceType")) in zones and wanted(str(r["InstanceType"]))
    }
    return {name: zones[name] for name in by_name}, by_name


async def find_subnets(ec2: AwsCaller, terms: Sequence[SelectorTerm]) -> dict[str, Subnet]:
    """Zone -> the available subnet launches there use: of those the terms select, the
    one with the most free addresses (ties: the lowest id)."""
    found: dict[str, Subnet] = {}
    for term in terms:
        params: dict[str, Any] = {"Filters": term.filters()}
        if term.id:
            params["SubnetIds"] = [term.id]
        for row in await ec2.collect("DescribeSubnets", "Subnets", **params):
            if row.get("State", "available") != "available":
                continue
            subnet = Subnet(
                str(row["SubnetId"]),
                str(row["AvailabilityZone"]),
                int(row.get("AvailableIpAddressCount", 0)),
            )
            found[subnet.id] = subnet
    best: dict[str, Subnet] = {}
    for subnet in sorted(found.values(), key=lambda s: (-s.available_ips, s.id)):
        best.setdefault(subnet.zone, subnet)
    return dict(sorted(best.items()))


async def find_security_groups(ec2: AwsCaller, terms: Sequence[SelectorTerm]) -> tuple[str, ...]:
    """The ids of every security group the terms select."""
    found: set[str] = set()
    for term in terms:
        params: dict[str, Any] = {"Filters": term.filters()}
        if term.id:
            params["GroupIds"] = [term.id]
        rows = await ec2.collect("DescribeSecurityGroups", "SecurityGroups", **params)
        found.update(str(row["GroupId"]) for row in rows)
    return tuple(sorted(found))


class _Cached(Generic[V]):
    """One value with a time to live; concurrent refreshes share one fetch."""

    def __init__(self, name: str, ttl: float, clock: Clock) -> None:
        self.name = name
        self.ttl = ttl
        self._clock = clock
        self._value: V | None = None
        self._stamp = float("-inf")
        self._lock = asyncio.Lock()
        self.version = 0

    @property
    def value(self) -> V | None:
        return self._value

    def stale(self) -> bool:
        return self._clock.now() - self._stamp >= self.ttl

    async def get(self, fetch: Callable[[], Awaitable[V]], *, force: bool = False) -> V:
        if self._value is not None and not force and not self.stale():
            return self._value
        async with self._lock:
            if self._value is not None and not force and not self.stale():
                return self._value
            try:
                value = await fetch()
            except CloudError as exc:
                if self._value is None:
                    raise
                log.warning("refresh failed, serving cached data", part=self.name, error=str(exc))
                retry_in = min(self.ttl, RETRY_AFTER_FAILURE_SECONDS)
                self._stamp = self._clock.now() - self.ttl + retry_in
                return self._value
            self._value = value
            self._stamp = self._clock.now()
            self.version += 1
            return value


@dataclass(frozen=True)
class _TypeData:
    records: Mapping[str, Mapping[str, Any]]
    zones: Mapping[str, frozenset[str]]


@dataclass(frozen=True)
class _Prices:
    spot: Mapping[tuple[str, str], float]
    on_demand: Mapping[str, float]
    source: str


class Discovery:
    def __init__(
        self,
        *,
        region: str,
        ec2: AwsCaller,
        ssm: AwsCaller,
        pricing: AwsCaller | None,
        clock: Clock,
        catalog: Catalog,
        subnet_selector: Sequence[SelectorTerm],
        security_group_selector: Sequence[SelectorTerm],
        kubernetes_version: str,
        ami_parameter: str = DEFAULT_AMI_PARAMETER,
        ami_id: str | None = None,
        instance_type_patterns: Sequence[str] = (),
        intervals: RefreshIntervals | None = None,
    ) -> None:
        self.region = region
        self._ec2 = ec2
        self._ssm = ssm
        self._pricing = pricing
        self._clock = clock
        self._catalog = catalog
        self._subnet_selector = tuple(subnet_selector)
        self._sg_selector = tuple(security_group_selector)
        self._version = kubernetes_version
        self._ami_parameter = ami_parameter
        self._ami_id = ami_id
        self._patterns = tuple(instance_type_patterns)
        self.intervals = intervals or RefreshIntervals()
        i = self.intervals
        self._types: _Cached[_TypeData] = _Cached("instance types", i.instance_types, clock)
        self._prices: _Cached[_Prices] = _Cached("prices", i.prices, clock)
        self._subnets: _Cached[dict[str, Subnet]] = _Cached("subnets", i.network, clock)
        self._groups: _Cached[tuple[str, ...]] = _Cached("security groups", i.network, clock)
        self._amis: dict[str, _Cached[str]] = {}
        self._built: tuple[tuple[int, int, int, int], tuple[InstanceType, ...]] | None = None
        self._offered: tuple[tuple[int, int, int, int], list[Offering]] | None = None
        self._warned_prices = False
        #: Zones of node classes' subnets (``add_zones``), offered besides the default's.
        self._class_zones: set[str] = set()
        self._zones_version = 0

    # --- refreshing ------------------------------------------------------------------

    async def refresh(self, *, force: bool = False) -> None:
        """Fetch whatever is stale (everything with ``force``).

        Instance types come first (a restricted discovery asks for their prices only), then
        prices, subnets and security groups concurrently.
        """
        await self._types.get(self._fetch_types, force=force)
        await asyncio.gather(
            self._prices.get(self._fetch_prices, force=force),
            self._subnets.get(self._fetch_subnets, force=force),
            self._groups.get(self._fetch_security_groups, force=force),
        )

    @property
    def ready(self) -> bool:
        return self._types.value is not None and self._prices.value is not None

    async def _fetch_types(self) -> _TypeData:
        zones, records = await fetch_instance_types(self._ec2, self._patterns)
        log.debug("discovered instance types", types=len(records), region=self.region)
        return _TypeData(records, {name: frozenset(zones[name]) for name in records})

    async def _fetch_prices(self) -> _Prices:
        wanted = None
        if self._patterns and self._types.value is not None:
            wanted = list(self._types.value.records)
        spot = await fetch_spot_prices(self._ec2, self._clock.now(), wanted)
        on_demand: Mapping[str, float] | None = None
        source = f"catalog {self._catalog.source} ({self._catalog.region})"
        if self._pricing is not None:
            try:
                on_demand = await fetch_on_demand_prices(self._pricing, self.region)
                source = "Pricing API"
            except CloudError as exc:
                log.warning("Pricing API failed, using catalog prices", error=str(exc))
        if not on_demand:
            on_demand = {it.name: it.od_price for it in self._catalog}
            if self._catalog.region != self.region and not self._warned_prices:
                self._warned_prices = True
                log.warning(
                    "on-demand prices are from another region's catalog",
                    region=self.region,
                    catalog_region=self._catalog.region,
                )
        return _Prices(spot, dict(on_demand), source)

    async def _fetch_subnets(self) -> dict[str, Subnet]:
        best = await find_subnets(self._ec2, self._subnet_selector)
        if not best:
            log.info("no subnet matches the default subnet selector", region=self.region)
        return best

    async def _fetch_security_groups(self) -> tuple[str, ...]:
        return await find_security_groups(self._ec2, self._sg_selector)

    # --- what launches need ----------------------------------------------------------------

    async def subnets(self) -> dict[str, Subnet]:
        """Zone -> the subnet launches in that zone use."""
        return await self._subnets.get(self._fetch_subnets)

    async def security_groups(self) -> tuple[str, ...]:
        return await self._groups.get(self._fetch_security_groups)

    async def image(self, instance_type: InstanceType) -> str:
        """The AMI for ``instance_type``: pinned, or the EKS-optimized one from SSM."""
        if self._ami_id:
            return self._ami_id
        arch, flavor = ami_variant(instance_type)
        name = self._ami_parameter.format(version=self._version, arch=arch, flavor=flavor)
        return await self.parameter(name)

    async def parameter(self, name: str) -> str:
        """An SSM parameter's value (an AMI id), cached for the network interval."""
        cached = self._amis.get(name)
        if cached is None:
            cached = self._amis[name] = _Cached(f"AMI {name}", self.intervals.network, self._clock)

        async def fetch() -> str:
            answer = await self._ssm.call("GetParameter", Name=name)
            return str(answer["Parameter"]["Value"])

        return await cached.get(fetch)

    @property
    def kubernetes_version(self) -> str:
        return self._version

    def add_zones(self, zones: Iterable[str]) -> None:
        """Offer types in these zones too: a node class's subnets are there."""
        new = set(zones) - self._class_zones
        if new:
            self._class_zones |= new
            self._zones_version += 1

    # --- the port's synchronous views --------------------------------------------------------

    def _inputs(self) -> tuple[int, int, int, int]:
        return (
            self._types.version,
            self._prices.version,
            self._subnets.version,
            self._zones_version,
        )

    def instance_types(self) -> tuple[InstanceType, ...]:
        if not self.ready:
            raise RuntimeError("EC2 discovery has not run: await cloud.refresh() first")
        inputs = self._inputs()
        if self._built is not None and self._built[0] == inputs:
            return self._built[1]
        data, prices = self._types.value, self._prices.value
        assert data is not None and prices is not None
        types: list[InstanceType] = []
        for name, record in sorted(data.records.items()):
            od_price = prices.on_demand.get(name)
            if od_price is None:
                continue
            known = self._catalog.get(name) if name in self._catalog else None
            it = instance_type_from_api(
                record,
                od_price=od_price,
                spot_savings_pct=known.spot_savings_pct if known else None,
                interruption_band=known.interruption_band if known else None,
            )
            if it is not None:
                types.append(it)
        self._built = (inputs, tuple(types))
        return self._built[1]

    def offerings(self) -> list[Offering]:
        types = self.instance_types()
        inputs = self._inputs()
        if self._offered is not None and self._offered[0] == inputs:
            return list(self._offered[1])
        data, prices = self._types.value, self._prices.value
        assert data is not None and prices is not None
        subnet_zones = set(self._subnets.value or {}) | self._class_zones
        out: list[Offering] = []
        for it in types:
            classes = set(data.records[it.name].get("SupportedUsageClasses") or ())
            for zone in sorted(data.zones[it.name] & subnet_zones):
                if wk.ON_DEMAND in classes:
                    out.append(Offering(it.name, zone, wk.ON_DEMAND, it.od_price))
                spot = prices.spot.get((it.name, zone))
                if wk.SPOT in classes and spot is not None:
                    out.append(Offering(it.name, zone, wk.SPOT, spot))
        self._offered = (inputs, out)
        return list(out)

    def price(self, capacity_type: str, instance_type: str, zone: str) -> float | None:
        """The current price of one pool, if known."""
        prices = self._prices.value
        if prices is None:
            return None
        if capacity_type == wk.SPOT:
            return prices.spot.get((instance_type, zone))
        return prices.on_demand.get(instance_type)

    def zones(self) -> tuple[str, ...]:
        """Zones where launches can go (those with a selected subnet)."""
        return tuple(sorted(set(self._subnets.value or ()) | self._class_zones))

    def stale_parts(self) -> list[str]:
        parts: Iterable[_Cached[Any]] = (self._types, self._prices, self._subnets, self._groups)
        return [part.name for part in parts if part.stale()]
