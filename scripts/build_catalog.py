#!/usr/bin/env python3
"""Build spotwright's bundled instance-type catalog from the shared source data.

The raw sources are large (1,363 types x 32 columns of specs, a 900 KB JSON feed covering 33
regions) and most of their columns mean nothing to a scheduler. The runtime should not parse
them on every start, nor depend on where they live, so this script distils them once into a
small CSV that ships inside the package (``src/spotwright/catalog/instance-types.csv``) and
that ``spotwright.catalog.load_catalog`` reads in a few milliseconds.

Output is deterministic: rows are sorted by name, numbers are copied verbatim or written as
integers, and the header states only source revisions and source dates (never "now"), so
re-running the script on the same inputs reproduces the checked-in file byte for byte. A
test relies on that.

Usage::

    python scripts/build_catalog.py [--data DIR] [--out FILE]

See ``src/spotwright/catalog/SOURCES.md`` for what every column means and the licences.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
DEFAULT_OUT = ROOT / "src" / "spotwright" / "catalog" / "instance-types.csv"

REGION = "us-east-1"
SPECS_FILE = "ec2-instance-types-karpenter.csv"
PRICES_FILE = "ec2-ondemand-linux-us-east-1-karpenter.csv"
ADVISOR_FILE = "spot-advisor-data-2025-06-28.json"
ADVISOR_DATE = "2025-06-28"

# Provenance of the inputs, written into the output header. These describe the files in the
# shared data folder (see its SOURCES.md); update them together with the data.
KARPENTER_REPO = "aws/karpenter-provider-aws"
KARPENTER_COMMIT = "1d927085dd81"
KARPENTER_DOC = "website/content/en/docs/reference/instance-types.md"
KARPENTER_PRICING = "pkg/providers/pricing/zz_generated.pricing_aws.go"
P3_COMMIT = "0c5e7d811240"
ADVISOR_REPO = "alexei-led/spotinfo"
ADVISOR_COMMIT = "05e93313"

#: Categories kept. General purpose, compute, memory, burstable, GPU, storage and
#: high-frequency types are what Kubernetes node pools use. Inferentia/Trainium (``inf``,
#: ``trn``) are left out on purpose: their Neuron devices have no field in ``Resources``,
#: so the scheduler would treat them as expensive plain-CPU nodes.
CATEGORIES = frozenset({"c", "m", "r", "t", "g", "p", "i", "d", "x", "z"})

#: The p3 family (V100) is still sold and priced in us-east-1, but the Karpenter document the
#: shared specs file was parsed from no longer lists it. These three rows are copied from the
#: same generated document at an earlier revision (``P3_COMMIT``), computed with the same
#: overhead model (AL2023, no block device mappings); p3dn.24xlarge, present in both
#: revisions, has identical figures in each. The price comes from the shared price file.
P3_SUPPLEMENT: tuple[Mapping[str, str], ...] = tuple(
    {
        "instance_type": f"p3.{size}",
        "family": "p3",
        "category": "p",
        "generation": "3",
        "size": size,
        "vcpu": vcpu,
        "memory_mib": memory,
        "arch": "amd64",
        "gpu_count": gpus,
        "gpu_name": "v100",
        "alloc_cpu_millicores": cpu_m,
        "alloc_memory_mib": alloc_mem,
        "max_pods": pods,
        "alloc_ephemeral_storage": "17Gi",
        "alloc_nvidia_gpu": gpus,
    }
    for size, vcpu, memory, gpus, cpu_m, alloc_mem, pods in (
        ("2xlarge", "8", "62464", "1", "7910", "56786", "58"),
        ("8xlarge", "32", "249856", "4", "31850", "228187", "234"),
        ("16xlarge", "64", "499712", "8", "63770", "459304", "234"),
    )
)

# The column layout is the loader's: one definition, so the two cannot drift apart.
try:
    from spotwright.catalog._loading import COLUMNS
except ImportError:  # run from a clone without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from spotwright.catalog._loading import COLUMNS

_EPHEMERAL_UNITS = {"Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}


class BuildError(Exception):
    """The source data broke an assumption; the message says which type and field."""


def _int(row: Mapping[str, str], key: str, *, default: int | None = None) -> int:
    text = (row.get(key) or "").strip()
    if not text and default is not None:
        return default
    try:
        return int(text)
    except ValueError:
        raise BuildError(f"{row.get('instance_type')}: {key}={text!r} is not an integer") from None


def _price(row: Mapping[str, str], key: str) -> str | None:
    """The price text as published (kept verbatim so no float formatting drifts in)."""
    text = (row.get(key) or "").strip()
    if not text:
        return None
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise BuildError(f"{row.get('instance_type')}: {key}={text!r} is not a price") from None
    if value <= 0:
        raise BuildError(f"{row.get('instance_type')}: {key}={text!r} is not positive")
    return text


def _ephemeral_mib(row: Mapping[str, str]) -> int:
    text = (row.get("alloc_ephemeral_storage") or "").strip()
    for suffix, factor in _EPHEMERAL_UNITS.items():
        if text.endswith(suffix) and text[: -len(suffix)].isdigit():
            return int(text[: -len(suffix)]) * factor
    raise BuildError(f"{row.get('instance_type')}: alloc_ephemeral_storage={text!r} not understood")


def read_prices(path: Path) -> tuple[dict[str, str], str]:
    """On-demand Linux prices for REGION, and the pricing file's generation timestamp."""
    prices: dict[str, str] = {}
    stamps: set[str] = set()
    with path.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if row["region"] != REGION:
                continue
            price = _price(row, "od_price_usd_hr")
            if price is not None:
                prices[row["instance_type"]] = price
            stamps.add(row["generated_at"])
    if len(stamps) != 1:
        raise BuildError(f"{path.name}: expected one generated_at stamp, found {sorted(stamps)}")
    return prices, stamps.pop()


