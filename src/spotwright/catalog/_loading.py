"""Turning the bundled catalog CSV into ``InstanceType`` objects, once and quickly.

Every command and every simulation starts by loading the catalog, so parsing has to stay
cheap (well under 50 ms for ~1,300 types): the csv module and one plain function per row,
with no validation framework in between. Because the file can also be supplied by a user (a trimmed
catalog for a scenario, say), every problem is reported as a ``CatalogError`` that names the
file, the line and the column, rather than as a bare ``ValueError`` from deep inside.
"""

from __future__ import annotations

import csv
import difflib
import functools
import io
import math
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Final

from spotwright.catalog._types import InstanceType
from spotwright.model.resources import Resources

__all__ = [
    "DEFAULT_REGION",
    "PRICED_REGIONS",
    "Catalog",
    "CatalogError",
    "UnknownInstanceType",
    "default_zones",
    "load_catalog",
    "write_catalog",
]

#: The region whose prices and Spot Advisor figures the bundled catalog carries.
DEFAULT_REGION: Final = "us-east-1"
#: Every region the bundled catalog has prices for. Elsewhere the simulator would have to
#: reuse these figures, so callers can check membership and warn.
PRICED_REGIONS: Final[tuple[str, ...]] = (DEFAULT_REGION,)

_BUNDLED_FILE: Final = "instance-types.csv"
_REGION_COMMENT: Final = "# region:"
_MIB: Final = 2**20
_ARCHES: Final = frozenset({"amd64", "arm64"})
_BANDS: Final = range(5)  # Spot Advisor's ranges: <5 %, 5-10, 10-15, 15-20, >20 % per month


class CatalogError(Exception):
    """The catalog could not be read, or something asked of it does not exist."""


class UnknownInstanceType(CatalogError, KeyError):
    """No type by that name in the catalog.

    A ``KeyError`` too, so mapping-style code (``except KeyError``) keeps working. The
    message carries close matches because the usual cause is a typo in a NodePool or
    scenario file, and the fix is obvious once the right name is shown.
    """

    def __init__(self, name: str, suggestions: Sequence[str] = (), region: str = "") -> None:
        self.name = name
        self.suggestions = tuple(suggestions)
        where = f" in the {region} catalog" if region else ""
        message = f"unknown instance type {name!r}{where}"
        if self.suggestions:
            message += "; did you mean " + ", ".join(self.suggestions) + "?"
        super().__init__(message)

    def __str__(self) -> str:
        # KeyError.__str__ would repr() the message and wrap it in quotes.
        return str(self.args[0])


class Catalog:
    """The instance types spotwright may launch in one region, looked up by name.

    Immutable and shared (the bundled one is cached), so it is safe to hand the same
    object to every controller and to the simulator.
    """

    __slots__ = ("_by_name", "_region", "_source", "_types")

    def __init__(
        self,
        types: Iterable[InstanceType],
        *,
        region: str = DEFAULT_REGION,
        source: str = "<memory>",
    ) -> None:
        ordered = tuple(sorted(types, key=lambda it: it.name))
        by_name: dict[str, InstanceType] = {}
        for it in ordered:
            if it.name in by_name:
                raise CatalogError(f"{source}: instance type {it.name!r} is listed twice")
            by_name[it.name] = it
        self._types = ordered
        self._by_name = by_name
        self._region = region
        self._source = source

    @property
    def region(self) -> str:
        """AWS region the prices and spot figures belong to."""
        return self._region

    @property
    def source(self) -> str:
        """Where the catalog was read from, for messages."""
        return self._source

    @property
    def types(self) -> tuple[InstanceType, ...]:
        """Every type, sorted by name (a stable order keeps simulations reproducible)."""
        return self._types

    def names(self) -> tuple[str, ...]:
        """Every type name, sorted."""
        return tuple(self._by_name)

    def get(self, name: str) -> InstanceType:
        """The type called ``name``; ``UnknownInstanceType`` (with suggestions) if none."""
        try:
            return self._by_name[name]
        except KeyError:
            pass
        close = difflib.get_close_matches(name.strip().lower(), self._by_name, n=3, cutoff=0.6)
        raise UnknownInstanceType(name, close, self._region) from None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._by_name

    def __len__(self) -> int:
        return len(self._types)

    def __iter__(self) -> Iterator[InstanceType]:
        return iter(self._types)

    def __repr__(self) -> str:
        return (
            f"Catalog(region={self._region!r}, types={len(self._types)}, source={self._source!r})"
        )


