"""From a DescribeInstanceTypes record to the ``InstanceType`` the scheduler reasons about.

The bundled catalog carries allocatable figures computed by Karpenter's overhead model for
AL2023 nodes. Live discovery and ``spotwright catalog refresh`` must produce the same figures
for the same type, or a node would be packed differently in the EC2 world than in a
simulation, so the model is reimplemented here from its published rules:

* pods: ENI-limited, ``ENIs x (IPv4 addresses per ENI - 1) + 2``, with the ENI count of the
  default network card (multi-card types such as p5 only use card 0 for pods);
* CPU reserved for the kubelet: 6 % of the first core, 1 % of the second, 0.5 % of the next
  two and 0.25 % of every further core;
* memory: 7.5 % of capacity (rounded up) is lost to the hypervisor, then the kubelet
  reserves 11 MiB per pod plus 255 MiB, and the hard eviction threshold keeps 100 MiB;
* arm64 types keep another 59 MiB. This one is calibrated, not derived: Karpenter's
  generated table shows exactly 59 MiB less on every arm64 type and on no amd64 one;
* ephemeral storage: 17 GiB of the default 20 GiB root volume.

``tests/aws`` checks these rules against every type the bundled catalog and moto share.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Final

from spotwright.catalog._types import InstanceType
from spotwright.model.resources import Resources

__all__ = [
    "ARCHITECTURES",
    "allocatable",
    "instance_type_from_api",
    "max_pods",
    "split_name",
]

#: EC2 architecture names to Kubernetes ones; others (i386, the mac variants) are skipped.
ARCHITECTURES: Final = {"x86_64": "amd64", "arm64": "arm64"}

VM_MEMORY_OVERHEAD: Final = 0.075
EVICTION_HARD_MIB: Final = 100
KUBE_RESERVED_MIB_PER_POD: Final = 11
KUBE_RESERVED_MIB_BASE: Final = 255
ARM64_EXTRA_RESERVED_MIB: Final = 59
EPHEMERAL_MIB: Final = 17408
_MIB: Final = 2**20

_FAMILY = re.compile(r"^([a-z]+)(\d+)?")
#: Record keys that mean the type carries an accelerator spotwright has no resource for.
_EXOTIC_KEYS: Final = ("NeuronInfo", "InferenceAcceleratorInfo", "FpgaInfo", "MediaAcceleratorInfo")


def split_name(name: str) -> tuple[str, str, int, str]:
    """``c7i-flex.large`` -> (family ``c7i-flex``, category ``c``, generation 7, size ``large``).

    The category is the leading letters of the family and the generation the digits after
    them (0 when there are none, as for ``u-6tb1``'s siblings without a number).
    """
    family, _, size = name.partition(".")
    if not family or not size:
        raise ValueError(f"not an instance type name: {name!r}")
    match = _FAMILY.match(family)
    if match is None:
        raise ValueError(f"not an instance type name: {name!r}")
    category = match.group(1)
    generation = int(match.group(2)) if match.group(2) else 0
    return family, category, generation, size


def max_pods(record: Mapping[str, Any]) -> int:
    """The ENI-limited pod count of a DescribeInstanceTypes record."""
    network = record.get("NetworkInfo", {})
    per_eni = int(network.get("Ipv4AddressesPerInterface", 0))
    enis = int(network.get("MaximumNetworkInterfaces", 0))
    default_card = network.get("DefaultNetworkCardIndex", 0)
    for card in network.get("NetworkCards", ()):
        if card.get("NetworkCardIndex") == default_card:
            enis = int(card.get("MaximumNetworkInterfaces", enis))
            break
    if enis <= 0 or per_eni <= 1:
        return 0
    return enis * (per_eni - 1) + 2


def _cpu_reserved_millis(vcpu: int) -> int:
    reserved = 0.0
    for core in range(vcpu):
        if core == 0:
            reserved += 60
        elif core == 1:
            reserved += 10
        elif core < 4:
            reserved += 5
        else:
            reserved += 2.5
    return math.ceil(reserved)


def allocatable(
    vcpu: int, memory_mib: int, pods: int, nvidia_gpus: int, arch: str = "amd64"
) -> Resources:
    """What pods can use on a node of this shape (see the module docstring)."""
    memory = memory_mib - math.ceil(memory_mib * VM_MEMORY_OVERHEAD)
    memory -= KUBE_RESERVED_MIB_PER_POD * pods + KUBE_RESERVED_MIB_BASE + EVICTION_HARD_MIB
    if arch == "arm64":
        memory -= ARM64_EXTRA_RESERVED_MIB
    return Resources(
        cpu=vcpu * 1000 - _cpu_reserved_millis(vcpu),
        memory=memory * _MIB,
        gpu=nvidia_gpus,
        pods=pods,
        ephemeral=EPHEMERAL_MIB * _MIB,
    )


def _gpus(record: Mapping[str, Any]) -> tuple[int, int, str]:
    """(all GPUs, NVIDIA GPUs, GPU name in Karpenter's lower-kebab form)."""
    gpus = record.get("GpuInfo", {}).get("Gpus") or []
    total = sum(int(g.get("Count", 0)) for g in gpus)
    nvidia = sum(int(g.get("Count", 0)) for g in gpus if g.get("Manufacturer") == "NVIDIA")
    name = ""
    if gpus:
        name = re.sub(r"\s+", "-", str(gpus[0].get("Name", "")).strip().lower())
    return total, nvidia, name


def instance_type_from_api(
    record: Mapping[str, Any],
    *,
    od_price: float,
    spot_savings_pct: float | None = None,
    interruption_band: int | None = None,
) -> InstanceType | None:
    """The ``InstanceType`` for one DescribeInstanceTypes record, or None if unusable.

    Unusable means spotwright cannot run Kubernetes nodes of it: no Linux architecture it
    knows, an accelerator without a resource name (Neuron, Inferentia, FPGA), no ENI data,
    or no price. Spot figures are optional and must be given together.
    """
    name = str(record.get("InstanceType", ""))
    arches = [
        ARCHITECTURES[a]
        for a in record.get("ProcessorInfo", {}).get("SupportedArchitectures", ())
        if a in ARCHITECTURES
    ]
    if not name or not arches or any(key in record for key in _EXOTIC_KEYS):
        return None
    if not od_price > 0:
        return None
    try:
        family, category, generation, size = split_name(name)
    except ValueError:
        return None
    vcpu = int(record.get("VCpuInfo", {}).get("DefaultVCpus", 0))
    memory_mib = int(record.get("MemoryInfo", {}).get("SizeInMiB", 0))
    pods = max_pods(record)
    gpu_count, nvidia, gpu_name = _gpus(record)
    if vcpu <= 0 or memory_mib <= 0 or pods <= 0:
        return None
    resources = allocatable(vcpu, memory_mib, pods, nvidia, arches[0])
    if resources.memory <= 0:
        return None
    if (spot_savings_pct is None) != (interruption_band is None):
        spot_savings_pct = interruption_band = None
    return InstanceType(
        name=name,
        family=family,
        category=category,
        generation=generation,
        size=size,
        vcpu=vcpu,
        memory_mib=memory_mib,
        arch=arches[0],
        gpu_count=gpu_count,
        gpu_name=gpu_name,
        allocatable=resources,
        od_price=od_price,
        spot_savings_pct=spot_savings_pct,
        interruption_band=interruption_band,
    )
