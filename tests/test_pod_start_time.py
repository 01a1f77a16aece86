"""A pod's start time (``status.startTime``) read from the API, for do-not-disrupt spans."""

from __future__ import annotations

from datetime import UTC, datetime

from spotwright.adapters.kube.convert import pod_from_api


def _pod(status: dict[str, object]) -> dict[str, object]:
    return {
        "metadata": {"name": "web-1", "namespace": "default", "creationTimestamp": _t(0)},
        "spec": {"nodeName": "ip-10-0-0-1", "containers": []},
        "status": status,
    }


def _t(minute: int) -> str:
    return f"2026-11-21T05:{minute:02d}:00Z"


def _epoch(minute: int) -> float:
    return datetime(2026, 11, 21, 5, minute, tzinfo=UTC).timestamp()


def test_a_started_pod_carries_its_start_time_apart_from_its_creation() -> None:
    pod = pod_from_api(_pod({"phase": "Running", "startTime": _t(7)}))
    assert pod is not None
    assert (pod.created_at, pod.started_at) == (_epoch(0), _epoch(7))


def test_a_pod_the_kubelet_has_not_taken_on_has_no_start_time() -> None:
    pod = pod_from_api(_pod({"phase": "Pending"}))
    assert pod is not None and pod.started_at is None
