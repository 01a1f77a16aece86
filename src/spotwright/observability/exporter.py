"""The spot-termination-exporter metrics, under their familiar names, from normalized events.

Dashboards and alerts built for banzaicloud's spot-termination-exporter keep working against
the IMDS-mode handler: the same metric names and labels, plus an ``instance_type`` label
and the rebalance metrics its users proposed (spot-termination-exporter #13 and #15):

- ``aws_instance_metadata_service_available{instance_id, instance_type}``: 1 if the last
  poll got an answer from the metadata service, 0 if not;
- ``aws_instance_termination_imminent{instance_action, instance_id, instance_type}``: 1 with
  the notice's action (``terminate``, ``stop``, ``hibernate``), or 0 with ``""``;
- ``aws_instance_termination_in{instance_id, instance_type}``: seconds until the notice's
  time, present only while positive;
- ``aws_instance_rebalance_recommended{instance_id, instance_type}``: 0 or 1;
- ``aws_instance_rebalance_recommended_at{instance_id, instance_type}``: when it was issued,
  epoch seconds, present only once recommended.

Unlike the original, which called IMDS synchronously on every scrape (and panicked on a
body it could not parse), nothing here does I/O: the background poller feeds parsed events
in, and a scrape only reads the cached state under a lock, computing the seconds left from
an injectable clock. The availability gauge appears after the first poll, so a freshly
started handler does not report the metadata service down.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from spotwright.events.model import EventKind, InterruptionEvent

__all__ = ["METRIC_NAMES", "TerminationExporter"]

_AVAILABLE = "aws_instance_metadata_service_available"
_IMMINENT = "aws_instance_termination_imminent"
_TERMINATION_IN = "aws_instance_termination_in"
_REBALANCE = "aws_instance_rebalance_recommended"
_REBALANCE_AT = "aws_instance_rebalance_recommended_at"
#: Every metric the exporter can expose.
METRIC_NAMES = (_AVAILABLE, _IMMINENT, _TERMINATION_IN, _REBALANCE, _REBALANCE_AT)
_INSTANCE = ["instance_id", "instance_type"]


@dataclass(frozen=True, slots=True)
class _Notice:
    action: str
    deadline: float | None


class TerminationExporter(Collector):
    """Termination metrics for one instance, registered on ``registry``.

    The poller calls ``metadata_service(available)`` after every poll, ``observe(event)``
    for every event it parsed and ``withdraw(kind)`` when a path stops announcing one
    (a 404 after a notice, as when a stopped spot instance is started again). All three
    and the scrape are safe to call from different threads.
    """

    def __init__(
        self,
        *,
        instance_id: str,
        instance_type: str = "",
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.instance_id = instance_id
        self.instance_type = instance_type
        self.registry = registry if registry is not None else CollectorRegistry()
        self._clock = clock
        self._lock = threading.Lock()
        self._available: bool | None = None
        self._notice: _Notice | None = None
        self._rebalance_at: float | None = None
        self.registry.register(self)

    def metadata_service(self, available: bool) -> None:
        """Whether the last poll got any HTTP answer from the metadata service."""
        with self._lock:
            self._available = available

    def observe(self, event: InterruptionEvent) -> bool:
        """Take an event into account; ``False`` if it is not about this instance's end."""
        if event.instance_id != self.instance_id:
            return False
        with self._lock:
            if event.kind is EventKind.SPOT_INTERRUPTION:
                self._notice = _Notice(event.action or "terminate", event.deadline)
            elif event.kind is EventKind.REBALANCE_RECOMMENDATION:
                self._rebalance_at = event.start
            else:
                return False
        return True

    def withdraw(self, kind: EventKind) -> None:
        """The metadata no longer announces ``kind``: back to the quiet values."""
        with self._lock:
            if kind is EventKind.SPOT_INTERRUPTION:
                self._notice = None
            elif kind is EventKind.REBALANCE_RECOMMENDATION:
                self._rebalance_at = None

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield from self._families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            available, notice, rebalance_at = self._available, self._notice, self._rebalance_at
        now = self._clock()
        available_f, imminent, left, rebalance, rebalance_at_f = self._families()
        ids = [self.instance_id, self.instance_type]
        if available is not None:
            available_f.add_metric(ids, 1.0 if available else 0.0)
        imminent.add_metric(
            [notice.action if notice else "", *ids], 1.0 if notice is not None else 0.0
        )
        if notice is not None and notice.deadline is not None and notice.deadline > now:
            left.add_metric(ids, notice.deadline - now)
        rebalance.add_metric(ids, 1.0 if rebalance_at is not None else 0.0)
        if rebalance_at is not None:
            rebalance_at_f.add_metric(ids, rebalance_at)
        yield from (available_f, imminent, left, rebalance, rebalance_at_f)

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, ...]:
        return (
            GaugeMetricFamily(
                _AVAILABLE,
                "Whether the instance metadata service answered the last poll",
                labels=_INSTANCE,
            ),
            GaugeMetricFamily(
                _IMMINENT,
                "Whether a spot interruption notice is present (instance_action says which)",
                labels=["instance_action", *_INSTANCE],
            ),
            GaugeMetricFamily(
                _TERMINATION_IN,
                "Seconds until the announced spot interruption",
                labels=_INSTANCE,
            ),
            GaugeMetricFamily(
                _REBALANCE,
                "Whether EC2 recommended rebalancing away from this instance",
                labels=_INSTANCE,
            ),
            GaugeMetricFamily(
                _REBALANCE_AT,
                "When the rebalance recommendation was issued (epoch seconds)",
                labels=_INSTANCE,
            ),
        )