def read_advisor(path: Path) -> dict[str, tuple[int, int]]:
    """(savings %, interruption band) per type for REGION/Linux.

    Entries with ``s <= 0`` are placeholders in the feed (a 0 % saving next to a band), so
    they are dropped: spotwright then treats the type as not offered as spot.
    """
    feed = json.loads(path.read_text(encoding="utf-8"))
    bands = {entry["index"] for entry in feed["ranges"]}
    out: dict[str, tuple[int, int]] = {}
    for name, entry in feed["spot_advisor"][REGION]["Linux"].items():
        savings, band = int(entry["s"]), int(entry["r"])
        if savings <= 0:
            continue
        if band not in bands or not 0 < savings < 100:
            raise BuildError(f"{path.name}: {name} has s={savings} r={band}")
        out[name] = (savings, band)
    return out


def _row(spec: Mapping[str, str], price: str, spot: tuple[int, int] | None) -> dict[str, str | int]:
    """One output row, after checking the invariants the runtime relies on."""
    name = spec["instance_type"]
    vcpu, memory = _int(spec, "vcpu"), _int(spec, "memory_mib")
    alloc_cpu, alloc_mem = _int(spec, "alloc_cpu_millicores"), _int(spec, "alloc_memory_mib")
    if not 0 < alloc_cpu < vcpu * 1000 or not 0 < alloc_mem < memory:
        raise BuildError(f"{name}: allocatable is not below capacity")
    gpus = _int(spec, "gpu_count", default=0)
    alloc_gpus = _int(spec, "alloc_nvidia_gpu", default=0)
    if alloc_gpus > gpus:
        raise BuildError(f"{name}: more allocatable GPUs than GPUs")
    return {
        "name": name,
        "family": spec["family"],
        "category": spec["category"],
        "generation": _int(spec, "generation"),
        "size": spec["size"],
        "vcpu": vcpu,
        "memory_mib": memory,
        "arch": spec["arch"],
        "gpus": gpus,
        "gpu_name": spec.get("gpu_name") or "",
        "alloc_cpu_m": alloc_cpu,
        "alloc_memory_mib": alloc_mem,
        "alloc_gpus": alloc_gpus,
        "max_pods": _int(spec, "max_pods"),
        "alloc_ephemeral_mib": _ephemeral_mib(spec),
        "od_usd_hour": price,
        "spot_savings_pct": spot[0] if spot else "",
        "spot_band": spot[1] if spot else "",
    }


def build_rows(
    specs: Iterable[Mapping[str, str]],
    prices: Mapping[str, str],
    advisor: Mapping[str, tuple[int, int]],
) -> list[dict[str, str | int]]:
    """Select, join and validate; rows come back sorted by type name."""
    rows: dict[str, dict[str, str | int]] = {}
    for spec in (*specs, *P3_SUPPLEMENT):
        name = spec["instance_type"]
        if spec["category"] not in CATEGORIES:
            continue
        listed = _price(spec, "od_price_usd_hr_us_east_1")
        price = prices.get(name)
        if listed is not None and price is not None and Decimal(listed) != Decimal(price):
            raise BuildError(f"{name}: price {listed} in {SPECS_FILE} but {price} in {PRICES_FILE}")
        price = listed or price
        if price is None:
            continue  # not sold in the region: a catalog entry could never be launched
        if name in rows:
            raise BuildError(f"{name}: listed twice")
        rows[name] = _row(spec, price, advisor.get(name))
    return [rows[name] for name in sorted(rows)]


def render(rows: list[dict[str, str | int]], *, prices_stamp: str) -> str:
    """The CSV text: provenance comment lines, a header row, then one row per type."""
    header = [
        "# spotwright instance-type catalog. Generated by scripts/build_catalog.py: do not edit.",
        f"# region: {REGION}",
        f"# specs, allocatable: {KARPENTER_REPO}@{KARPENTER_COMMIT} {KARPENTER_DOC}"
        f" (AL2023; p3 rows from @{P3_COMMIT}) - Apache-2.0",
        f"# on-demand USD/hour: {KARPENTER_REPO}@{KARPENTER_COMMIT} {KARPENTER_PRICING}"
        f" (generated {prices_stamp}) - Apache-2.0",
        f"# spot savings and band: AWS Spot Instance Advisor feed of {ADVISOR_DATE}"
        f" (copy in {ADVISOR_REPO}@{ADVISOR_COMMIT}) - AWS data, no stated licence",
        f"# {len(rows)} types; columns are described in SOURCES.md",
    ]
    buffer = io.StringIO()
    buffer.write("\n".join(header) + "\n")
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def build(data: Path) -> str:
    """Read the three source files under ``data`` and return the catalog text."""
    with (data / SPECS_FILE).open(newline="", encoding="utf-8") as handle:
        specs = list(csv.DictReader(handle))
    prices, stamp = read_prices(data / PRICES_FILE)
    advisor = read_advisor(data / ADVISOR_FILE)
    return render(build_rows(specs, prices, advisor), prices_stamp=stamp)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="shared data folder")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="catalog CSV to write")
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        parser.error(f"data folder {args.data} does not exist (pass --data DIR)")
    try:
        text = build(args.data)
    except (BuildError, KeyError, OSError, ValueError) as exc:
        print(f"build_catalog: {exc}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8", newline="") as handle:
        handle.write(text)
    rows = sum(1 for line in text.splitlines() if not line.startswith("#")) - 1  # header row
    print(f"wrote {rows} instance types to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
