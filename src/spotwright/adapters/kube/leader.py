"""Lease-based leader election (coordination.k8s.io/v1), so two replicas never both act.

Two ``spotwright controller`` replicas run for availability, but only one may provision:
two provisioners would each launch capacity for the same pending pods. Both keep their
caches warm; the one holding the Lease runs the controllers.

The protocol is client-go's: read the Lease; take it if it is free or expired, renew it if
it is ours, and write with the resourceVersion just read (a merge patch carrying it), so of
two replicas racing for an expired Lease exactly one write succeeds and the other gets 409.
A Lease counts as expired when its holder has not renewed it for ``lease_seconds``, judged
by the renewTime it wrote or, if clocks disagree, by how long this replica has watched it
unchanged. The leader renews every ``retry_seconds``; if it cannot renew for
``renew_deadline`` seconds (shorter than the Lease, so it steps down before anyone can take
over), or it finds someone else holding the Lease, it stops leading at once: the work is
cancelled and ``is_leader`` turns false, which the cluster adapter checks before every
write. On a clean shutdown the leader releases the Lease so the standby need not wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from spotwright.adapters.kube.client import LEASES, Api, status_code
from spotwright.adapters.kube.convert import format_time, parse_time
from spotwright.observability.logs import get_logger

__all__ = ["LeaderElector", "LeaseRecord", "LostLeadership", "default_identity"]

log = get_logger("leader")


class LostLeadership(Exception):
    """The Lease was lost (not renewed in time, or taken): the process must stop leading."""


def default_identity() -> str:
    """Unique per process: the host (the pod's name in a cluster) and a random suffix."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    holder: str
    lease_seconds: float
    renew_time: float | None
    acquire_time: float | None
    transitions: int
    version: str

    @classmethod
    def from_api(cls, obj: dict[str, Any]) -> LeaseRecord:
        spec = obj.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            lease_seconds=float(spec.get("leaseDurationSeconds") or 0),
            renew_time=parse_time(spec.get("renewTime")),
            acquire_time=parse_time(spec.get("acquireTime")),
            transitions=int(spec.get("leaseTransitions") or 0),
            version=str((obj.get("metadata") or {}).get("resourceVersion") or ""),
        )


