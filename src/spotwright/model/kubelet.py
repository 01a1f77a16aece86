"""An EC2NodeClass's ``spec.kubelet`` block, and what it leaves pods on a node.

The block is Karpenter's (``karpenter.k8s.aws/v1``) field for field, validated as its CRD
does, because a class that Karpenter refuses should not boot here either. Several of its
settings shrink what a node offers pods: ``maxPods`` and ``podsPerCore`` cap the pod
slots, ``kubeReserved``, ``systemReserved`` and the ``memory.available`` and
``nodefs.available`` eviction thresholds are taken off capacity. The scheduler must place
pods by the same figures the kubelet will enforce, or it plans nodes whose pods the
kubelet then refuses; ``allocatable`` computes them from a catalog entry.

The catalog's allocatable already carries Karpenter's defaults (AL2023, kube-reserved
from the ENI pod count, ``memory.available<100Mi``, ``nodefs.available<10%`` of a 20 GiB
root volume, 7.5 % VM memory overhead). ``allocatable`` recomputes those defaults and
the class's figures and applies the difference, so a class without a kubelet block, or
with one that only repeats the defaults, leaves the catalog's figures exactly as they are.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated

from pydantic import Field, Strict, field_validator, model_validator

from spotwright.model.durations import parse_duration
from spotwright.model.errors import show
from spotwright.model.fields import ConfigModel
from spotwright.model.resources import Resources, parse_cpu, parse_memory, parse_quantity

if TYPE_CHECKING:  # the catalog imports the model package, which imports this module
    from spotwright.catalog._types import InstanceType

__all__ = [
    "EVICTION_SIGNALS",
    "KubeletConfiguration",
    "allocatable",
    "for_kubelet",
    "pod_slots",
]

StrictInt = Annotated[int, Strict()]

EVICTION_SIGNALS = frozenset(
    {
        "memory.available",
        "nodefs.available",
        "nodefs.inodesFree",
        "imagefs.available",
        "imagefs.inodesFree",
        "pid.available",
    }
)
_RESERVED_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage", "pid"})
_PERCENT = re.compile(r"^(\d+(\.\d+)?)%$")
_GO_DURATION = re.compile(r"^(\d+(\.\d+)?(h|m|s|ms))+$")

_MIB = 1 << 20
#: Karpenter's assumptions behind the catalog's allocatable (see the module doc).
_ROOT_VOLUME = 20 * 1024 * _MIB
_DEFAULT_KUBE_EPHEMERAL = 1024 * _MIB
_DEFAULT_MEMORY_EVICTION = 100 * _MIB
_DEFAULT_NODEFS_PERCENT = 10.0
_VM_MEMORY_OVERHEAD = 0.075


def _reserved(values: dict[str, str]) -> dict[str, str]:
    for key, quantity in values.items():
        if key not in _RESERVED_RESOURCES:
            listed = ", ".join(sorted(_RESERVED_RESOURCES))
            raise ValueError(f"expected a reservable resource ({listed}), got {show(key)}")
        try:
            parse_quantity(quantity)
        except (ValueError, TypeError):
            raise ValueError(
                f"expected a quantity that is not negative (like 100m, 1Gi) for {key}, "
                f"got {show(quantity)}"
            ) from None
    return values


def _signal(signal: str) -> None:
    if signal not in EVICTION_SIGNALS:
        listed = ", ".join(sorted(EVICTION_SIGNALS))
        raise ValueError(f"expected an eviction signal ({listed}), got {show(signal)}")


def _thresholds(values: dict[str, str]) -> dict[str, str]:
    for signal, threshold in values.items():
        _signal(signal)
        wrong = f"expected a threshold like 100Mi or 10% for {signal}, got {show(threshold)}"
        if not isinstance(threshold, str):
            raise ValueError(wrong)
        percent = _PERCENT.match(threshold)
        if percent is not None:
            if float(percent[1]) > 100:
                raise ValueError(
                    f"expected a percentage from 0% to 100% for {signal}, got {threshold}"
                )
            continue
        try:
            parse_quantity(threshold)
        except ValueError:
            raise ValueError(wrong) from None
    return values


def _grace_periods(values: dict[str, str]) -> dict[str, str]:
    for signal, period in values.items():
        _signal(signal)
        wrong = f"expected a duration like 1m or 1m30s for {signal}, got {show(period)}"
        if not isinstance(period, str) or not _GO_DURATION.match(period):
            raise ValueError(wrong)
        try:
            parse_duration(period)
        except ValueError:
            raise ValueError(wrong) from None
    return values


class KubeletConfiguration(ConfigModel):
    """The kubelet settings a class gives its nodes (Karpenter's subset of upstream's)."""

    max_pods: StrictInt | None = Field(default=None, ge=0)
    pods_per_core: StrictInt | None = Field(default=None, ge=0)
    system_reserved: dict[str, str] = Field(default_factory=dict)
    kube_reserved: dict[str, str] = Field(default_factory=dict)
    eviction_hard: dict[str, str] = Field(default_factory=dict)
    eviction_soft: dict[str, str] = Field(default_factory=dict)
    eviction_soft_grace_period: dict[str, str] = Field(default_factory=dict)
    eviction_max_pod_grace_period: StrictInt | None = Field(default=None, ge=0)
    image_gc_high_threshold_percent: StrictInt | None = Field(
        default=None, ge=0, le=100, alias="imageGCHighThresholdPercent"
    )
    image_gc_low_threshold_percent: StrictInt | None = Field(
        default=None, ge=0, le=100, alias="imageGCLowThresholdPercent"
    )
    cpu_cfs_quota: Annotated[bool, Strict()] | None = Field(default=None, alias="cpuCFSQuota")
    cluster_dns: list[str] = Field(default_factory=list, alias="clusterDNS")

    _reserved = field_validator("system_reserved", "kube_reserved")(_reserved)
    _thresholds = field_validator("eviction_hard", "eviction_soft")(_thresholds)
    _grace = field_validator("eviction_soft_grace_period")(_grace_periods)

    @model_validator(mode="after")
    def _rules(self) -> KubeletConfiguration:
        high, low = self.image_gc_high_threshold_percent, self.image_gc_low_threshold_percent
        if high is not None and low is not None and high <= low:
            raise ValueError(
                "expected imageGCHighThresholdPercent above imageGCLowThresholdPercent, "
                f"got {high} and {low}"
            )
        soft, grace = set(self.eviction_soft), set(self.eviction_soft_grace_period)
        if soft - grace:
            missing = ", ".join(sorted(soft - grace))
            raise ValueError(
                f"expected an evictionSoftGracePeriod for every evictionSoft signal, "
                f"got none for {missing}"
            )
        if grace - soft:
            extra = ", ".join(sorted(grace - soft))
            raise ValueError(
                f"expected evictionSoftGracePeriod only for evictionSoft signals, got {extra}"
            )
        return self


# --- what a node offers ------------------------------------------------------------------


def pod_slots(catalog_pods: int, vcpu: int, kubelet: KubeletConfiguration | None) -> int:
    """Pods the kubelet admits: ``maxPods``, else the catalog's (ENI-limited) count,
    capped by ``podsPerCore`` x vCPUs when that is set (0 means no cap, as in the kubelet)."""
    pods = catalog_pods
    if kubelet is not None and kubelet.max_pods is not None:
        pods = kubelet.max_pods
    if kubelet is not None and kubelet.pods_per_core:
        pods = min(pods, kubelet.pods_per_core * vcpu)
    return pods


def _default_kube_cpu(vcpu: int) -> int:
    """Karpenter's kube-reserved CPU in millicores: 6 % of the first core, 1 % of the
    second, 0.5 % of the next two and 0.25 % of every core beyond."""
    steps = ((1, 0.06), (1, 0.01), (2, 0.005), (math.inf, 0.0025))
    left, total = float(vcpu), 0.0
    for cores, share in steps:
        take = min(left, cores)
        total += take * 1000 * share
        left -= take
        if left <= 0:
            break
    return int(total)


def _threshold(text: str, capacity: int) -> int:
    percent = _PERCENT.match(text)
    if percent is not None:
        return int(capacity * float(percent[1]) / 100)
    return parse_memory(text)


def _deductions(
    itype: InstanceType, pods: int, kubelet: KubeletConfiguration | None
) -> tuple[int, int, int]:
    """CPU, memory and ephemeral storage taken off capacity, in Karpenter's model."""
    kube = {
        "cpu": _default_kube_cpu(itype.vcpu),
        "memory": (11 * pods + 255) * _MIB,
        "ephemeral-storage": _DEFAULT_KUBE_EPHEMERAL,
    }
    system = {"cpu": 0, "memory": 0, "ephemeral-storage": 0}
    memory_capacity = _memory_capacity(itype)
    evict_memory = _DEFAULT_MEMORY_EVICTION
    evict_disk = int(_ROOT_VOLUME * _DEFAULT_NODEFS_PERCENT / 100)
    if kubelet is not None:
        for target, given in ((kube, kubelet.kube_reserved), (system, kubelet.system_reserved)):
            for name in target:
                if name in given:
                    value = given[name]
                    target[name] = parse_cpu(value) if name == "cpu" else parse_memory(value)
        memory_overrides: list[int] = []
        disk_overrides: list[int] = []
        for signals in (kubelet.eviction_hard, kubelet.eviction_soft):
            if "memory.available" in signals:
                memory_overrides.append(_threshold(signals["memory.available"], memory_capacity))
            if "nodefs.available" in signals:
                disk_overrides.append(_threshold(signals["nodefs.available"], _ROOT_VOLUME))
        evict_memory = max(memory_overrides, default=evict_memory)
        evict_disk = max(disk_overrides, default=evict_disk)
    return (
        kube["cpu"] + system["cpu"],
        kube["memory"] + system["memory"] + evict_memory,
        kube["ephemeral-storage"] + system["ephemeral-storage"] + evict_disk,
    )


