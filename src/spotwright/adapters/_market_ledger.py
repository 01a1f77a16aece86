"""The simulated market's books: instance records, names, counters and billing.

Separate from ``sim_market`` because the simulator's cost report is built from it: what
was billed, for how long, against what on-demand would have cost, must be checkable
without reading the event plumbing.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from spotwright.ports.cloud import Instance

__all__ = [
    "Billing",
    "InstanceRecord",
    "MarketCounters",
    "bump",
    "compute_billing",
    "new_instance_id",
    "private_dns",
    "snapshot",
]


@dataclass(frozen=True, slots=True)
class Billing:
    """What the fleet cost up to a moment, and what it would have cost all on-demand."""

    total_usd: float
    on_demand_equivalent_usd: float
    instance_seconds: Mapping[str, float]

    @property
    def savings_pct(self) -> float:
        if self.on_demand_equivalent_usd <= 0:
            return 0.0
        return 100.0 * (1 - self.total_usd / self.on_demand_equivalent_usd)


@dataclass(slots=True)
class MarketCounters:
    """Tallies for the simulator's summary.

    ``launches`` is keyed by capacity type, ``launch_failures`` by EC2 error code (one per
    failed launch call), ``terminations`` by reason; ``reclaims`` counts pool reclaim events
    of the advisor process (each may hit several instances, or none).
    """

    launches: dict[str, int] = field(default_factory=dict)
    launch_failures: dict[str, int] = field(default_factory=dict)
    terminations: dict[str, int] = field(default_factory=dict)
    reclaims: int = 0


@dataclass(slots=True)
class InstanceRecord:
    """The market's own view of an instance: the live object plus what billing needs."""

    instance: Instance
    od_price: float
    gpu: bool
    ended_at: float | None = None
    #: Set once an interruption is scheduled, so no second one picks the same instance.
    doomed: bool = False


def bump(counter: dict[str, int], key: str) -> None:
    counter[key] = counter.get(key, 0) + 1


def snapshot(instance: Instance) -> Instance:
    """A copy for callers: like DescribeInstances, an answer does not change afterwards."""
    return dataclasses.replace(instance, tags=dict(instance.tags))


def compute_billing(records: Iterable[InstanceRecord], now: float) -> Billing:
    """Integrate each instance's price over [launch, end or ``now``], per second.

    Billing starts at launch and stops when the instance starts shutting down; asking for
    an earlier ``now`` gives the bill as it stood then.
    """
    total = 0.0
    od_equivalent = 0.0
    seconds: dict[str, float] = {}
    for record in records:
        inst = record.instance
        end = now if record.ended_at is None else min(record.ended_at, now)
        duration = max(0.0, end - inst.launched_at)
        total += inst.price * duration / 3600.0
        od_equivalent += record.od_price * duration / 3600.0
        seconds[inst.capacity_type] = seconds.get(inst.capacity_type, 0.0) + duration
    return Billing(total, od_equivalent, seconds)


def new_instance_id(rng: random.Random, taken: Mapping[str, object]) -> str:
    """``i-`` and 17 hex digits, like current EC2 ids, drawn from the seeded rng."""
    while True:
        candidate = f"i-{rng.getrandbits(68):017x}"
        if candidate not in taken:
            return candidate


def private_dns(rng: random.Random, *, region: str, zone_index: int, taken: set[str]) -> str:
    """An unused private DNS name, ``ip-10-a-b-c`` in a /12 block per zone like VPC subnets."""
    while True:
        octets = (16 * (zone_index % 16) + rng.randrange(16), rng.randrange(256))
        host = f"10-{octets[0]}-{octets[1]}-{rng.randrange(1, 255)}"
        if host not in taken:
            taken.add(host)
            break
    suffix = "ec2.internal" if region == "us-east-1" else f"{region}.compute.internal"
    return f"ip-{host}.{suffix}"