class LeaderElector:
    def __init__(
        self,
        api: Api,
        *,
        namespace: str,
        name: str = "spotwright-controller",
        identity: str | None = None,
        lease_seconds: float = 15.0,
        renew_deadline: float = 10.0,
        retry_seconds: float = 2.0,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not retry_seconds < renew_deadline < lease_seconds:
            raise ValueError("expected retry_seconds < renew_deadline < lease_seconds")
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.lease_seconds = lease_seconds
        self.renew_deadline = renew_deadline
        self.retry_seconds = retry_seconds
        self._wall = wall_clock
        self._mono = monotonic
        self._renewed_at: float | None = None
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        #: The last Lease as read or written, for callers and tests.
        self.record: LeaseRecord | None = None

    # -- state -----------------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        """True while this replica holds a Lease it renewed within the renew deadline."""
        return self._renewed_at is not None and (
            self._mono() - self._renewed_at < self.renew_deadline
        )

    def _expired(self, record: LeaseRecord) -> bool:
        if not record.holder:
            return True
        duration = record.lease_seconds or self.lease_seconds
        if record.renew_time is not None and self._wall() >= record.renew_time + duration:
            return True
        return self._mono() >= self._observed_at + duration

    def _observe(self, record: LeaseRecord) -> None:
        key = (record.holder, record.renew_time, record.version)
        seen = self._observed
        if seen is None or key != (seen.holder, seen.renew_time, seen.version):
            self._observed = record
            self._observed_at = self._mono()
        self.record = record

    # -- one attempt -------------------------------------------------------------------------
    async def try_acquire_or_renew(self) -> bool:
        """One round of the protocol; True if this replica holds the Lease afterwards."""
        now = self._wall()
        try:
            obj = await self.api.get(LEASES, self.name, self.namespace)
        except Exception as exc:
            if status_code(exc) != 404:
                raise
            return await self._create(now)
        record = LeaseRecord.from_api(obj)
        self._observe(record)
        mine = record.holder == self.identity
        if not mine and not self._expired(record):
            return False
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.lease_seconds),
            "renewTime": format_time(now),
        }
        if not mine:
            spec["acquireTime"] = format_time(now)
            spec["leaseTransitions"] = record.transitions + (1 if record.holder else 0)
        patch = {"metadata": {"resourceVersion": record.version}, "spec": spec}
        try:
            written = await self.api.patch(LEASES, self.name, patch, namespace=self.namespace)
        except Exception as exc:
            if status_code(exc) in (409, 404):
                return False  # someone else wrote first
            raise
        self._observe(LeaseRecord.from_api(written))
        self._renewed_at = self._mono()
        if not mine:
            log.info(
                "acquired lease",
                lease=f"{self.namespace}/{self.name}",
                identity=self.identity,
                previous=record.holder or "<none>",
            )
        return True

    async def _create(self, now: float) -> bool:
        lease = {
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.lease_seconds),
                "acquireTime": format_time(now),
                "renewTime": format_time(now),
                "leaseTransitions": 0,
            },
        }
        try:
            created = await self.api.create(LEASES, lease, namespace=self.namespace)
        except Exception as exc:
            if status_code(exc) == 409:
                return False
            raise
        self._observe(LeaseRecord.from_api(created))
        self._renewed_at = self._mono()
        log.info("acquired lease", lease=f"{self.namespace}/{self.name}", identity=self.identity)
        return True

    async def _attempt(self, limit: float) -> bool:
        """An attempt bounded in time; errors count as a failed attempt."""
        try:
            async with asyncio.timeout(max(0.1, limit)):
                return await self.try_acquire_or_renew()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the API being away is exactly what election tolerates
            log.warning("lease request failed", error=f"{type(exc).__name__}: {exc}")
            return False

    async def release(self) -> None:
        """Give the Lease up (clean shutdown) so a standby takes over without waiting."""
        record = self.record
        was_leader = self.is_leader
        self._renewed_at = None
        if record is None or not was_leader:
            return
        patch = {
            "metadata": {"resourceVersion": record.version},
            "spec": {
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "renewTime": format_time(self._wall()),
            },
        }
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.retry_seconds):
                await self.api.patch(LEASES, self.name, patch, namespace=self.namespace)
                log.info("released lease", lease=f"{self.namespace}/{self.name}")

    # -- the loops ---------------------------------------------------------------------------
    async def acquire(self) -> None:
        """Wait until this replica holds the Lease."""
        log.info("waiting for leadership", lease=f"{self.namespace}/{self.name}")
        while not await self._attempt(self.retry_seconds):
            wait = self.retry_seconds * (1.0 + 0.2 * random.random())
            if self._observed is not None and self._observed.holder != self.identity:
                # Try again right when the holder's Lease runs out, not up to a period late.
                wait = min(wait, max(0.05, self._time_left(self._observed)))
            await asyncio.sleep(wait)

    def _time_left(self, record: LeaseRecord) -> float:
        duration = record.lease_seconds or self.lease_seconds
        left = self._observed_at + duration - self._mono()
        if record.renew_time is not None:
            left = min(left, record.renew_time + duration - self._wall())
        return left

    async def keep(self) -> None:
        """Renew until that fails for ``renew_deadline`` or the Lease is taken; then raise."""
        while True:
            await asyncio.sleep(self.retry_seconds)
            assert self._renewed_at is not None
            left = self.renew_deadline - (self._mono() - self._renewed_at)
            if await self._attempt(left):
                continue
            taken = self.record is not None and self.record.holder not in ("", self.identity)
            if taken or not self.is_leader:
                self._renewed_at = None
                holder = self.record.holder if self.record else "<unknown>"
                log.error("lost leadership", identity=self.identity, holder=holder)
                raise LostLeadership(f"lease {self.namespace}/{self.name} now held by {holder}")

    async def run(self, lead: Callable[[], Awaitable[None]]) -> None:
        """Acquire, run ``lead()`` while holding the Lease, stop it the moment it is lost.

        Returns when ``lead`` returns (the Lease is released); raises LostLeadership when
        the Lease is lost, after ``lead`` has been cancelled.
        """
        await self.acquire()
        work = asyncio.ensure_future(lead())
        keeper = asyncio.ensure_future(self.keep())
        try:
            done, _ = await asyncio.wait({work, keeper}, return_when=asyncio.FIRST_COMPLETED)
            if keeper in done:
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await work
                keeper.result()  # raises LostLeadership
            else:
                work.result()
        finally:
            for task in (work, keeper):
                task.cancel()
            for task in (work, keeper):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await self.release()
