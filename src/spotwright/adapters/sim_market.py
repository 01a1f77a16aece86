"""A simulated EC2 spot market behind the Cloud port.

The simulator and the cluster-test world run the real provisioner and interruption
controllers against this class instead of AWS. It reproduces what those controllers can
observe of EC2 and nothing more: per-pool prices, launches that fail with the real error
codes when a pool is short or a quota is hit, instances that boot after a delay, and
interruptions announced by EventBridge events (rebalance recommendation, 2-minute warning,
state changes) before the instance disappears. Capacity is hidden, as in AWS:
``offerings()`` shows everything as available and the provisioner learns otherwise from
launch errors.

All timing goes through the injected Clock and all randomness through the injected
``random.Random``, so on the virtual event loop a seeded run is reproducible to the event.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Literal

from spotwright.adapters import _market_signals as signals
from spotwright.adapters._market_ledger import (
    Billing,
    InstanceRecord,
    MarketCounters,
    bump,
    compute_billing,
    new_instance_id,
    private_dns,
    snapshot,
)
from spotwright.adapters._market_pools import (
    CO_INTERRUPTION_PROBABILITY,
    ON_DEMAND,
    SPOT,
    Pool,
    build_pools,
    choose_pool,
    notice_spread,
    reclaim_probability,
)
from spotwright.catalog._types import InstanceType
from spotwright.ports.clock import Clock
from spotwright.ports.cloud import (
    CloudError,
    Instance,
    InsufficientCapacityError,
    LaunchRequest,
    Offering,
    OfferingError,
    QuotaExceededError,
)

__all__ = ["Billing", "MarketCounters", "SimulatedMarket"]

#: Lead time of a spot interruption warning (EC2 User Guide: two minutes).
NOTICE_SECONDS = 120.0
#: Virtual time a CreateFleet call takes to answer (Karpenter issue #6128: ~1 s).
LAUNCH_API_SECONDS = 1.0
#: How often the advisor process looks at each pool.
TICK_SECONDS = 60.0
#: How long a reclaimed pool stays out of capacity: long enough to outlast Karpenter's
#: 3-minute unavailable-offerings cache several times, short of the hours-long outages of
#: the hottest GPU pools.
SHORTAGE_SECONDS = (600.0, 2400.0)
#: Boot time jitter around ``boot_seconds``; GPU types boot slower (drivers, bigger AMIs).
BOOT_JITTER = (0.8, 1.2)
GPU_BOOT_FACTOR = 1.3

_QUOTA_CODES = {SPOT: "MaxSpotInstanceCountExceeded", ON_DEMAND: "InstanceLimitExceeded"}
_LIVE = ("pending", "running")


class SimulatedMarket:
    """EC2 in one region, as a Cloud port, with a spot market that interrupts instances.

    The harness drives it with ``set_capacity``, ``set_quota`` and ``interrupt`` at scenario
    times and starts ``run()`` as a background task for the Spot-Advisor-calibrated
    interruption process. Callbacks tell the harness when an instance is up
    (``on_running``) or gone (``on_terminated``); ``publish`` receives every EventBridge
    event, for the queue the interruption controller reads.
    """

    def __init__(
        self,
        instance_types: Sequence[InstanceType],
        *,
        region: str,
        zones: Sequence[str],
        clock: Clock,
        rng: random.Random,
        interruptions: Literal["advisor", "none"] = "advisor",
        rebalance_lead_seconds: float | None = None,
        boot_seconds: float = 35.0,
        on_running: Callable[[Instance], None],
        on_terminated: Callable[[Instance, str], None],
        publish: Callable[[dict[str, Any]], None],
    ) -> None:
        if not zones:
            raise ValueError("the market needs at least one zone")
        if len(set(zones)) != len(zones):
            raise ValueError(f"zones listed twice: {list(zones)}")
        if interruptions not in ("advisor", "none"):
            raise ValueError(f"interruptions must be 'advisor' or 'none', not {interruptions!r}")
        if rebalance_lead_seconds is not None and rebalance_lead_seconds < 0:
            raise ValueError("rebalance_lead_seconds must be >= 0")
        self.region = region
        self._types = tuple(instance_types)
        self._type_names = {t.name for t in self._types}
        if len(self._type_names) != len(self._types):
            raise ValueError("an instance type is listed twice")
        self._zones = tuple(zones)
        self._clock = clock
        self._rng = rng
        self._mode = interruptions
        self._rebalance_lead = rebalance_lead_seconds
        self._boot_seconds = boot_seconds
        self._on_running = on_running
        self._on_terminated = on_terminated
        self._publish = publish
        self._pools = build_pools(self._types, self._zones, rng)
        self._quotas: dict[str, int] = {}
        self._records: dict[str, InstanceRecord] = {}
        self._used_ips: set[str] = set()
        self._zone_index = {z: i for i, z in enumerate(sorted(self._zones))}
        self._tasks: set[asyncio.Task[None]] = set()
        #: Running, not-yet-doomed spot instances per pool: what a reclaim can hit.
        self._exposed: dict[tuple[str, str, str], dict[str, InstanceRecord]] = {}
        self.counters = MarketCounters()
        self.notices_sent = 0
        self.rebalances_sent = 0

    # --- the Cloud port ----------------------------------------------------------------

    def instance_types(self) -> Sequence[InstanceType]:
        return self._types

    def offerings(self) -> Sequence[Offering]:
        """Every pool with its price, all flagged available: EC2 does not reveal capacity."""
        return [
            Offering(p.instance_type.name, p.zone, p.capacity_type, p.price, True)
            for _, p in sorted(self._pools.items())
        ]

    def price(self, capacity_type: str, instance_type: str, zone: str) -> float:
        """The market price of one pool (KeyError if the pool does not exist)."""
        return self._pools[(capacity_type, instance_type, zone)].price

    async def launch(self, request: LaunchRequest) -> Instance:
        """Launch one instance like an instant-type CreateFleet with one override per offering.

        The quota is checked first, as EC2 does, so a closed capacity type fails fast with a
        QuotaExceededError. Offerings whose pool is short fail individually; if none can
        launch, every failure is reported in one InsufficientCapacityError.
        """
        capacity_type = request.capacity_type
        if not request.offerings:
            raise ValueError(f"launch request {request.node_claim!r} has no offerings")
        for offering in request.offerings:
            if offering.capacity_type != capacity_type:
                raise ValueError(
                    f"launch request {request.node_claim!r} is for {capacity_type} but lists a "
                    f"{offering.capacity_type} offering ({offering.instance_type})"
                )
        await self._clock.sleep(LAUNCH_API_SECONDS)
        # Everything below is synchronous: concurrent launches see each other's instances.
        now = self._clock.now()
        quota = self._quotas.get(capacity_type)
        if quota is not None and self._live_count(capacity_type) >= quota:
            code = _QUOTA_CODES.get(capacity_type, "InstanceLimitExceeded")
            bump(self.counters.launch_failures, code)
            raise QuotaExceededError(
                code,
                capacity_type,
                f"you have reached the limit of {quota} {capacity_type} instances in {self.region}",
            )
        errors: list[OfferingError] = []
        candidates: list[tuple[int, Pool]] = []
        for index, offering in enumerate(request.offerings):
            pool = self._pools.get(offering.key)
            if pool is None:
                errors.append(
                    OfferingError(
                        offering,
                        "Unsupported",
                        f"{offering.instance_type} is not offered as {capacity_type} "
                        f"in {offering.zone}",
                    )
                )
            elif not pool.has_capacity(now):
                errors.append(
                    OfferingError(
                        offering,
                        "InsufficientInstanceCapacity",
                        f"We currently do not have sufficient {offering.instance_type} "
                        f"{capacity_type} capacity in the Availability Zone you requested "
                        f"({offering.zone}).",
                    )
                )
            else:
                candidates.append((index, pool))
        if not candidates:
            error = InsufficientCapacityError(errors)
            bump(self.counters.launch_failures, error.code)
            raise error
        pool = choose_pool(candidates, capacity_type)
        record = self._start(pool, request, now)
        bump(self.counters.launches, capacity_type)
        return snapshot(record.instance)

    async def terminate(self, instance_id: str) -> None:
        """TerminateInstances: idempotent; unknown ids fail like EC2's NotFound."""
        record = self._records.get(instance_id)
        if record is None:
            raise CloudError(
                "InvalidInstanceID.NotFound", f"The instance ID '{instance_id}' does not exist"
            )
        if record.instance.state in _LIVE:
            self._end(record, "terminated-by-request")

    async def describe(self, instance_ids: Sequence[str]) -> list[Instance]:
        """The known instances among ``instance_ids`` (terminated ones included), in order."""
        return [snapshot(self._records[i].instance) for i in instance_ids if i in self._records]

    async def list_owned(self) -> list[Instance]:
        """Live instances this cluster launched (all of them, in a simulation)."""
        return [snapshot(r.instance) for r in self._records.values() if r.instance.state in _LIVE]

    # --- scenario controls ---------------------------------------------------------------

    def set_capacity(
        self,
        capacity_type: str,
        *,
        instance_types: Sequence[str] | None,
        zones: Sequence[str] | None,
        available: bool,
    ) -> int:
        """Open or close pools for new launches (None = every type / zone).

        Running instances are untouched: closing a pool only makes launches into it fail with
        InsufficientInstanceCapacity. Returns how many pools were switched. Unknown names
        raise ValueError, so a typo in a scenario does not silently do nothing.
        """
        self._check_names(instance_types, zones)
        type_set = None if instance_types is None else set(instance_types)
        zone_set = None if zones is None else set(zones)
        switched = 0
        for pool in self._pools.values():
            if pool.capacity_type != capacity_type:
                continue
            if type_set is not None and pool.instance_type.name not in type_set:
                continue
            if zone_set is not None and pool.zone not in zone_set:
                continue
            pool.enabled = available
            switched += 1
        return switched

    def set_quota(self, capacity_type: str, max_instances: int | None) -> None:
        """Cap the running + pending instances of a capacity type (None lifts the cap)."""
        if max_instances is None:
            self._quotas.pop(capacity_type, None)
        elif max_instances < 0:
            raise ValueError("max_instances must be >= 0")
        else:
            self._quotas[capacity_type] = max_instances

    def interrupt(
        self,
        count: int,
        *,
        capacity_type: str | None = SPOT,
        instance_type: str | None = None,
        zone: str | None = None,
        rebalance_lead_seconds: float | None = None,
    ) -> list[Instance]:
        """Interrupt ``count`` running spot instances now, like an FIS/spot-interrupter test.

        Matching instances are sampled with the market's rng. Each gets a rebalance
        recommendation now if a lead is set (this call's, else the market's), the 2-minute
        warning ``lead`` seconds later, and is terminated 120 s after the warning. Only spot
        can be interrupted: EC2 never reclaims on-demand instances, so asking for that is a
        ValueError. Must be called from inside the running event loop.
        """
        if capacity_type not in (None, SPOT):
            raise ValueError(f"only spot instances can be interrupted, not {capacity_type!r}")
        self._check_names(
            None if instance_type is None else [instance_type], None if zone is None else [zone]
        )
        if count <= 0:
            return []
        candidates = sorted(
            (
                r
                for r in self._records.values()
                if r.instance.capacity_type == SPOT
                and r.instance.state == "running"
                and not r.doomed
                and instance_type in (None, r.instance.instance_type)
                and zone in (None, r.instance.zone)
            ),
            key=lambda r: r.instance.id,
        )
        chosen = self._rng.sample(candidates, min(count, len(candidates)))
        lead = self._rebalance_lead if rebalance_lead_seconds is None else rebalance_lead_seconds
        for record in chosen:
            self._schedule_interruption(record, delay=0.0, lead=lead)
        return [snapshot(r.instance) for r in chosen]

    # --- the interruption process ------------------------------------------------------

    async def run(self, *, until: float | None = None) -> None:
        """Reclaim spot pools at Spot-Advisor rates until cancelled (or ``until``).

        Every ``TICK_SECONDS`` each pool with running spot instances is reclaimed with
        probability 1 - exp(-μ·tick), μ = λ/q, where λ is the band's per-instance hazard
        and q the chance that a reclaim hits each running instance. A reclaim also leaves
        the pool short of capacity for 10-40 minutes. With ``interruptions='none'`` this
        returns at once.
        """
        if self._mode == "none":
            return
        while until is None or self._clock.now() + TICK_SECONDS <= until:
            await self._clock.sleep(TICK_SECONDS)
            self._tick(self._clock.now())

    def _tick(self, now: float) -> None:
        # Only pools with exposed instances draw, in sorted order, so a seed replays exactly.
        for key in sorted(k for k, members in self._exposed.items() if members):
            pool = self._pools[key]
            if self._rng.random() < reclaim_probability(pool.band, TICK_SECONDS):
                members = self._exposed[key]
                self._reclaim(pool, [members[i] for i in sorted(members)], now)

    def _reclaim(self, pool: Pool, records: Sequence[InstanceRecord], now: float) -> None:
        self.counters.reclaims += 1
        pool.short_until = max(pool.short_until, now + self._rng.uniform(*SHORTAGE_SECONDS))
        for record in records:
            if self._rng.random() < CO_INTERRUPTION_PROBABILITY:
                delay = notice_spread(self._rng)
                self._schedule_interruption(record, delay=delay, lead=self._rebalance_lead)

    def _schedule_interruption(
        self, record: InstanceRecord, *, delay: float, lead: float | None
    ) -> None:
        record.doomed = True
        self._shield(record)
        self._spawn(self._interruption(record, delay, lead))

    async def _interruption(self, record: InstanceRecord, delay: float, lead: float | None) -> None:
        """Recommendation (optional), warning ``lead`` s later, termination 120 s after it."""
        if delay > 0:
            await self._clock.sleep(delay)
        instance_id = record.instance.id
        if lead is not None:
            if not self._alive(record):
                return
            self.rebalances_sent += 1
            self._publish(
                signals.rebalance_recommendation(
                    self._rng, now=self._clock.now(), region=self.region, instance_id=instance_id
                )
            )
            if lead > 0:
                await self._clock.sleep(lead)
        if not self._alive(record):
            return
        self.notices_sent += 1
        self._publish(
            signals.spot_interruption_warning(
                self._rng, now=self._clock.now(), region=self.region, instance_id=instance_id
            )
        )
        await self._clock.sleep(NOTICE_SECONDS)
        if self._alive(record):
            self._end(record, "spot-interruption")

    # --- instance lifecycle ----------------------------------------------------------------

    def _start(self, pool: Pool, request: LaunchRequest, now: float) -> InstanceRecord:
        it = pool.instance_type
        instance = Instance(
            id=new_instance_id(self._rng, self._records),
            instance_type=it.name,
            zone=pool.zone,
            capacity_type=pool.capacity_type,
            price=pool.price,
            launched_at=now,
            private_dns=private_dns(
                self._rng,
                region=self.region,
                zone_index=self._zone_index[pool.zone],
                taken=self._used_ips,
            ),
            state="pending",
            tags=dict(request.tags),
        )
        record = InstanceRecord(instance, od_price=it.od_price, gpu=it.gpu_count > 0)
        self._records[instance.id] = record
        boot = self._boot_seconds * self._rng.uniform(*BOOT_JITTER)
        if record.gpu:
            boot *= GPU_BOOT_FACTOR
        self._spawn(self._boot(record, boot))
        return record

    async def _boot(self, record: InstanceRecord, seconds: float) -> None:
        await self._clock.sleep(seconds)
        if record.instance.state == "pending":
            record.instance.state = "running"
            if record.instance.capacity_type == SPOT and not record.doomed:
                self._exposed.setdefault(self._pool_key(record), {})[record.instance.id] = record
            self._on_running(snapshot(record.instance))

    def _end(self, record: InstanceRecord, reason: str) -> None:
        """Shut an instance down: billing stops, both state changes are published."""
        now = self._clock.now()
        inst = record.instance
        record.ended_at = now
        self._shield(record)
        for state in ("shutting-down", "terminated"):
            inst.state = state
            self._publish(
                signals.state_change(
                    self._rng, now=now, region=self.region, instance_id=inst.id, state=state
                )
            )
        bump(self.counters.terminations, reason)
        self._on_terminated(snapshot(inst), reason)

    @staticmethod
    def _pool_key(record: InstanceRecord) -> tuple[str, str, str]:
        inst = record.instance
        return (inst.capacity_type, inst.instance_type, inst.zone)

    def _shield(self, record: InstanceRecord) -> None:
        """The instance can no longer be hit by a reclaim (doomed already, or gone)."""
        members = self._exposed.get(self._pool_key(record))
        if members is not None:
            members.pop(record.instance.id, None)

    @staticmethod
    def _alive(record: InstanceRecord) -> bool:
        return record.instance.state in _LIVE

    def _live_count(self, capacity_type: str) -> int:
        return sum(
            1
            for r in self._records.values()
            if r.instance.capacity_type == capacity_type and r.instance.state in _LIVE
        )

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # A failing harness callback must not vanish with its timer task.
            task.get_loop().call_exception_handler(
                {
                    "message": "simulated market timer failed",
                    "exception": task.exception(),
                    "task": task,
                }
            )

    def close(self) -> None:
        """Cancel pending boots and interruptions (the harness calls this at the end)."""
        for task in list(self._tasks):
            task.cancel()

    def _check_names(self, types: Sequence[str] | None, zones: Sequence[str] | None) -> None:
        unknown_types = sorted(set(types or ()) - self._type_names)
        if unknown_types:
            raise ValueError(f"unknown instance types: {', '.join(unknown_types)}")
        unknown_zones = sorted(set(zones or ()) - set(self._zones))
        if unknown_zones:
            known = ", ".join(self._zones)
            raise ValueError(f"unknown zones: {', '.join(unknown_zones)} (market zones: {known})")

    # --- accounting ----------------------------------------------------------------------

    def instances(self) -> list[Instance]:
        """Every instance ever launched, terminated ones included, in launch order."""
        return [snapshot(r.instance) for r in self._records.values()]

    def billing(self, now: float) -> Billing:
        """Cost so far: each instance's price integrated over [launch, end or ``now``]."""
        return compute_billing(self._records.values(), now)
