"""The facts spotwright knows about one EC2 instance type."""

from __future__ import annotations

from dataclasses import dataclass, field

from spotwright.model import labels as wk
from spotwright.model.resources import Resources

__all__ = ["InstanceType"]


@dataclass(frozen=True, slots=True)
class InstanceType:
    """Capacity, price and spot behaviour of one instance type.

    ``allocatable`` is what pods can use after kubelet/system reservations and eviction
    thresholds (Karpenter's overhead model, AL2023). ``interruption_band`` indexes Spot
    Advisor's ranges (0: <5 %, 1: 5-10 %, 2: 10-15 %, 3: 15-20 %, 4: >20 % per month);
    ``None`` means Spot Advisor has no entry, and the type is not offered as spot.
    """

    name: str
    family: str
    category: str
    generation: int
    size: str
    vcpu: int
    memory_mib: int
    arch: str
    gpu_count: int
    gpu_name: str
    allocatable: Resources
    od_price: float
    spot_savings_pct: float | None
    interruption_band: int | None
    #: Precomputed well-known labels; filled in from the fields above.
    labels: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not self.labels:
            object.__setattr__(self, "labels", self.well_known_labels())

    @property
    def spot_price(self) -> float | None:
        """Region-average spot price implied by Spot Advisor's savings figure."""
        if self.spot_savings_pct is None:
            return None
        return round(self.od_price * (1 - self.spot_savings_pct / 100), 6)

    def well_known_labels(self) -> dict[str, str]:
        """The node labels Karpenter derives from the type (no zone or capacity type)."""
        out = {
            wk.INSTANCE_TYPE: self.name,
            wk.ARCH: self.arch,
            wk.OS: "linux",
            wk.INSTANCE_CATEGORY: self.category,
            wk.INSTANCE_FAMILY: self.family,
            wk.INSTANCE_GENERATION: str(self.generation),
            wk.INSTANCE_SIZE: self.size,
            wk.INSTANCE_CPU: str(self.vcpu),
            wk.INSTANCE_MEMORY: str(self.memory_mib),
            wk.INSTANCE_GPU_COUNT: str(self.gpu_count),
        }
        if self.gpu_name:
            out[wk.INSTANCE_GPU_NAME] = self.gpu_name
        return out
