"""Resource quantities as plain integers.

Kubernetes quantities ("500m", "2Gi", "1.5") are parsed once, at the edge, into integer
millicores and bytes so that the scheduling hot loop compares ints and never strings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

__all__ = [
    "GPU",
    "NATIVE",
    "Extended",
    "Resources",
    "is_extended",
    "parse_cpu",
    "parse_memory",
    "parse_quantity",
    "whole",
]

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


#: Resource names with a field of their own; every other name is an extended resource.
NATIVE = frozenset({"cpu", "memory", GPU, "pods", "ephemeral-storage"})

Extended = tuple[tuple[str, int], ...]


def is_extended(name: str) -> bool:
    """Whether ``name`` is an extended resource (a device plugin's or an operator's count).

    Kubernetes requires them to be domain-qualified outside ``kubernetes.io``, like
    ``aws.amazon.com/neuron``, ``vpc.amazonaws.com/pod-eni`` or ``example.com/foo``.
    """
    domain, slash, rest = name.partition("/")
    return (
        bool(slash and domain and rest)
        and name not in NATIVE
        and domain != "kubernetes.io"
        and not domain.endswith(".kubernetes.io")
    )


@dataclass(frozen=True, slots=True)
class Resources:
    """A bundle of schedulable resources: what a pod asks for or a node offers.

    ``cpu`` is in millicores, ``memory`` and ``ephemeral`` in bytes, ``gpu`` counts
    ``nvidia.com/gpu`` devices and ``pods`` counts pod slots. ``extended`` holds every
    other (extended) resource as sorted ``(name, count)`` pairs without zeros; it is
    empty for nearly every pod, so the arithmetic below takes a fast path then.
    """

    cpu: int = 0
    memory: int = 0
    gpu: int = 0
    pods: int = 0
    ephemeral: int = 0
    extended: Extended = ()

    @classmethod
    def from_k8s(cls, values: dict[str, str | int | float] | None, *, pods: int = 0) -> Resources:
        """Build from a Kubernetes ResourceList (``{"cpu": "500m", "memory": "1Gi"}``)."""
        values = values or {}
        unknown = [k for k in values if k not in NATIVE and not is_extended(k)]
        if unknown:
            raise ValueError(f"unsupported resource name(s): {', '.join(sorted(unknown))}")
        extended = tuple(sorted((k, whole(k, v)) for k, v in values.items() if k not in NATIVE))
        return cls(
            cpu=parse_cpu(values["cpu"]) if "cpu" in values else 0,
            memory=parse_memory(values["memory"]) if "memory" in values else 0,
            gpu=int(parse_quantity(values[GPU])) if GPU in values else 0,
            pods=int(parse_quantity(values["pods"])) if "pods" in values else pods,
            ephemeral=(
                parse_memory(values["ephemeral-storage"]) if "ephemeral-storage" in values else 0
            ),
            extended=tuple((k, n) for k, n in extended if n),
        )

    def __add__(self, other: Resources) -> Resources:
        return Resources(
            self.cpu + other.cpu,
            self.memory + other.memory,
            self.gpu + other.gpu,
            self.pods + other.pods,
            self.ephemeral + other.ephemeral,
            _combine(self.extended, other.extended, 1) if self.extended or other.extended else (),
        )

    def __sub__(self, other: Resources) -> Resources:
        return Resources(
            self.cpu - other.cpu,
            self.memory - other.memory,
            self.gpu - other.gpu,
            self.pods - other.pods,
            self.ephemeral - other.ephemeral,
            _combine(self.extended, other.extended, -1) if self.extended or other.extended else (),
        )

    def fits_in(self, capacity: Resources) -> bool:
        """True if these requests fit within ``capacity`` on every dimension."""
        return (
            self.cpu <= capacity.cpu
            and self.memory <= capacity.memory
            and self.gpu <= capacity.gpu
            and self.pods <= capacity.pods
            and self.ephemeral <= capacity.ephemeral
            and (not self.extended or not self.short_of(capacity))
        )

    def short_of(self, capacity: Resources) -> list[str]:
        """The extended resources these requests need more of than ``capacity`` has."""
        have = dict(capacity.extended)
        return [name for name, n in self.extended if n > have.get(name, 0)]

    def amount(self, name: str) -> int:
        """The quantity of one resource by its Kubernetes name (0 if absent)."""
        native = _FIELDS.get(name)
        if native is not None:
            return int(getattr(self, native))
        return dict(self.extended).get(name, 0)

    def larger(self, other: Resources) -> Resources:
        """The larger of the two on every dimension (init containers, DaemonSet sizes)."""
        return Resources(
            max(self.cpu, other.cpu),
            max(self.memory, other.memory),
            max(self.gpu, other.gpu),
            max(self.pods, other.pods),
            max(self.ephemeral, other.ephemeral),
            _largest(self.extended, other.extended) if self.extended or other.extended else (),
        )

    def scaled(self, factor: int) -> Resources:
        return Resources(
            self.cpu * factor,
            self.memory * factor,
            self.gpu * factor,
            self.pods * factor,
            self.ephemeral * factor,
            tuple((k, n * factor) for k, n in self.extended if n * factor),
        )

    def describe(self) -> str:
        """Human form for log lines: ``cpu=1500m memory=3Gi``."""
        parts = [f"cpu={self.cpu}m", f"memory={_human_bytes(self.memory)}"]
        if self.gpu:
            parts.append(f"gpu={self.gpu}")
        if self.pods:
            parts.append(f"pods={self.pods}")
        parts.extend(f"{name}={n}" for name, n in self.extended)
        return " ".join(parts)


_FIELDS = {
    "cpu": "cpu",
    "memory": "memory",
    GPU: "gpu",
    "pods": "pods",
    "ephemeral-storage": "ephemeral",
}


def whole(name: str, value: str | int | float) -> int:
    """An extended resource's quantity: Kubernetes allows whole numbers only."""
    number = parse_quantity(value)
    if number != number.to_integral_value():
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    return int(number)


def _combine(a: Extended, b: Extended, sign: int) -> Extended:
    out = dict(a)
    for name, n in b:
        out[name] = out.get(name, 0) + sign * n
    return tuple(sorted((k, n) for k, n in out.items() if n))


def _largest(a: Extended, b: Extended) -> Extended:
    out = dict(a)
    for name, n in b:
        out[name] = max(out.get(name, 0), n)
    return tuple(sorted((k, n) for k, n in out.items() if n))


def _human_bytes(value: int) -> str:
    for unit, size in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if value >= size and value % size == 0:
            return f"{value // size}{unit}"
    if value >= 2**30:
        return f"{value / 2**30:.1f}Gi"
    return f"{value // 2**20}Mi" if value >= 2**20 else str(value)
