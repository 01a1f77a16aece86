"""The overhead model against the bundled catalog, on moto's DescribeInstanceTypes records.

moto ships AWS's DescribeInstanceTypes data as a file; reading it directly keeps this check
offline and fast while covering every type the two sources share.
"""

from __future__ import annotations

import gzip
import json
from importlib import resources
from typing import Any

import pytest

from spotwright.adapters.aws.instance_types import (
    instance_type_from_api,
    max_pods,
    split_name,
)
from spotwright.catalog import load_catalog

#: Types whose ENI figures differ between moto's data and the VPC limits Karpenter's table
#: was generated from (the number of ENIs on the default network card).
ENI_DATA_DIFFERS = {"i7ie.48xlarge", "i7ie.metal-48xl", "i8ge.48xlarge", "i8ge.metal-48xl"}


@pytest.fixture(scope="module")
def moto_records() -> dict[str, Any]:
    data = resources.files("moto.ec2").joinpath("resources/instance_types.json.gz")
    with data.open("rb") as raw:
        return dict(json.loads(gzip.decompress(raw.read())))


def test_allocatable_matches_the_bundled_catalog_for_every_shared_type(
    moto_records: dict[str, Any],
) -> None:
    catalog = load_catalog()
    shared = [name for name in catalog.names() if name in moto_records]
    assert len(shared) > 1200
    mismatches = []
    for name in shared:
        expected = catalog.get(name)
        got = instance_type_from_api(moto_records[name], od_price=expected.od_price)
        assert got is not None, name
        fields = ("family", "category", "generation", "size", "vcpu", "memory_mib", "arch")
        for field in (*fields, "gpu_count", "gpu_name"):
            assert getattr(got, field) == getattr(expected, field), (name, field)
        if got.allocatable != expected.allocatable:
            mismatches.append(name)
    assert set(mismatches) == ENI_DATA_DIFFERS


def test_unusable_types_are_left_out(moto_records: dict[str, Any]) -> None:
    for name in ("inf2.xlarge", "trn1.2xlarge", "mac1.metal"):
        assert instance_type_from_api(moto_records[name], od_price=1.0) is None, name
    assert instance_type_from_api(moto_records["m5.large"], od_price=0.0) is None


def test_names_and_pods() -> None:
    assert split_name("c7i-flex.large") == ("c7i-flex", "c", 7, "large")
    assert split_name("u-6tb1.metal") == ("u-6tb1", "u", 0, "metal")
    with pytest.raises(ValueError):
        split_name("nodot")
    record = {
        "NetworkInfo": {
            "MaximumNetworkInterfaces": 64,
            "Ipv4AddressesPerInterface": 50,
            "DefaultNetworkCardIndex": 0,
            "NetworkCards": [
                {"NetworkCardIndex": 0, "MaximumNetworkInterfaces": 2},
                {"NetworkCardIndex": 1, "MaximumNetworkInterfaces": 2},
            ],
        }
    }
    assert max_pods(record) == 2 * 49 + 2  # only the default card's ENIs carry pods