def default_zones(region: str) -> tuple[str, ...]:
    """Three availability zones for ``region`` (``<region>a``, ``b``, ``c``).

    The simulator and the examples need zones but the catalog has no per-zone data; three is
    the smallest count every commercial region offers and what AWS advises spreading over.
    """
    if not region or region != region.strip():
        raise ValueError(f"not a region name: {region!r}")
    return tuple(f"{region}{suffix}" for suffix in "abc")


def load_catalog(path: Path | None = None) -> Catalog:
    """Load a catalog CSV; with no ``path``, the one bundled with spotwright (cached).

    Raises ``CatalogError`` if the file cannot be read or any value in it is invalid.
    """
    if path is None:
        return _bundled_catalog()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogError(f"cannot read instance-type catalog {path}: {exc}") from exc
    return _parse(text, source=str(path))


def write_catalog(
    types: Iterable[InstanceType],
    path: Path | None = None,
    *,
    region: str,
    comments: Sequence[str] = (),
) -> str:
    """The catalog CSV for ``types`` (sorted by name), written to ``path`` if one is given.

    The text has the bundled file's shape: ``comments`` as ``#`` lines, the ``# region:``
    line the loader reads, then the header and one row per type, so ``load_catalog`` reads
    back equal ``InstanceType`` objects.
    """
    if not region or region != region.strip():
        raise ValueError(f"not a region name: {region!r}")
    lines = [f"# {comment}" if comment else "#" for comment in comments]
    lines.append(f"{_REGION_COMMENT} {region}")
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    for it in sorted(types, key=lambda t: t.name):
        alloc = it.allocatable
        writer.writerow(
            (
                it.name,
                it.family,
                it.category,
                it.generation,
                it.size,
                it.vcpu,
                it.memory_mib,
                it.arch,
                it.gpu_count,
                it.gpu_name,
                alloc.cpu,
                alloc.memory // _MIB,
                alloc.gpu,
                alloc.pods,
                alloc.ephemeral // _MIB,
                repr(it.od_price),
                "" if it.spot_savings_pct is None else f"{it.spot_savings_pct:g}",
                "" if it.interruption_band is None else it.interruption_band,
            )
        )
    text = "\n".join(lines) + "\n" + buffer.getvalue()
    if path is not None:
        try:
            Path(path).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise CatalogError(f"cannot write instance-type catalog {path}: {exc}") from exc
    return text


@functools.lru_cache(maxsize=1)
def _bundled_catalog() -> Catalog:
    resource = resources.files("spotwright.catalog").joinpath(_BUNDLED_FILE)
    try:
        text = resource.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:  # pragma: no cover - broken installation
        raise CatalogError(f"cannot read the bundled catalog {resource}: {exc}") from exc
    return _parse(text, source=str(resource))


# --- parsing -------------------------------------------------------------------------------
# Rows are converted in one tight function (_make_type) that just raises ValueError on bad
# input. Only then does _explain re-check the row column by column, with a converter per
# column, to say exactly which value is wrong. Good files never pay for the diagnostics.

#: Columns a catalog file must have, in the order _make_type takes them. The file may order
#: them differently and may carry extra columns, which are ignored.
COLUMNS: Final = (
    "name",
    "family",
    "category",
    "generation",
    "size",
    "vcpu",
    "memory_mib",
    "arch",
    "gpus",
    "gpu_name",
    "alloc_cpu_m",
    "alloc_memory_mib",
    "alloc_gpus",
    "max_pods",
    "alloc_ephemeral_mib",
    "od_usd_hour",
    "spot_savings_pct",
    "spot_band",
)


