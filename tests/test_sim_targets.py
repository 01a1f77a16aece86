"""The interruption targets, measured where a user reads them.

Three promises of the interruption work are checked here. On a realistic spot fleet with
35 s node boot (``examples/spot-fleet.yaml``), pods are ready elsewhere soon after a notice
(p50 under 45 s, p99 under 120 s) and none is lost. With a rebalance recommendation 90 s
ahead (``examples/spot-fleet-rebalance.yaml``) the replacement is ready before the first
pod leaves and no workload ever drops below its PodDisruptionBudget. And a budget that
forbids every eviction never makes the drain spin: retries back off from 100 ms to 10 s,
and at the deadline the drain does what it is configured to do. The figures come from the
simulator's summary (``spotwright simulate --json``), so the books that produce them are
tested first, against the in-memory cluster alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Coroutine
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from spotwright.adapters.memory_cluster import MemoryCluster
from spotwright.adapters.virtual_loop import run_virtual
from spotwright.catalog import load_catalog
from spotwright.controllers import Settings
from spotwright.model.objects import Deployment, Node, Pod, PodDisruptionBudget
from spotwright.model.resources import Resources
from spotwright.model.scenario import load_scenario
from spotwright.observability.logs import configure_logging
from spotwright.ports.clock import LoopClock
from spotwright.simulation import simulate
from spotwright.simulation.disruption import budget_floor
from spotwright.simulation.ledger import Ledger

if TYPE_CHECKING:
    from conftest import Simulator, World

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


# ---------------------------------------------------------------------------------------
# The books, against the in-memory cluster alone


class Books:
    """A memory cluster observed by a ledger, on the virtual clock, with two-pod nodes."""

    def __init__(self) -> None:
        self.clock = LoopClock(epoch=0.0)
        self.ledger = Ledger()
        self.cluster = MemoryCluster(self.clock, self.ledger)

    def node(self, name: str) -> Node:
        node = Node(name=name, allocatable=Resources.from_k8s({"cpu": "2", "pods": 10}), ready=True)
        self.cluster.register_node(node)
        self.ledger.node_ready(name, self.clock.now())
        return node

    def deploy(self, name: str, replicas: int, *, startup: float = 10.0) -> None:
        template = Pod(
            name="",
            labels={"app": name},
            requests=Resources.from_k8s({"cpu": "1"}),
            startup_seconds=startup,
            grace_seconds=5.0,
        )
        self.cluster.apply_deployment(Deployment(name=name, replicas=replicas, template=template))

    def pdb(self, app: str, **budget: Any) -> None:
        pdb = PodDisruptionBudget(name=app, selector={"app": app}, **budget)
        self.ledger.track_pdb(pdb, self.clock.now())
        self.cluster.apply_pdb(pdb)

    def on(self, node: str) -> list[Pod]:
        return sorted(self.cluster.pods_on(node), key=lambda p: p.name)

    async def at(self, moment: float) -> None:
        await self.clock.sleep(moment - self.clock.now())


def books_run(body: Callable[[Books], Coroutine[Any, Any, None]]) -> None:
    async def main() -> None:
        await body(Books())

    run_virtual(main())


def test_a_node_whose_pods_wait_for_a_new_node_is_not_replaced_first() -> None:
    async def body(b: Books) -> None:
        b.node("old")
        b.deploy("web", 2)
        await b.at(20)
        b.ledger.notice("old", b.clock.now())
        await b.cluster.patch_node("old", unschedulable=True)
        for pod in b.on("old"):
            await b.cluster.evict(pod)  # no room anywhere: both replacements wait
        await b.at(50)
        b.node("new")
        await b.at(80)
        [moved] = b.ledger.interrupted.nodes.values()
        assert (moved.first_out_at, moved.replacement_ready_at) == (20.0, 50.0)
        assert (moved.moved, moved.waited, moved.longest_wait) == (2, 2, 30.0)
        assert moved.recovered and not moved.replaced_first
        # Ready 10 s (their start-up) after the new node came, 40 s after the notice.
        assert moved.recovery_seconds() == 40.0
        assert b.ledger.recovery == [40.0, 40.0]

    books_run(body)


def test_a_node_whose_replacement_was_ready_first_costs_only_start_up() -> None:
    async def body(b: Books) -> None:
        b.node("old")
        b.deploy("web", 2, startup=5)
        await b.at(20)
        b.ledger.rebalance("old", b.clock.now())
        await b.cluster.patch_node("old", unschedulable=True)
        b.node("new")
        await b.at(60)
        b.ledger.notice("old", b.clock.now())
        for pod in b.on("old"):
            await b.cluster.evict(pod)
        await b.at(90)
        [moved] = b.ledger.interrupted.nodes.values()
        assert (moved.rebalance_at, moved.notice_at, moved.first_out_at) == (20.0, 60.0, 60.0)
        assert moved.replacement_ready_at == 20.0
        assert (moved.waited, moved.replaced_first) == (0, True)
        assert moved.recovery_seconds() == 5.0  # the pods' own start-up and nothing else

    books_run(body)


def test_a_node_that_still_holds_pods_at_the_end_is_not_recovered() -> None:
    async def body(b: Books) -> None:
        b.node("old")
        b.node("spare")
        b.deploy("web", 3)
        await b.at(20)
        b.ledger.notice("old", b.clock.now())
        [first, *_] = b.on("old")
        await b.cluster.evict(first)
        await b.at(60)
        b.ledger.interrupted.close({"old": bool(b.on("old"))})
        [moved] = b.ledger.interrupted.nodes.values()
        assert moved.moved == 1 and moved.stranded
        assert not moved.recovered and moved.recovery_seconds() is None

    books_run(body)


def test_a_budget_is_broken_only_by_a_disruption_not_by_start_up_or_scale_up() -> None:
    async def body(b: Books) -> None:
        b.node("a")
        b.node("b")
        b.pdb("web", min_available=2)
        b.deploy("web", 3)
        await b.at(30)  # below the floor for 10 s while starting: not a drop
        b.cluster.scale("web", 4)  # nor while the new replica starts
        await b.at(60)
        assert b.ledger.budgets.summary()["drops"] == 0
        [victim, *_] = b.on("a")
        await b.cluster.evict(victim)  # allowed: 3 of 4 stay ready, above the floor of 2
        await b.at(62)
        b.cluster.node_lost("b")  # two more go at once: 1 ready, 1 below the floor
        await b.at(100)
        b.ledger.still_pending(b.clock.now())
        summary = b.ledger.budgets.summary()
        assert summary["drops"] == 1
        assert summary["lowest_headroom"] == -1
        # Below from the loss (62 s) until the evicted pod's replacement was ready: it got
        # the slot its predecessor freed after its 5 s grace, and started in 10 s (75 s).
        assert summary["below_seconds"] == pytest.approx(13.0)
        assert summary["by_budget"] == {
            "web": {"below_seconds": pytest.approx(13.0), "drops": 1, "lowest_headroom": -1}
        }

    books_run(body)


@pytest.mark.parametrize(
    ("budget", "expected", "floor"),
    [
        ({"min_available": 2}, 5, 2),
        ({"min_available": "80%"}, 24, 20),
        ({"max_unavailable": "10%"}, 48, 43),  # 4.8 unavailable rounds up to 5
        ({"max_unavailable": 1}, 6, 5),
        ({"max_unavailable": 3}, 2, 0),
    ],
)
def test_budget_floors_round_as_the_disruption_controller_rounds(
    budget: dict[str, Any], expected: int, floor: int
) -> None:
    assert budget_floor(PodDisruptionBudget(name="x", **budget), expected) == floor


# ---------------------------------------------------------------------------------------
# The fleet: recovery after notices, and the rebalance lead


@cache
def fleet(name: str) -> dict[str, Any]:
    configure_logging(sink=lambda _line: None)
    catalog = load_catalog()
    return simulate(load_scenario(EXAMPLES / f"{name}.yaml", catalog), catalog)


@pytest.mark.scenario
def test_after_a_notice_evicted_pods_are_ready_elsewhere_within_the_targets() -> None:
    s = fleet("spot-fleet")
    intr, pods = s["interruptions"], s["pods"]
    assert intr["notices"] >= 30, "enough notices for a p50 and a p99"
    assert s["nodes"]["peak"] <= 40
    assert intr["drained_before_deadline"] == intr["notices"]
    assert (intr["lost_before_drained"], intr["not_recovered"], pods["lost"]) == (0, 0, 0)
    # Each evicted pod, from the notice until it is ready elsewhere (35 s boot).
    assert pods["recovery_p50_seconds"] < 45
    assert pods["recovery_p99_seconds"] < 120
    # Each notice, until the last of its node's pods is: well within the 2-minute notice.
    assert pods["notice_recovery_p99_seconds"] < 120
    assert all(n["recovery_seconds"] < 120 for n in intr["per_node"])
    assert s["disruption_budgets"]["drops"] == 0


@pytest.mark.scenario
def test_with_a_rebalance_lead_no_workload_drops_below_its_budget_and_none_is_lost() -> None:
    s = fleet("spot-fleet-rebalance")
    intr, pods, budgets = s["interruptions"], s["pods"], s["disruption_budgets"]
    assert intr["rebalance_recommendations"] >= 30
    assert pods["lost"] == 0 and intr["lost_before_drained"] == 0
    assert intr["not_recovered"] == 0
    assert (budgets["below_seconds"], budgets["drops"]) == (0.0, 0)
    assert budgets["lowest_headroom"] is not None and budgets["lowest_headroom"] >= 0
    # Drained before the notice, or within seconds of it: nobody waits for a boot.
    assert pods["notice_recovery_p99_seconds"] < 10
    plain = fleet("spot-fleet")
    assert pods["waited_for_node"] * 10 < plain["pods"]["waited_for_node"]
    assert intr["replaced_before_first_eviction"] >= 0.9 * intr["nodes_with_pods_moved"]
    assert s["availability_pct"] > plain["availability_pct"]


@pytest.mark.scenario
def test_with_a_rebalance_lead_every_replacement_is_ready_before_the_first_eviction() -> None:
    s = fleet("spot-fleet-rebalance")
    intr = s["interruptions"]
    assert intr["replaced_before_first_eviction"] == intr["nodes_with_pods_moved"]
    assert s["pods"]["waited_for_node"] == 0


def test_the_summary_is_the_same_run_after_run() -> None:
    configure_logging(sink=lambda _line: None)
    catalog = load_catalog()
    scenario = load_scenario(EXAMPLES / "spot-fleet.yaml", catalog)
    first = simulate(scenario, catalog, until=1200)
    assert first["interruptions"]["per_node"], "the window holds notices"
    assert simulate(scenario, catalog, until=1200) == first


# ---------------------------------------------------------------------------------------
# A budget that forbids every eviction


def max_attempts(window: float, low: float, high: float) -> int:
    """Eviction attempts that backoff from ``low`` doubling to ``high`` allows in ``window``."""
    attempts, elapsed, delay = 1, 0.0, low
    while elapsed + delay <= window + 1e-9:
        elapsed += delay
        attempts += 1
        delay = min(delay * 2, high)
    return attempts


async def forbidden_drain(w: World) -> tuple[str, dict[str, int], float]:
    """Two pods under a budget that allows no eviction, on a node the market interrupts.

    Returns the node, eviction attempts per pod and the notice time (elapsed seconds).
    """
    w.add_nodepool()
    await w.start_controllers(interruptions=True)
    w.deploy("web", 2, grace_seconds=20)
    w.pdb("web", min_available=2)
    await w.until(lambda: w.all_ready("web"), within=120, what="web ready")
    [claim] = w.claims()
    attempts: dict[str, int] = {}
    evict = w.cluster.evict

    async def counting(pod: Pod) -> None:
        attempts[pod.key] = attempts.get(pod.key, 0) + 1
        await evict(pod)

    w.cluster.evict = counting  # type: ignore[method-assign]
    [hit] = w.market.interrupt(1)
    assert hit.provider_id == claim.provider_id
    notice = w.elapsed()
    node = claim.node_name
    assert node is not None
    await w.until(lambda: w.cluster.node(node) is None, within=200, what="node gone")
    return node, attempts, notice


@pytest.mark.parametrize("force", [True, False], ids=["force", "leave"])
def test_a_budget_that_forbids_eviction_gets_backoff_then_the_deadline_behaviour(
    sim: Simulator, force: bool
) -> None:
    """The force case's outcome is also in test_drain.py (deadline without a notice);
    here the notice comes from the market and the attempts are counted."""

    async def body(w: World) -> None:
        node, attempts, notice = await forbidden_drain(w)
        gone = w.elapsed()
        settings = w.ctx.settings
        # Tried until the deadline, never faster than the backoff allows: no spin.
        bound = max_attempts(gone - notice, settings.eviction_backoff_min, 10.0)
        assert len(attempts) == 2
        for key, count in attempts.items():
            assert 8 <= count <= bound, (key, count, bound)
        assert w.counter("spotwright_eviction_blocked_total") == sum(attempts.values())
        if force:
            # Deleted in time for their grace to end at the deadline, then counted lost.
            assert w.counter("spotwright_pods_evicted_total", reason="deadline") == 2
            assert w.counter("spotwright_nodes_drained_total", result="before_deadline") == 1
        else:
            # Left where they were: they went down with the instance, at the deadline.
            assert w.counter("spotwright_pods_evicted_total", reason="deadline") == 0
            assert w.counter("spotwright_nodes_drained_total", result="deadline_exceeded") == 1
            assert gone - notice == pytest.approx(120, abs=1)
        assert (w.ledger.evicted, w.ledger.lost) == (0, 2)
        await w.until(lambda: w.all_ready("web"), within=120, what="web ready elsewhere")
        assert not w.events("Evicted")
        assert w.instance(w.claim_history[0]).state == "terminated"
        assert node not in {n.name for n in w.cluster.nodes()}

    sim.run(
        body,
        settings=Settings(force_at_deadline=force),
        boot_seconds=35.0,
        forward_events=True,
    )


def test_a_budget_that_forbids_eviction_is_named_in_one_warning_event_per_pod(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        _, attempts, _ = await forbidden_drain(w)
        told = [
            e
            for e in w.cluster.events
            if e.warning and "disruption budget" in e.message and "web" in e.message
        ]
        # Said, and said once per pod rather than once per refused attempt.
        assert told
        assert len(told) <= len(attempts)

    sim.run(body, boot_seconds=35.0, forward_events=True)


def test_max_attempts_follows_the_backoff() -> None:
    # 0.1 + 0.2 + 0.4 + ... + 6.4 = 12.7 s for the first 8 attempts, then one per 10 s.
    assert max_attempts(12.7, 0.1, 10.0) == 8
    assert max_attempts(120.0, 0.1, 10.0) == 18
    assert max_attempts(0.05, 0.1, 10.0) == 1
    assert math.isclose(sum(0.1 * 2**i for i in range(7)), 12.7)
