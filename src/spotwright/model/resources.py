"""Resource quantities as plain integers.

Kubernetes quantities ("500m", "2Gi", "1.5") are parsed once, at the edge, into integer
millicores and bytes so that the scheduling hot loop compares ints and never strings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

__all__ = ["GPU", "Resources", "parse_cpu", "parse_memory", "parse_quantity"]

GPU = "nvidia.com/gpu"

_SUFFIX = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
}
_QUANTITY = re.compile(r"^\s*([+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]{0,2})\s*$")


def parse_quantity(value: str | int | float) -> Decimal:
    """Parse a Kubernetes quantity into its value in base units.

    Raises ValueError with the offending text, so callers can name the field.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a quantity, got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"quantity must not be negative, got {value!r}")
        return Decimal(str(value))
    match = _QUANTITY.match(value)
    if not match or match.group(2) not in _SUFFIX:
        raise ValueError(f"{value!r} is not a Kubernetes quantity (like 500m, 2, 4Gi, 512Mi)")
    try:
        number = Decimal(match.group(1))
    except InvalidOperation as exc:  # pragma: no cover - the regex already guards this
        raise ValueError(f"{value!r} is not a number") from exc
    return number * _SUFFIX[match.group(2)]


def parse_cpu(value: str | int | float) -> int:
    """CPU quantity to millicores, rounded up as the kubelet does."""
    millis = parse_quantity(value) * 1000
    return int(millis.to_integral_value(rounding="ROUND_CEILING"))


def parse_memory(value: str | int | float) -> int:
    """Memory quantity to bytes, rounded up."""
    return int(parse_quantity(value).to_integral_value(rounding="ROUND_CEILING"))


@dataclass(frozen=True, slots=True)
class Resources:
    """A bundle of schedulable resources: what a pod asks for or a node offers.

    ``cpu`` is in millicores, ``memory`` and ``ephemeral`` in bytes, ``gpu`` counts
    ``nvidia.com/gpu`` devices and ``pods`` counts pod slots.
    """

    cpu: int = 0
    memory: int = 0
    gpu: int = 0
    pods: int = 0
    ephemeral: int = 0

    @classmethod
    def from_k8s(cls, values: dict[str, str | int | float] | None, *, pods: int = 0) -> Resources:
        """Build from a Kubernetes ResourceList (``{"cpu": "500m", "memory": "1Gi"}``)."""
        values = values or {}
        unknown = set(values) - {"cpu", "memory", GPU, "pods", "ephemeral-storage"}
        if unknown:
            raise ValueError(f"unsupported resource name(s): {', '.join(sorted(unknown))}")
        return cls(
            cpu=parse_cpu(values["cpu"]) if "cpu" in values else 0,
            memory=parse_memory(values["memory"]) if "memory" in values else 0,
            gpu=int(parse_quantity(values[GPU])) if GPU in values else 0,
            pods=int(parse_quantity(values["pods"])) if "pods" in values else pods,
            ephemeral=(
                parse_memory(values["ephemeral-storage"]) if "ephemeral-storage" in values else 0
            ),
        )

    def __add__(self, other: Resources) -> Resources:
        return Resources(
            self.cpu + other.cpu,
            self.memory + other.memory,
            self.gpu + other.gpu,
            self.pods + other.pods,
            self.ephemeral + other.ephemeral,
        )

    def __sub__(self, other: Resources) -> Resources:
        return Resources(
            self.cpu - other.cpu,
            self.memory - other.memory,
            self.gpu - other.gpu,
            self.pods - other.pods,
            self.ephemeral - other.ephemeral,
        )

    def fits_in(self, capacity: Resources) -> bool:
        """True if these requests fit within ``capacity`` on every dimension."""
        return (
            self.cpu <= capacity.cpu
            and self.memory <= capacity.memory
            and self.gpu <= capacity.gpu
            and self.pods <= capacity.pods
            and self.ephemeral <= capacity.ephemeral
        )

    def scaled(self, factor: int) -> Resources:
        return Resources(
            self.cpu * factor,
            self.memory * factor,
            self.gpu * factor,
            self.pods * factor,
            self.ephemeral * factor,
        )

    def describe(self) -> str:
        """Human form for log lines: ``cpu=1500m memory=3Gi``."""
        parts = [f"cpu={self.cpu}m", f"memory={_human_bytes(self.memory)}"]
        if self.gpu:
            parts.append(f"gpu={self.gpu}")
        if self.pods:
            parts.append(f"pods={self.pods}")
        return " ".join(parts)


def _human_bytes(value: int) -> str:
    for unit, size in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if value >= size and value % size == 0:
            return f"{value // size}{unit}"
    if value >= 2**30:
        return f"{value / 2**30:.1f}Gi"
    return f"{value // 2**20}Mi" if value >= 2**20 else str(value)
