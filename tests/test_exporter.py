"""The spot-termination-exporter metrics, as a Prometheus scrape renders them."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from spotwright.events import EventKind, InterruptionEvent, parse_eventbridge
from spotwright.events.imds import parse_imds
from spotwright.observability.exporter import METRIC_NAMES, TerminationExporter

IMDS = Path(__file__).parent / "data" / "imds"
SQS = Path(__file__).parent / "data" / "events"
INSTANCE = "i-0a1b2c3d4e5f60718"
LABELS = f'instance_id="{INSTANCE}",instance_type="m5.large"'
NOTICE = 1741083330.0  # 2025-03-04T10:15:30Z, the sample notice; EC2 acts 120 s later


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def exporter(now: float = NOTICE) -> tuple[TerminationExporter, Clock]:
    clock = Clock(now)
    return TerminationExporter(instance_id=INSTANCE, instance_type="m5.large", clock=clock), clock


def scrape(exp: TerminationExporter) -> list[str]:
    text = generate_latest(exp.registry).decode()
    return [line for line in text.splitlines() if not line.startswith("#")]


def imds(path: str, name: str) -> InterruptionEvent:
    return parse_imds(path, (IMDS / name).read_text(), instance_id=INSTANCE, now=NOTICE)[0]


def test_quiet_values_before_anything_happened() -> None:
    exp, _ = exporter()
    assert scrape(exp) == [
        f'aws_instance_termination_imminent{{instance_action="",{LABELS}}} 0.0',
        f"aws_instance_rebalance_recommended{{{LABELS}}} 0.0",
    ]
    text = generate_latest(exp.registry).decode()
    for name in METRIC_NAMES:
        assert f"# TYPE {name} gauge" in text


def test_after_a_spot_notice() -> None:
    exp, clock = exporter(now=NOTICE + 30)
    exp.metadata_service(True)
    assert exp.observe(imds("spot/instance-action", "spot_instance_action.json"))
    assert scrape(exp) == [
        f"aws_instance_metadata_service_available{{{LABELS}}} 1.0",
        f'aws_instance_termination_imminent{{instance_action="terminate",{LABELS}}} 1.0',
        f"aws_instance_termination_in{{{LABELS}}} 90.0",
        f"aws_instance_rebalance_recommended{{{LABELS}}} 0.0",
    ]
    # Seconds left are computed at scrape time, and vanish once the time has come.
    clock.now = NOTICE + 119.5
    assert f"aws_instance_termination_in{{{LABELS}}} 0.5" in scrape(exp)
    clock.now = NOTICE + 120
    assert not any(line.startswith("aws_instance_termination_in") for line in scrape(exp))
    assert f'aws_instance_termination_imminent{{instance_action="terminate",{LABELS}}} 1.0' in (
        scrape(exp)
    )


def test_the_action_label_follows_the_notice() -> None:
    exp, _ = exporter()
    exp.observe(imds("spot/instance-action", "spot_instance_action_hibernate.json"))
    assert f'aws_instance_termination_imminent{{instance_action="hibernate",{LABELS}}} 1.0' in (
        scrape(exp)
    )


def test_a_queue_notice_for_the_same_instance_counts_too() -> None:
    exp, _ = exporter()
    event = parse_eventbridge((SQS / "spot_interruption.json").read_text())[0]
    assert exp.observe(event)
    assert f"aws_instance_termination_in{{{LABELS}}} 120.0" in scrape(exp)


def test_rebalance_recommendation() -> None:
    exp, _ = exporter()
    exp.observe(imds("events/recommendations/rebalance", "rebalance_recommendation.json"))
    lines = scrape(exp)
    assert f"aws_instance_rebalance_recommended{{{LABELS}}} 1.0" in lines
    assert f"aws_instance_rebalance_recommended_at{{{LABELS}}} 1.741082282e+09" in lines
    assert f'aws_instance_termination_imminent{{instance_action="",{LABELS}}} 0.0' in lines


def test_withdrawn_signals_go_back_to_quiet() -> None:
    exp, _ = exporter()
    exp.observe(imds("spot/instance-action", "spot_instance_action.json"))
    exp.observe(imds("events/recommendations/rebalance", "rebalance_recommendation.json"))
    exp.withdraw(EventKind.SPOT_INTERRUPTION)
    exp.withdraw(EventKind.REBALANCE_RECOMMENDATION)
    exp.metadata_service(False)
    assert scrape(exp) == [
        f"aws_instance_metadata_service_available{{{LABELS}}} 0.0",
        f'aws_instance_termination_imminent{{instance_action="",{LABELS}}} 0.0',
        f"aws_instance_rebalance_recommended{{{LABELS}}} 0.0",
    ]


def test_events_about_other_instances_or_kinds_change_nothing() -> None:
    exp, _ = exporter()
    quiet = scrape(exp)
    other = parse_imds(
        "spot/instance-action",
        (IMDS / "spot_instance_action.json").read_text(),
        instance_id="i-0fffffffffffffff0",
        now=NOTICE,
    )[0]
    assert not exp.observe(other)
    assert not exp.observe(imds("events/maintenance/scheduled", "maintenance_scheduled.json"))
    assert scrape(exp) == quiet


def test_registries_are_separate_and_names_are_claimed() -> None:
    registry = CollectorRegistry()
    TerminationExporter(instance_id=INSTANCE, registry=registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        TerminationExporter(instance_id=INSTANCE, registry=registry)
    exporter()  # a fresh registry each: no clash
    exporter()
