"""Termination: a deleted node claim becomes a drained node and a terminated instance.

The drain is where a spot interruption turns into either a clean move of the workload or
lost pods, so these tests follow what a user would check in ``kubectl``: the node is tainted
and cordoned first, ordinary pods go before system-critical ones, daemon pods and pods that
tolerate the disruption taint stay, PodDisruptionBudgets are honoured (refusals retried until
a replacement is ready), ``karpenter.sh/do-not-disrupt`` holds eviction back but not past an
interruption deadline, nothing outlives that deadline, and at the end the instance is
terminated and the claim is gone, even when a step failed once. The real provisioner,
lifecycle and termination controllers run, in virtual time.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from spotwright.controllers import Settings
from spotwright.controllers.termination import parse_go_duration
from spotwright.model import labels as wk
from spotwright.model.objects import NodeClaim, Pod, Toleration
from spotwright.ports.cluster import ClusterError

if TYPE_CHECKING:
    from conftest import Simulator, World

EXCLUDE_LB = "node.kubernetes.io/exclude-from-external-load-balancers"


async def one_ready_node(w: World, *apps: str) -> NodeClaim:
    """Wait until every pod of ``apps`` is ready, all on the node of a single claim."""
    await w.until(lambda: w.all_ready(*apps), within=120, what="workload ready")
    [claim] = w.claims()
    assert {p.node_name for app in apps for p in w.pods_of(app)} == {claim.node_name}
    return claim


async def delete_claim(w: World, claim: NodeClaim, *, deadline_in: float | None = None) -> None:
    """What interruption handling (or a user) does: mark the claim for deletion."""
    claim.deleting_since = w.clock.now()
    claim.drain_deadline = None if deadline_in is None else w.clock.now() + deadline_in
    claim.deletion_reason = "test"
    await w.cluster.update_node_claim(claim)


def eviction_times(w: World, app: str) -> list[float]:
    return sorted(
        w.rel(e.time) for e in w.events("Evicted") if e.name.startswith(f"default/{app}-")
    )


def test_the_node_is_tainted_and_cordoned_then_drained_then_its_instance_terminated(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        await w.start_controllers()
        w.deploy("web", 3, grace_seconds=10)
        claim = await one_ready_node(w, "web")
        node = w.cluster.node(claim.node_name)
        assert node is not None
        await delete_claim(w, claim)
        await w.advance(0.01)
        assert any(
            t.key == wk.DISRUPTED_TAINT_KEY and t.effect == "NoSchedule" for t in node.taints
        )
        assert node.unschedulable and node.labels[EXCLUDE_LB] == "spotwright"
        await w.until(lambda: w.cluster.node_claim(claim.name) is None, within=60, what="gone")
        assert w.cluster.node(node.name) is None
        assert w.instance(claim).state == "terminated"
        reasons = [e.reason for e in w.cluster.events if e.reason in ("Cordoned", "Evicted")]
        assert reasons == ["Cordoned", "Evicted", "Evicted", "Evicted"]
        assert w.events("Drained", node.name)
        assert (w.ledger.evicted, w.ledger.lost) == (3, 0)
        assert w.counter("spotwright_nodes_drained_total", result="before_deadline") == 1
        await w.until(lambda: w.all_ready("web"), within=60, what="web ready elsewhere")

    sim.run(body)


def test_ordinary_pods_are_evicted_before_system_critical_ones(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        await w.start_controllers()
        w.deploy("web", 2, grace_seconds=20)
        w.deploy("dns", 1, grace_seconds=5, priority_class="system-cluster-critical")
        claim = await one_ready_node(w, "web", "dns")
        await delete_claim(w, claim)
        await w.until(lambda: w.cluster.node_claim(claim.name) is None, within=60, what="gone")
        web, [dns] = eviction_times(w, "web"), eviction_times(w, "dns")
        assert len(web) == 2
        # The critical pod waited until the ordinary ones had finished their 20 s grace.
        assert dns >= max(web) + 20
        assert (w.ledger.evicted, w.ledger.lost) == (3, 0)

    sim.run(body)


def test_daemon_pods_and_pods_tolerating_the_disruption_taint_are_left_in_place(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        await w.start_controllers()
        w.deploy("web", 1)
        stays = (Toleration(wk.DISRUPTED_TAINT_KEY, "Exists"),)
        w.deploy("stay", 1, cpu="50m", tolerations=stays)
        w.deploy("agent", 1, cpu="50m", daemon=True, tolerations=(Toleration(operator="Exists"),))
        claim = await one_ready_node(w, "web", "stay", "agent")
        [stay], [agent] = w.pods_of("stay"), w.pods_of("agent")
        await delete_claim(w, claim)
        await w.until(lambda: w.cluster.node_claim(claim.name) is None, within=60, what="gone")
        assert eviction_times(w, "web") and not w.events("Evicted", stay.key)
        assert not stay.evicted and not agent.evicted
        assert not w.events("Evicted", agent.key)
        # The drain did not wait for them: the node was drained once the web pod had gone.
        assert w.events("Drained", claim.node_name)

    sim.run(body)


def test_budget_refusals_are_retried_and_succeed_once_a_replacement_is_ready(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        await w.start_controllers()
        w.deploy("web", 3, startup_seconds=10, grace_seconds=5)
        w.pdb("web", min_available=2)
        claim = await one_ready_node(w, "web")
        lowest = [w.ready("web")]

        async def watch_ready() -> None:
            while True:
                lowest[0] = min(lowest[0], w.ready("web"))
                await asyncio.sleep(0.05)

        monitor = asyncio.create_task(watch_ready())
        await delete_claim(w, claim)  # no deadline: a rebalance-style drain
        await w.until(lambda: w.cluster.node_claim(claim.name) is None, within=300, what="gone")
        monitor.cancel()
        assert w.counter("spotwright_eviction_blocked_total") > 0
        assert (w.ledger.evicted, w.ledger.lost) == (3, 0)
        assert lowest[0] >= 2, "the budget must have held throughout the drain"
        first, second, third = eviction_times(w, "web")
        # Each refusal lasted until the previous pod's replacement had started (10 s).
        assert second - first >= 10 and third - second >= 10
        await w.until(lambda: w.all_ready("web"), within=30, what="web ready elsewhere")

    sim.run(body)


def test_a_refused_eviction_is_retried_the_moment_a_pod_of_its_budget_turns_ready(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        await w.start_controllers()
        w.deploy("web", 3, startup_seconds=10, grace_seconds=5)
        w.pdb("web", min_available=2)
        claim = await one_ready_node(w, "web")
        await delete_claim(w, claim)
        await w.until(lambda: w.cluster.node_claim(claim.name) is None, within=300, what="gone")
        await w.until(lambda: w.all_ready("web"), within=30, what="web ready elsewhere")
        readies = [w.rel(p.ready_at) for p in w.pods_of("web") if p.ready_at is not None]
        _, second, third = eviction_times(w, "web")
        # Not a backoff step later (up to 10 s): as soon as the budget had room again.
        for evicted in (second, third):
            assert any(0 <= evicted - ready < 0.05 for ready in readies), (evicted, readies)
        # One Warning per refused pod, naming the budget, however many retries it took.
        warned = [e for e in w.events("EvictionBlocked") if e.warning]
        assert {e.name for e in warned} == {
            e.name for e in warned if "default/web-pdb" in e.message
        }
        assert len(warned) == len({e.name for e in warned}) == 2

    sim.run(body)


def test_a_replace_then_drain_keeps_its_pods_until_the_node_ordered_for_them_is_ready(
    sim: Simulator,
) -> None:
    """No room elsewhere: the pods stay for the whole boot (30 s, past the short hold the
    drain allows the provisioner to act), then go straight onto the new node."""

    async def body(w: World) -> None:
        w.add_nodepool()
        await w.start_controllers()
        w.deploy("web", 3, startup_seconds=5, grace_seconds=5)
        claim = await one_ready_node(w, "web")
        await delete_claim(w, claim)
        claim.deletion_reason = "rebalance_recommendation"  # replace-then-drain, no deadline
        await w.cluster.update_node_claim(claim)
        await w.until(lambda: w.cluster.node_claim(claim.name) is None, within=300, what="gone")
        await w.until(lambda: w.all_ready("web"), within=30, what="web ready elsewhere")
        [replacement] = w.claims()
        ready_at = w.rel(replacement.initialized_at)
        assert all(t >= ready_at for t in eviction_times(w, "web")), ready_at
        moved = w.pods_of("web")
        assert all(p.started_at is not None and p.started_at - p.created_at < 1 for p in moved)

    sim.run(body)


@pytest.mark.parametrize("grace", [5.0, 30.0])
def test_at_the_deadline_the_pods_left_are_deleted_and_counted_lost(
    sim: Simulator, grace: float
) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        await w.start_controllers()
        w.deploy("web", 2, grace_seconds=grace)
        w.pdb("web", min_available=2)  # no eviction can ever be allowed
        claim = await one_ready_node(w, "web")
        node_name = claim.node_name
        deadline = w.elapsed() + 120
        await delete_claim(w, claim, deadline_in=120)
        await w.until(lambda: w.cluster.node(node_name) is None, within=150, what="node gone")
        # The pods were cut short in time for the node to be empty when it must go.
        assert w.elapsed() <= deadline + 0.1
        assert w.cluster.node_claim(claim.name) is None
        assert w.instance(claim).state == "terminated"
        assert w.counter("spotwright_pods_evicted_total", reason="deadline") == 2
        assert (w.ledger.evicted, w.ledger.lost) == (0, 2)

    sim.run(body)


def test_leaving_pods_at_the_deadline_the_drain_keeps_its_pace_until_the_node_goes(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        await w.start_controllers()
        w.deploy("web", 2, grace_seconds=30)
        w.pdb("web", min_available=2)  # no eviction can ever be allowed
        claim = await one_ready_node(w, "web")
        node_name = claim.node_name
        assert node_name is not None
        passes: list[float] = []
        pods_on = w.cluster.pods_on

        def counting(name: str) -> list[Pod]:
            if name == node_name:
                passes.append(w.elapsed())
            return list(pods_on(name))

        w.cluster.pods_on = counting  # type: ignore[method-assign,assignment]
        start = w.elapsed()
        await delete_claim(w, claim, deadline_in=120)
        await w.advance(150)
        # "leave": nothing is forced, the pods stay, and from deadline minus grace on the
        # drain keeps its pace (about twice a second, plus its retries), not 20 times.
        assert w.counter("spotwright_pods_evicted_total", reason="deadline") == 0
        late = [t for t in passes if start + 90 <= t <= start + 150]
        assert len(late) <= 3 * 60

    sim.run(body, settings=Settings(force_at_deadline=False))


DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"


def test_a_do_not_disrupt_pod_is_never_evicted_by_a_drain_without_deadline(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        await w.start_controllers()
        w.deploy("web", 2, grace_seconds=5)
        w.deploy("batch", 1, grace_seconds=5, annotations={DO_NOT_DISRUPT: "true"})
        claim = await one_ready_node(w, "web", "batch")
        [batch] = w.pods_of("batch")
        await delete_claim(w, claim)  # a user's delete or a rebalance: no deadline
        await w.advance(3600)
        assert len(eviction_times(w, "web")) == 2
        assert not batch.terminating and batch.node_name == claim.node_name
        assert w.cluster.node_claim(claim.name) is not None  # the drain waits for it
        [told] = w.events("DisruptionBlocked", batch.key)  # said once, not every pass
        assert "do-not-disrupt" in told.message and not told.warning

    sim.run(body)


def test_at_an_interruption_deadline_a_do_not_disrupt_pod_is_deleted_like_the_rest(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        await w.start_controllers()
        w.deploy("batch", 1, grace_seconds=10, annotations={DO_NOT_DISRUPT: "true"})
        claim = await one_ready_node(w, "batch")
        node_name = claim.node_name
        [batch] = w.pods_of("batch")
        await delete_claim(w, claim, deadline_in=120)
        await w.advance(100)
        assert not batch.terminating  # not evicted while there was time
        await w.until(lambda: w.cluster.node(node_name) is None, within=60, what="node gone")
        assert batch.terminating and not batch.evicted
        assert w.counter("spotwright_pods_evicted_total", reason="deadline") == 1
        assert w.counter("spotwright_pods_evicted_total", reason="drain") == 0

    sim.run(body)


def test_a_do_not_disrupt_duration_protects_a_pod_until_that_long_after_its_start(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        await w.start_controllers()
        w.deploy("young", 1, grace_seconds=0, annotations={DO_NOT_DISRUPT: "30m"})
        w.deploy("old", 1, grace_seconds=0, annotations={DO_NOT_DISRUPT: "1m30s"})
        claim = await one_ready_node(w, "young", "old")
        [young], [old] = w.pods_of("young"), w.pods_of("old")
        await w.advance(120)  # "old" is past its 90 s, "young" has 28 minutes to go
        await delete_claim(w, claim)
        await w.advance(60)
        assert old.evicted and not young.terminating
        await w.until(lambda: young.evicted, within=1800, what="young evicted")
        # counted from when the pod started (status.startTime), not from its creation: it
        # waited for its node to boot first
        assert young.started_at is not None and young.started_at > young.created_at + 5
        assert w.rel(young.deleting_since) == pytest.approx(w.rel(young.started_at) + 1800, abs=1)

    sim.run(body)


def test_a_do_not_disrupt_duration_of_a_pod_with_no_known_start_counts_from_creation(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        await w.start_controllers()
        w.deploy("batch", 1, grace_seconds=0, annotations={DO_NOT_DISRUPT: "10m"})
        claim = await one_ready_node(w, "batch")
        [batch] = w.pods_of("batch")
        batch.started_at = None  # as read from an API object without status.startTime
        await delete_claim(w, claim)
        await w.until(lambda: batch.evicted, within=1800, what="batch evicted")
        assert w.rel(batch.deleting_since) == pytest.approx(w.rel(batch.created_at) + 600, abs=1)

    sim.run(body)


def test_an_invalid_do_not_disrupt_value_is_ignored_with_a_warning_event(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        await w.start_controllers()
        w.deploy("web", 1, grace_seconds=0, annotations={DO_NOT_DISRUPT: "a while"})
        claim = await one_ready_node(w, "web")
        [pod] = w.pods_of("web")
        await delete_claim(w, claim)
        await w.until(lambda: w.cluster.node_claim(claim.name) is None, within=60, what="gone")
        assert pod.evicted
        [warning] = w.events("InvalidDoNotDisrupt", pod.key)
        assert warning.warning and "'a while'" in warning.message

    sim.run(body)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30m", 1800.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        ("300ms", 0.3),
        ("2h45m10s", 9910.0),
        ("1m1m", 120.0),  # Go sums repeated units
        ("0", 0.0),
        ("-5s", -5.0),
        ("10\u00b5s", 1e-5),
    ],
)
def test_go_durations_parse_as_go_parses_them(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "30", "true", "5 m", "1d", "m", "1h-30m", "+"])
def test_strings_go_refuses_are_not_durations(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_go_duration(text)


def test_a_failed_termination_is_logged_counted_and_started_again(
    sim: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        await w.start_controllers()
        w.deploy("web", 1, grace_seconds=0)
        claim = await one_ready_node(w, "web")
        original = w.cluster.remove_node_claim
        failures = [ClusterError("the API server answered 500")] * 2

        async def flaky(name: str) -> None:
            if failures:
                raise failures.pop()
            await original(name)

        monkeypatch.setattr(w.cluster, "remove_node_claim", flaky)
        await delete_claim(w, claim)
        await w.until(lambda: w.cluster.node_claim(claim.name) is None, within=60, what="gone")
        assert w.counter("spotwright_termination_errors_total", reason="ClusterError") == 2
        assert sum("terminating nodeclaim failed, retrying" in line for line in w.log) == 2

    sim.run(body)


def test_evictions_in_flight_are_bounded_across_all_drains(
    sim: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body(w: World) -> None:
        w.add_nodepool(instance_types=["m5.2xlarge"])
        await w.start_controllers()
        w.deploy("web", 24, cpu="1", grace_seconds=0)  # seven pods to a node
        await w.until(lambda: w.all_ready("web"), within=300, what="web ready")
        claims = w.claims()
        assert len(claims) == 4
        original = w.cluster.evict
        evicting = [0, 0]  # now, most at once

        async def slow_evict(pod: Pod) -> None:
            evicting[0] += 1
            evicting[1] = max(evicting[1], evicting[0])
            try:
                await w.clock.sleep(1.0)
                await original(pod)
            finally:
                evicting[0] -= 1

        monkeypatch.setattr(w.cluster, "evict", slow_evict)
        for claim in claims:
            await delete_claim(w, claim)
        names = [c.name for c in claims]
        await w.until(
            lambda: all(w.cluster.node_claim(n) is None for n in names), within=120, what="gone"
        )
        assert evicting[1] == 2  # four drains side by side, yet never more than the bound
        assert w.ledger.evicted == 24

    sim.run(body, settings=Settings(eviction_concurrency=2))