def _memory_capacity(itype: InstanceType) -> int:
    mib = itype.memory_mib
    return (mib - math.ceil(mib * _VM_MEMORY_OVERHEAD)) * _MIB


def allocatable(itype: InstanceType, kubelet: KubeletConfiguration | None) -> Resources:
    """What pods may use on a node of ``itype`` whose kubelet runs with ``kubelet``.

    The catalog's figure moved by the difference between the class's deductions and the
    defaults it was computed with; never below zero.
    """
    base = itype.allocatable
    if kubelet is None:
        return base
    pods = pod_slots(base.pods, itype.vcpu, kubelet)
    before = _deductions(itype, base.pods, None)
    after = _deductions(itype, pods, kubelet)
    return dataclasses.replace(
        base,
        cpu=max(0, base.cpu + before[0] - after[0]),
        memory=max(0, base.memory + before[1] - after[1]),
        ephemeral=max(0, base.ephemeral + before[2] - after[2]),
        pods=max(0, pods),
    )


def for_kubelet(
    types: Mapping[str, InstanceType], kubelet: KubeletConfiguration | None
) -> dict[str, InstanceType]:
    """The catalog as nodes of a class with ``kubelet`` see it (itself if no block)."""
    if kubelet is None:
        return dict(types)
    return {
        name: dataclasses.replace(itype, allocatable=allocatable(itype, kubelet))
        for name, itype in types.items()
    }
