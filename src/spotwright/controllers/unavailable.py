"""What the provisioner has learnt not to ask for, and for how long.

A launch error about one offering (InsufficientInstanceCapacity and friends) closes that
(capacity type, instance type, zone) for a while; a quota error closes a whole capacity type,
so that the next scheduling round falls back to on-demand at once instead of walking every
spot offering into the same wall. Interruption notices close the interrupted pool too.
Entries expire on their own; time is passed in so that the cache is pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from spotwright.ports.cloud import Offering

__all__ = ["DEFAULT_TTL", "UnavailableOfferings"]

DEFAULT_TTL = 180.0


class UnavailableOfferings:
    def __init__(self, ttl: float = DEFAULT_TTL) -> None:
        self.ttl = ttl
        self._offerings: dict[tuple[str, str, str], float] = {}
        self._capacity_types: dict[str, float] = {}

    def mark_offering(self, capacity_type: str, instance_type: str, zone: str, now: float) -> None:
        self._offerings[(capacity_type, instance_type, zone)] = now + self.ttl

    def mark_capacity_type(self, capacity_type: str, now: float) -> None:
        self._capacity_types[capacity_type] = now + self.ttl

    def is_unavailable(self, offering: Offering, now: float) -> bool:
        until = self._capacity_types.get(offering.capacity_type)
        if until is not None and until > now:
            return True
        until = self._offerings.get(offering.key)
        return until is not None and until > now

    def apply(self, offerings: Iterable[Offering], now: float) -> list[Offering]:
        """The offerings with ``available`` cleared for everything the cache holds."""
        self._expire(now)
        if not self._offerings and not self._capacity_types:
            return list(offerings)
        out: list[Offering] = []
        for offering in offerings:
            if offering.available and self.is_unavailable(offering, now):
                offering = Offering(
                    offering.instance_type,
                    offering.zone,
                    offering.capacity_type,
                    offering.price,
                    available=False,
                )
            out.append(offering)
        return out

    def next_expiry(self, now: float) -> float | None:
        """When the earliest entry lapses, so a waiting provisioner knows when to retry."""
        times: Sequence[float] = [
            t for t in (*self._offerings.values(), *self._capacity_types.values()) if t > now
        ]
        return min(times) if times else None

    def _expire(self, now: float) -> None:
        for offering in [k for k, t in self._offerings.items() if t <= now]:
            del self._offerings[offering]
        for capacity_type in [k for k, t in self._capacity_types.items() if t <= now]:
            del self._capacity_types[capacity_type]
