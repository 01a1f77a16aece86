"""Small builders for scheduling tests: instance types, offerings, pods, pools."""

from __future__ import annotations

from spotwright.catalog._types import InstanceType
from spotwright.model import labels as wk
from spotwright.model.objects import Pod
from spotwright.model.resources import Resources
from spotwright.ports.cloud import Offering

GIB = 2**30
ZONES = ("z-a", "z-b", "z-c")


def itype(
    name: str,
    vcpu: int,
    mem_gib: int,
    price: float,
    *,
    gpu: int = 0,
    arch: str = "amd64",
    category: str = "m",
    pods: int = 110,
) -> InstanceType:
    family, _, size = name.partition(".")
    return InstanceType(
        name=name,
        family=family,
        category=category,
        generation=5,
        size=size or "x",
        vcpu=vcpu,
        memory_mib=mem_gib * 1024,
        arch=arch,
        gpu_count=gpu,
        gpu_name="a10g" if gpu else "",
        allocatable=Resources(
            cpu=vcpu * 1000, memory=mem_gib * GIB, gpu=gpu, pods=pods, ephemeral=100 * GIB
        ),
        od_price=price,
        spot_savings_pct=60.0,
        interruption_band=1,
    )


def offers(
    types: list[InstanceType],
    *,
    zones: tuple[str, ...] = ZONES,
    spot: bool = True,
    on_demand: bool = True,
    spot_factor: float = 0.4,
) -> list[Offering]:
    out = []
    for t in types:
        for z in zones:
            if on_demand:
                out.append(Offering(t.name, z, wk.ON_DEMAND, t.od_price))
            if spot:
                out.append(Offering(t.name, z, wk.SPOT, round(t.od_price * spot_factor, 6)))
    return out


def catalog() -> list[InstanceType]:
    """A small catalog with linear prices in three families and a GPU type."""
    out = []
    for size, n in (("large", 2), ("xlarge", 4), ("2xlarge", 8), ("4xlarge", 16)):
        out.append(itype(f"c5.{size}", n, 2 * n, 0.085 * n / 2, category="c"))
        out.append(itype(f"m5.{size}", n, 4 * n, 0.096 * n / 2))
        out.append(itype(f"r5.{size}", n, 8 * n, 0.126 * n / 2, category="r"))
    out.append(itype("m6g.xlarge", 4, 16, 0.154, arch="arm64"))
    out.append(itype("g5.xlarge", 4, 16, 1.006, gpu=1, category="g"))
    return out


def pod(name: str, cpu: int = 500, mem_gib: float = 1, **kwargs: object) -> Pod:
    return Pod(
        name=name,
        uid=name,
        requests=Resources(cpu=cpu, memory=int(mem_gib * GIB), gpu=int(kwargs.pop("gpu", 0))),  # type: ignore[call-overload]
        **kwargs,  # type: ignore[arg-type]
    )