def _parse(text: str, *, source: str) -> Catalog:
    region = DEFAULT_REGION
    numbered: list[tuple[int, str]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.startswith("#"):
            if line.startswith(_REGION_COMMENT):
                region = line[len(_REGION_COMMENT) :].strip() or region
        elif line.strip():
            numbered.append((lineno, line))
    if not numbered:
        raise CatalogError(f"{source}: no header row; is this an instance-type catalog?")

    reader = csv.reader(line for _, line in numbered)
    header = [column.strip() for column in next(reader)]
    missing = [column for column in COLUMNS if column not in header]
    if missing:
        raise CatalogError(
            f"{source}, line {numbered[0][0]}: header lacks column(s) {', '.join(missing)}"
        )
    positions = [header.index(column) for column in COLUMNS]
    pick = operator.itemgetter(*positions)

    types: list[InstanceType] = []
    seen: dict[str, int] = {}
    for row in reader:
        lineno = numbered[reader.line_num - 1][0]
        if len(row) != len(header):
            raise CatalogError(
                f"{source}, line {lineno}: expected {len(header)} fields, found {len(row)}"
            )
        fields: tuple[str, ...] = pick(row)
        try:
            instance_type = _make_type(*fields)
        except ValueError:
            raise _explain(fields, positions, f"{source}, line {lineno}") from None
        if instance_type.name in seen:
            raise CatalogError(
                f"{source}, line {lineno}: {instance_type.name!r} is already listed"
                f" on line {seen[instance_type.name]}"
            )
        seen[instance_type.name] = lineno
        types.append(instance_type)
    return Catalog(types, region=region, source=source)


def _make_type(
    name: str,
    family: str,
    category: str,
    generation: str,
    size: str,
    vcpu: str,
    memory_mib: str,
    arch: str,
    gpus: str,
    gpu_name: str,
    alloc_cpu_m: str,
    alloc_memory_mib: str,
    alloc_gpus: str,
    max_pods: str,
    alloc_ephemeral_mib: str,
    od_usd_hour: str,
    spot_savings_pct: str,
    spot_band: str,
) -> InstanceType:
    """One row to an InstanceType; ValueError (without detail) on anything invalid."""
    name, family, category, size = name.strip(), family.strip(), category.strip(), size.strip()
    arch, savings_text, band_text = arch.strip(), spot_savings_pct.strip(), spot_band.strip()
    cpus, memory, gpu_count = int(vcpu), int(memory_mib), int(gpus)
    alloc_cpu, alloc_memory, alloc_gpu = int(alloc_cpu_m), int(alloc_memory_mib), int(alloc_gpus)
    pods, ephemeral, gen = int(max_pods), int(alloc_ephemeral_mib), int(generation)
    price = float(od_usd_hour)
    savings = float(savings_text) if savings_text else None
    band = int(band_text) if band_text else None
    if not (
        name
        and family
        and category
        and size
        and arch in _ARCHES
        and gen >= 0
        and 0 < alloc_cpu <= cpus * 1000
        and 0 < alloc_memory <= memory
        and 0 <= alloc_gpu <= gpu_count
        and pods > 0
        and ephemeral >= 0
        and 0 < price < math.inf
        and (savings is None) == (band is None)
        and (savings is None or 0 < savings < 100)
        and (band is None or band in _BANDS)
    ):
        raise ValueError("invalid row")
    return InstanceType(
        name=name,
        family=family,
        category=category,
        generation=gen,
        size=size,
        vcpu=cpus,
        memory_mib=memory,
        arch=arch,
        gpu_count=gpu_count,
        gpu_name=gpu_name.strip(),
        allocatable=Resources(
            cpu=alloc_cpu,
            memory=alloc_memory * _MIB,
            gpu=alloc_gpu,
            pods=pods,
            ephemeral=ephemeral * _MIB,
        ),
        od_price=price,
        spot_savings_pct=savings,
        interruption_band=band,
    )


# Converters for _explain: each turns one stripped field into its value or raises ValueError
# with a short reason; _explain adds the file, line and column.


def _text(field: str) -> str:
    if not field:
        raise ValueError("must not be empty")
    return field


def _any_text(field: str) -> str:
    return field


def _int_at_least(minimum: int) -> Callable[[str], int]:
    def convert(field: str) -> int:
        try:
            value = int(field)
        except ValueError:
            raise ValueError(f"expected a whole number, got {field!r}") from None
        if value < minimum:
            raise ValueError(f"must be at least {minimum}, got {value}")
        return value

    return convert


def _price(field: str) -> float:
    try:
        value = float(field)
    except ValueError:
        raise ValueError(f"expected a price in USD per hour, got {field!r}") from None
    if not 0 < value < math.inf:
        raise ValueError(f"price must be positive, got {field!r}")
    return value


def _arch(field: str) -> str:
    if field not in _ARCHES:
        raise ValueError(f"expected one of {', '.join(sorted(_ARCHES))}, got {field!r}")
    return field


def _savings(field: str) -> float | None:
    if not field:
        return None
    try:
        value = float(field)
    except ValueError:
        raise ValueError(f"expected a percentage, got {field!r}") from None
    if not 0 < value < 100:
        raise ValueError(f"savings must be between 0 and 100 %, got {field!r}")
    return value


def _band(field: str) -> int | None:
    if not field:
        return None
    try:
        value = int(field)
    except ValueError:
        value = -1
    if value not in _BANDS:
        raise ValueError(f"expected an interruption band 0-4, got {field!r}")
    return value


_CONVERTERS: Final[tuple[Callable[[str], object], ...]] = (
    _text,  # name
    _text,  # family
    _text,  # category
    _int_at_least(0),  # generation
    _text,  # size
    _int_at_least(1),  # vcpu
    _int_at_least(1),  # memory_mib
    _arch,  # arch
    _int_at_least(0),  # gpus
    _any_text,  # gpu_name
    _int_at_least(1),  # alloc_cpu_m
    _int_at_least(1),  # alloc_memory_mib
    _int_at_least(0),  # alloc_gpus
    _int_at_least(1),  # max_pods
    _int_at_least(0),  # alloc_ephemeral_mib
    _price,  # od_usd_hour
    _savings,  # spot_savings_pct
    _band,  # spot_band
)


def _explain(fields: Sequence[str], positions: Sequence[int], where: str) -> CatalogError:
    """The error for a row _make_type rejected, naming the first offending column."""

    def error(column: str, reason: str) -> CatalogError:
        index = COLUMNS.index(column)
        return CatalogError(f"{where}, column {positions[index] + 1} ({column}): {reason}")

    values: dict[str, object] = {}
    for column, convert, field in zip(COLUMNS, _CONVERTERS, fields, strict=True):
        try:
            values[column] = convert(field.strip())
        except ValueError as exc:
            return error(column, str(exc))
    # Every field is fine alone, so two of them contradict each other. Allocatable is
    # capacity minus reservations: more than capacity means a corrupt row.
    ints = {column: value for column, value in values.items() if isinstance(value, int)}
    if ints["alloc_cpu_m"] > ints["vcpu"] * 1000:
        return error("alloc_cpu_m", f"{ints['alloc_cpu_m']}m is more than {ints['vcpu']} vCPU")
    if ints["alloc_memory_mib"] > ints["memory_mib"]:
        return error(
            "alloc_memory_mib",
            f"{ints['alloc_memory_mib']} MiB is more than {ints['memory_mib']} MiB",
        )
    if ints["alloc_gpus"] > ints["gpus"]:
        return error("alloc_gpus", f"{ints['alloc_gpus']} is more than {ints['gpus']} GPUs")
    if (values["spot_band"] is None) != (values["spot_savings_pct"] is None):
        return error("spot_band", "spot_savings_pct and spot_band must both be set or both empty")
    return CatalogError(f"{where}: invalid row")  # pragma: no cover - both checks agree
