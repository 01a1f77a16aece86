"""The bundled instance-type catalog: the types users name are there, the facts are right,
mistakes are reported helpfully, and the checked-in CSV is exactly what the build script
makes from the shared source data."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spotwright.catalog import (
    DEFAULT_REGION,
    PRICED_REGIONS,
    Catalog,
    CatalogError,
    InstanceType,
    UnknownInstanceType,
    default_zones,
    load_catalog,
)
from spotwright.model import labels as wk
from spotwright.model.resources import Resources

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "build_catalog.py"
BUNDLED = REPO / "src" / "spotwright" / "catalog" / "instance-types.csv"
SHARED_DATA = REPO.parent / "shared" / "data"
MIB = 2**20

needs_shared_data = pytest.mark.skipif(
    not (SHARED_DATA / "ec2-instance-types-karpenter.csv").is_file(),
    reason=f"source data folder {SHARED_DATA} is not present (it sits beside the repository)",
)

#: Sizes AWS sells for the families people most often put in NodePools. Written out by hand
#: (not read from the data) so that a build that silently drops rows fails here.
EXPECTED_SIZES = {
    "m5": "large xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge 24xlarge metal",
    "r5": "large xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge 24xlarge metal",
    "c5": "large xlarge 2xlarge 4xlarge 9xlarge 12xlarge 18xlarge 24xlarge metal",
    "c6i": "large xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge 24xlarge 32xlarge metal",
    "m6i": "large xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge 24xlarge 32xlarge metal",
    "r6i": "large xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge 24xlarge 32xlarge metal",
    "m5a": "large xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge 24xlarge",
    "m6g": "medium large xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge metal",
    "t3": "nano micro small medium large xlarge 2xlarge",
    "t3a": "nano micro small medium large xlarge 2xlarge",
    "g4dn": "xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge metal",
    "g5": "xlarge 2xlarge 4xlarge 8xlarge 12xlarge 16xlarge 24xlarge 48xlarge",
    "p3": "2xlarge 8xlarge 16xlarge",
}


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


# --- what is in it ---------------------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(EXPECTED_SIZES))
def test_every_size_of_common_families_is_present(catalog: Catalog, family: str) -> None:
    expected = {f"{family}.{size}" for size in EXPECTED_SIZES[family].split()}
    assert expected - set(catalog.names()) == set()


@pytest.mark.parametrize(
    "name",
    ["m5.large", "c6i.xlarge", "r5.2xlarge", "t3.medium", "g4dn.xlarge", "g5.xlarge", "p3.2xlarge"],
)
def test_names_users_write_resolve(catalog: Catalog, name: str) -> None:
    assert name in catalog
    assert catalog.get(name).name == name


def test_catalog_is_us_east_1_and_sorted(catalog: Catalog) -> None:
    assert catalog.region == DEFAULT_REGION == "us-east-1"
    assert PRICED_REGIONS == ("us-east-1",)
    names = catalog.names()
    assert list(names) == sorted(names)
    assert len(set(names)) == len(names) == len(catalog) == len(catalog.types)
    assert [it.name for it in catalog] == list(names)
    assert len(catalog) > 1000
    assert all(isinstance(it, InstanceType) for it in catalog.types)


def test_only_the_intended_categories(catalog: Catalog) -> None:
    assert {it.category for it in catalog} == set("cmrtgpidxz")


def test_bundled_catalog_is_cached_and_same_as_reading_the_file(catalog: Catalog) -> None:
    assert load_catalog() is catalog
    from_file = load_catalog(BUNDLED)
    assert from_file is not catalog
    assert from_file.types == catalog.types


# --- known facts (values from the Karpenter reference and AWS price list) --------------------


def test_m5_large_facts(catalog: Catalog) -> None:
    it = catalog.get("m5.large")
    assert (it.family, it.category, it.generation, it.size) == ("m5", "m", 5, "large")
    assert (it.vcpu, it.memory_mib, it.arch) == (2, 8192, "amd64")
    assert (it.gpu_count, it.gpu_name) == (0, "")
    assert it.od_price == pytest.approx(0.096)
    assert it.allocatable == Resources(
        cpu=1930, memory=6903 * MIB, gpu=0, pods=29, ephemeral=17 * 2**30
    )
    assert (it.spot_savings_pct, it.interruption_band) == (66.0, 3)
    assert it.spot_price == pytest.approx(0.096 * 0.34)


def test_gpu_types(catalog: Catalog) -> None:
    g4dn = catalog.get("g4dn.xlarge")
    assert (g4dn.gpu_count, g4dn.gpu_name, g4dn.allocatable.gpu) == (1, "t4", 1)
    assert (g4dn.vcpu, g4dn.memory_mib) == (4, 16384)
    assert g4dn.od_price == pytest.approx(0.526)
    g5 = catalog.get("g5.12xlarge")
    assert (g5.gpu_count, g5.gpu_name, g5.allocatable.gpu) == (4, "a10g", 4)
    p3 = catalog.get("p3.2xlarge")
    assert (p3.vcpu, p3.memory_mib, p3.gpu_count, p3.gpu_name) == (8, 62464, 1, "v100")
    assert p3.od_price == pytest.approx(3.06)
    assert catalog.get("p3.16xlarge").allocatable.gpu == 8
    assert catalog.get("m5.large").allocatable.gpu == 0


def test_burstable_and_arm_types(catalog: Catalog) -> None:
    t3 = catalog.get("t3.medium")
    assert (t3.vcpu, t3.memory_mib, t3.allocatable.pods) == (2, 4096, 17)
    assert t3.od_price == pytest.approx(0.0416)
    assert catalog.get("m6g.large").arch == "arm64"
    assert catalog.get("c6i.xlarge").arch == "amd64"


def test_well_known_labels_are_precomputed(catalog: Catalog) -> None:
    labels = catalog.get("g4dn.xlarge").labels
    assert labels[wk.INSTANCE_TYPE] == "g4dn.xlarge"
    assert labels[wk.INSTANCE_FAMILY] == "g4dn"
    assert labels[wk.INSTANCE_CPU] == "4"
    assert labels[wk.INSTANCE_MEMORY] == "16384"
    assert labels[wk.INSTANCE_GPU_NAME] == "t4"
    assert labels[wk.ARCH] == "amd64"
    assert wk.INSTANCE_GPU_NAME not in catalog.get("m5.large").labels


# --- invariants every row must satisfy -------------------------------------------------------


def test_allocatable_is_strictly_below_capacity(catalog: Catalog) -> None:
    for it in catalog:
        alloc = it.allocatable
        assert 0 < alloc.cpu < it.vcpu * 1000, it.name
        assert 0 < alloc.memory < it.memory_mib * MIB, it.name
        assert 0 <= alloc.gpu <= it.gpu_count, it.name
        assert alloc.pods > 0 and alloc.ephemeral > 0, it.name


def test_spot_figures_are_consistent(catalog: Catalog) -> None:
    with_spot = [it for it in catalog if it.spot_price is not None]
    assert len(with_spot) > 500
    for it in catalog:
        assert it.od_price > 0, it.name
        assert (it.spot_savings_pct is None) == (it.interruption_band is None), it.name
        if it.spot_price is not None:
            assert 0 < it.spot_price < it.od_price, it.name
            assert it.interruption_band in range(5), it.name


# --- mistakes ----------------------------------------------------------------------------------


def test_unknown_type_suggests_close_names(catalog: Catalog) -> None:
    with pytest.raises(UnknownInstanceType) as caught:
        catalog.get("m5.larg")
    error = caught.value
    assert isinstance(error, KeyError) and isinstance(error, CatalogError)
    assert error.name == "m5.larg"
    assert "m5.large" in error.suggestions
    assert "'m5.larg'" in str(error) and "did you mean" in str(error) and "m5.large" in str(error)
    assert "m5.larg" not in catalog
    assert 42 not in catalog


def test_unknown_type_with_wrong_case_still_gets_a_suggestion(catalog: Catalog) -> None:
    with pytest.raises(KeyError, match=r"g4dn\.xlarge"):
        catalog.get("G4DN.XLARGE")


def test_nonsense_name_has_no_suggestion(catalog: Catalog) -> None:
    with pytest.raises(UnknownInstanceType) as caught:
        catalog.get("definitely-not-a-type")
    assert caught.value.suggestions == ()
    assert "did you mean" not in str(caught.value)


def _bundled_lines() -> list[str]:
    return BUNDLED.read_text(encoding="utf-8").splitlines()


def _first_row_index(lines: list[str]) -> int:
    header = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    return header + 1


def test_malformed_value_names_file_line_and_column(tmp_path: Path) -> None:
    lines = _bundled_lines()
    row = _first_row_index(lines) + 2  # 0-based index of the third type
    fields = lines[row].split(",")
    fields[5] = "two"  # vcpu
    lines[row] = ",".join(fields)
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(CatalogError) as caught:
        load_catalog(bad)
    message = str(caught.value)
    assert str(bad) in message
    assert f"line {row + 1}" in message
    assert "column 6 (vcpu)" in message and "'two'" in message


def test_contradictory_row_names_the_column(tmp_path: Path) -> None:
    lines = _bundled_lines()
    header = lines[_first_row_index(lines) - 1].split(",")
    bad = tmp_path / "bad.csv"
    row = dict.fromkeys(header, "")
    row.update(name="x1.big", family="x1", category="x", generation="1", size="big")
    row.update(vcpu="2", memory_mib="1024", arch="amd64", gpus="0", alloc_cpu_m="1000")
    row.update(alloc_memory_mib="2048", alloc_gpus="0", max_pods="10", alloc_ephemeral_mib="0")
    row.update(od_usd_hour="0.1")
    bad.write_text(",".join(header) + "\n" + ",".join(row[h] for h in header) + "\n")
    with pytest.raises(CatalogError, match=r"line 2, column \d+ \(alloc_memory_mib\)"):
        load_catalog(bad)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "no header row"),
        ("# only a comment\n", "no header row"),
        ("name,vcpu\nm5.large,2\n", "line 1: header lacks column"),
    ],
)
def test_files_that_are_not_catalogs(tmp_path: Path, text: str, expected: str) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(text, encoding="utf-8")
    with pytest.raises(CatalogError, match=expected):
        load_catalog(bad)


def test_wrong_field_count_and_duplicates_are_reported(tmp_path: Path) -> None:
    lines = _bundled_lines()
    first = _first_row_index(lines)
    short = tmp_path / "short.csv"
    short.write_text("\n".join([*lines[:first], lines[first] + ",extra"]) + "\n")
    with pytest.raises(CatalogError, match=rf"line {first + 1}: expected 18 fields, found 19"):
        load_catalog(short)
    twice = tmp_path / "twice.csv"
    twice.write_text("\n".join([*lines[:first], lines[first], lines[first]]) + "\n")
    with pytest.raises(CatalogError, match=rf"already listed on line {first + 1}"):
        load_catalog(twice)


def test_missing_file_is_a_catalog_error(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match=r"nope\.csv"):
        load_catalog(tmp_path / "nope.csv")


def test_a_trimmed_catalog_can_be_loaded(tmp_path: Path) -> None:
    lines = _bundled_lines()
    first = _first_row_index(lines)
    wanted = [line for line in lines[first:] if line.startswith(("m5.large,", "t3.medium,"))]
    small = tmp_path / "small.csv"
    small.write_text("# region: eu-west-1\n" + lines[first - 1] + "\n" + "\n".join(wanted))
    trimmed = load_catalog(small)
    assert trimmed.names() == ("m5.large", "t3.medium")
    assert trimmed.region == "eu-west-1"
    assert trimmed.get("m5.large") == load_catalog().get("m5.large")


# --- zones and speed ---------------------------------------------------------------------------


def test_default_zones() -> None:
    assert default_zones("us-east-1") == ("us-east-1a", "us-east-1b", "us-east-1c")
    assert default_zones("eu-west-2") == ("eu-west-2a", "eu-west-2b", "eu-west-2c")
    with pytest.raises(ValueError):
        default_zones("")


@pytest.mark.bench
def test_bench_catalog_load(benchmark: Any) -> None:
    """Loading speed is a benchmark (figures printed with --benchmark-only), not a test."""
    catalog = benchmark(load_catalog, BUNDLED)  # an explicit path bypasses the cache
    assert len(catalog) > 1000


# --- the checked-in file matches its sources ---------------------------------------------------


@needs_shared_data
def test_build_script_reproduces_the_checked_in_csv(tmp_path: Path) -> None:
    out = tmp_path / "instance-types.csv"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--data", str(SHARED_DATA), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert out.read_bytes() == BUNDLED.read_bytes(), (
        "instance-types.csv is stale: run `python scripts/build_catalog.py` and commit it"
    )


@needs_shared_data
def test_every_priced_type_of_the_common_families_is_included(catalog: Catalog) -> None:
    with (SHARED_DATA / "ec2-instance-types-karpenter.csv").open(newline="") as handle:
        source = list(csv.DictReader(handle))
    wanted = {
        row["instance_type"]
        for row in source
        if row["od_price_usd_hr_us_east_1"]
        and (row["category"] in {"c", "m", "r"} or row["family"] in {"t3", "g4dn", "g5"})
    }
    assert len(wanted) > 1000
    assert wanted - set(catalog.names()) == set()
