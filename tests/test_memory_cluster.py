"""The in-memory cluster behaves like the Kubernetes the controllers will meet live.

It stands in for kube-scheduler, the kubelet, the ReplicaSet controller and the Eviction API
with PodDisruptionBudgets. If it binds a pod where Kubernetes would not, or lets an eviction
through that a budget forbids, every simulated availability figure is wrong, so each rule
is checked here on its own, in simulated time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import pytest

from spotwright.model import labels as wk
from spotwright.model.objects import NodeSelectorRequirement, Taint, Toleration
from spotwright.ports.cluster import EvictionBlocked, WatchEvent

if TYPE_CHECKING:
    from conftest import Simulator, World


def where(world: World, app: str) -> list[str | None]:
    """The node of each live pod of ``app``, oldest pod first (None: not bound)."""
    return [p.node_name for p in world.pods_of(app)]


# -- kube-scheduler ---------------------------------------------------------------------


def test_pods_bind_only_while_cpu_and_memory_are_left(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_node("small", cpu="2", memory="4Gi")
        w.deploy("cpu", 3, cpu="800m", memory="100Mi")
        w.deploy("mem", 3, cpu="10m", memory="1500Mi")
        await w.advance(1)
        assert where(w, "cpu") == ["small", "small", None]
        assert where(w, "mem") == ["small", "small", None]
        assert [p.unschedulable for p in w.pods_of("cpu")] == [False, False, True]
        assert [p.unschedulable for p in w.pods_of("mem")] == [False, False, True]
        w.add_node("more", cpu="2", memory="4Gi")
        await w.advance(1)
        assert where(w, "cpu")[2] == where(w, "mem")[2] == "more"
        assert not any(p.unschedulable for p in w.cluster.pods())

    sim.run(body)


def test_gpu_pods_need_a_free_gpu(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_node("cpu-only", cpu="16", memory="64Gi")
        w.add_node("gpu", cpu="8", memory="32Gi", gpu=1)
        w.deploy("train", 2, cpu="1", memory="1Gi", gpu=1)
        await w.advance(1)
        assert where(w, "train") == ["gpu", None]
        assert w.pods_of("train")[1].unschedulable

    sim.run(body)


def test_max_pods_is_a_hard_limit_even_for_pods_without_requests(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_node("tiny", cpu="16", memory="64Gi", max_pods=3)
        w.deploy("sidecarless", 5, cpu="0", memory="0")
        await w.advance(1)
        assert where(w, "sidecarless").count("tiny") == 3
        assert sum(p.unschedulable for p in w.pods_of("sidecarless")) == 2

    sim.run(body)


def test_node_selector_and_required_node_affinity_choose_the_node(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_node("in-a", labels={wk.ZONE: "us-east-1a"})
        w.add_node("in-b", labels={wk.ZONE: "us-east-1b", "disk": "ssd"})
        w.deploy("selects-b", 2, node_selector={wk.ZONE: "us-east-1b"})
        in_a = (NodeSelectorRequirement(wk.ZONE, "In", ("us-east-1a",)),)
        w.deploy("affine-to-a", 2, required_affinity=(in_a,))
        hdd = (NodeSelectorRequirement("disk", "In", ("hdd",)),)
        w.deploy("wants-hdd", 1, required_affinity=(hdd,))
        await w.advance(1)
        assert where(w, "selects-b") == ["in-b", "in-b"]
        assert where(w, "affine-to-a") == ["in-a", "in-a"]
        assert where(w, "wants-hdd") == [None]
        assert w.pods_of("wants-hdd")[0].unschedulable

    sim.run(body)


def test_taints_keep_away_pods_that_do_not_tolerate_them(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_node("gpu-only", taints=[Taint("dedicated", "NoSchedule", "gpu")])
        w.add_node("soft", taints=[Taint("spot", "PreferNoSchedule")])
        w.deploy("plain", 1, cpu="3")
        w.deploy("tolerant", 1, cpu="3", tolerations=(Toleration("dedicated", "Equal", "gpu"),))
        w.deploy("wrong-value", 1, cpu="3", tolerations=(Toleration("dedicated", "Equal", "x"),))
        await w.advance(1)
        assert where(w, "tolerant") == ["gpu-only"]
        # A PreferNoSchedule taint is a preference: it never keeps a pod pending.
        assert where(w, "plain") == ["soft"]
        assert where(w, "wrong-value") == [None]

    sim.run(body)


def test_cordoned_and_not_ready_nodes_get_no_pods_until_that_changes(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_node("cordoned", unschedulable=True)
        w.add_node("booting", ready=False)
        w.deploy("web", 2, cpu="3")
        await w.advance(5)
        assert where(w, "web") == [None, None]
        assert all(p.unschedulable for p in w.pods_of("web"))
        w.cluster.set_node_ready("booting")
        await w.advance(1)
        assert sorted(where(w, "web"), key=str) == [None, "booting"]
        await w.cluster.patch_node("cordoned", unschedulable=False)
        await w.advance(1)
        assert sorted(where(w, "web"), key=str) == ["booting", "cordoned"]

    sim.run(body)


def test_cordoning_a_node_leaves_its_pods_running(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_node("a")
        w.deploy("web", 2)
        await w.until(lambda: w.all_ready("web"), within=5, what="web ready")
        await w.cluster.patch_node("a", unschedulable=True)
        w.cluster.scale("web", 3)
        await w.advance(5)
        assert where(w, "web") == ["a", "a", None]
        assert w.ready("web") == 2

    sim.run(body)


# -- kubelet ------------------------------------------------------------------------------


def test_a_pod_is_ready_startup_seconds_after_it_is_bound(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.deploy("slow", 1, startup_seconds=20)
        await w.advance(10)
        w.add_node("late")  # bound at t=10
        await w.advance(19.9)
        pod = w.pods_of("slow")[0]
        assert pod.node_name == "late" and not pod.ready
        await w.advance(0.2)
        assert pod.ready
        assert w.rel(pod.ready_at) == pytest.approx(30.0)

    sim.run(body)


def test_an_evicted_pod_is_gone_after_its_grace_period_and_counts_as_evicted(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        w.add_node("a")
        w.deploy("web", 1, grace_seconds=45)
        await w.until(lambda: w.all_ready("web"), within=5, what="web ready")
        pod = w.pods_of("web")[0]
        await w.cluster.evict(pod)
        assert pod.terminating and not pod.ready
        await w.advance(44.9)
        assert w.cluster.pod(pod.key) is pod
        await w.advance(0.2)
        assert w.cluster.pod(pod.key) is None
        assert (w.ledger.evicted, w.ledger.lost) == (1, 0)

    sim.run(body)


def test_deleting_a_pod_with_less_than_its_grace_counts_it_lost(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_node("a")
        w.deploy("web", 2, grace_seconds=30)
        await w.until(lambda: w.all_ready("web"), within=5, what="web ready")
        cut_short, full = w.pods_of("web")
        await w.cluster.delete_pod(cut_short, grace_seconds=5)
        await w.cluster.delete_pod(full)
        await w.advance(31)
        assert w.cluster.pod(cut_short.key) is None and w.cluster.pod(full.key) is None
        # Deleted, not evicted: only the pod that lost part of its grace period is lost.
        assert (w.ledger.evicted, w.ledger.lost) == (0, 1)

    sim.run(body)


def test_node_lost_kills_its_pods_counts_them_lost_and_replaces_them(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_node("doomed")
        w.deploy("web", 2)
        w.deploy("agent", 1, daemon=True, node_selector={wk.HOSTNAME: "doomed"})
        await w.until(lambda: w.all_ready("web", "agent"), within=5, what="all ready")
        before = {p.key for p in w.cluster.pods()}
        w.cluster.node_lost("doomed")
        assert w.cluster.node("doomed") is None
        assert not before & {p.key for p in w.cluster.pods()}
        # Daemon pods die with their node but are not workload that was lost.
        assert w.ledger.lost == 2
        assert where(w, "web") == [None, None]
        w.add_node("spare")
        await w.advance(1)
        assert where(w, "web") == ["spare", "spare"]

    sim.run(body)


# -- ReplicaSet controller ---------------------------------------------------------------


def test_a_replacement_is_created_as_soon_as_a_pod_starts_terminating(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_node("a")
        w.deploy("web", 2, grace_seconds=30)
        await w.until(lambda: w.all_ready("web"), within=5, what="web ready")
        victim = w.pods_of("web")[0]
        await w.cluster.evict(victim)
        live = w.pods_of("web")
        assert len(live) == 2 and victim not in live
        assert len(w.cluster.pods()) == 3  # the victim is still shutting down
        await w.advance(1)
        assert w.all_ready("web")

    sim.run(body)


def test_scale_up_and_down_removes_pending_then_unready_then_newest(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_node("a", cpu="1500m")
        w.deploy("web", 1, cpu="500m", startup_seconds=10)
        await w.advance(1)
        w.cluster.scale("web", 2)
        await w.until(lambda: w.all_ready("web"), within=15, what="web ready")
        oldest, newer = w.pods_of("web")
        w.cluster.scale("web", 6)  # 1 more fits (not ready for 10 s), 3 stay pending
        await w.advance(1)
        assert len(w.pods_of("web")) == 6
        assert where(w, "web").count(None) == 3
        w.cluster.scale("web", 3)  # the three pending pods go first
        survivors = w.pods_of("web")
        assert survivors[:2] == [oldest, newer] and len(survivors) == 3
        assert survivors[2].node_name == "a" and not survivors[2].ready
        w.cluster.scale("web", 1)  # then the one not ready, then the newer ready one
        assert w.pods_of("web") == [oldest]
        await w.advance(31)
        assert len(w.cluster.pods()) == 1 and w.ready("web") == 1

    sim.run(body)


# -- Eviction API and PodDisruptionBudgets -----------------------------------------------


@pytest.mark.parametrize(
    ("replicas", "budget", "allowed"),
    [
        (3, {"min_available": 2}, 1),
        (4, {"min_available": "50%"}, 2),
        (5, {"min_available": "50%"}, 2),  # 50 % of 5 rounds up to 3 that must stay
        (3, {"max_unavailable": 1}, 1),
        (4, {"max_unavailable": "50%"}, 2),
        (5, {"max_unavailable": "30%"}, 2),  # 30 % of 5 rounds up to 2
        (3, {"min_available": 3}, 0),
        (3, {"max_unavailable": 0}, 0),
    ],
)
def test_evictions_stop_where_the_budget_would_be_violated(
    sim: Simulator, replicas: int, budget: dict[str, int | str], allowed: int
) -> None:
    async def body(w: World) -> None:
        w.add_node("a", cpu="8")
        w.deploy("web", replicas, cpu="100m", grace_seconds=30)
        w.pdb("web", **budget)
        await w.until(lambda: w.all_ready("web"), within=5, what="web ready")
        originals = w.pods_of("web")
        evicted = 0
        for pod in originals:
            try:
                await w.cluster.evict(pod)
            except EvictionBlocked as exc:
                assert "disruption budget" in str(exc)
                continue
            evicted += 1
        assert evicted == allowed
        assert sum(1 for p in originals if p.terminating) == allowed

    sim.run(body)


def test_a_blocked_eviction_goes_through_once_a_replacement_is_ready(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_node("a", cpu="8")
        w.deploy("web", 3, cpu="100m", startup_seconds=20, grace_seconds=5)
        w.pdb("web", min_available=2)
        await w.until(lambda: w.all_ready("web"), within=25, what="web ready")
        first, second, _ = w.pods_of("web")
        await w.cluster.evict(first)
        with pytest.raises(EvictionBlocked):
            await w.cluster.evict(second)
        await w.advance(19)
        with pytest.raises(EvictionBlocked):
            await w.cluster.evict(second)
        await w.advance(2)  # the replacement of the first pod is ready
        await w.cluster.evict(second)
        assert second.terminating

    sim.run(body)


def test_an_unready_pod_may_go_while_the_budget_holds(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_node("a", cpu="8")
        w.deploy("web", 3, cpu="100m", startup_seconds=60)
        w.pdb("web", min_available=3)
        await w.advance(1)
        # None ready: the budget (3 healthy) is not met, so not even a starting pod may go.
        with pytest.raises(EvictionBlocked):
            await w.cluster.evict(w.pods_of("web")[0])
        w.cluster.scale("web", 4)
        await w.until(lambda: w.ready("web") == 3, within=70, what="three ready")
        starting = next(p for p in w.pods_of("web") if not p.ready)
        await w.cluster.evict(starting)  # healthy stays at 3: allowed
        assert starting.terminating

    sim.run(body)


def test_pods_no_budget_selects_are_evicted_freely(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_node("a", cpu="8")
        w.deploy("web", 2, cpu="100m")
        w.deploy("batch", 2, cpu="100m")
        w.pdb("web", min_available=2)
        await w.until(lambda: w.all_ready("web", "batch"), within=5, what="ready")
        batch = w.pods_of("batch")
        for pod in batch:
            await w.cluster.evict(pod)
        assert all(p.terminating and p.evicted for p in batch)

    sim.run(body)


# -- watch --------------------------------------------------------------------------------


async def collect(subscription: AsyncIterator[WatchEvent]) -> list[WatchEvent]:
    """Everything delivered so far, without waiting for more."""
    out: list[WatchEvent] = []
    while True:
        try:
            out.append(await asyncio.wait_for(anext(subscription), 0.01))
        except TimeoutError:
            return out


def test_watch_delivers_the_changes_of_the_kinds_asked_for(sim: Simulator) -> None:
    async def body(w: World) -> tuple[list[WatchEvent], list[WatchEvent], str, str]:
        nodes = w.cluster.watch("node")
        pods = w.cluster.watch("pod")
        w.add_node("a", ready=False)
        w.cluster.set_node_ready("a")
        w.deploy("web", 1, startup_seconds=5, grace_seconds=10)
        await w.advance(6)  # bound, then ready
        first = w.pods_of("web")[0]
        await w.cluster.evict(first)  # terminating; a replacement is created and bound
        second = w.pods_of("web")[0]
        await w.advance(11)  # the first is gone
        w.cluster.node_lost("a")
        return await collect(nodes), await collect(pods), first.key, second.key

    nodes, pods, first, second = sim.run(body)
    assert nodes == [
        WatchEvent("node", "ADDED", "a"),
        WatchEvent("node", "MODIFIED", "a"),
        WatchEvent("node", "DELETED", "a"),
    ]
    assert [e.type for e in pods if e.name == first] == [
        "ADDED",  # created
        "MODIFIED",  # bound
        "MODIFIED",  # ready
        "MODIFIED",  # terminating
        "DELETED",  # grace period over
    ]
    second_types = [e.type for e in pods if e.name == second]
    assert (second_types[0], second_types[-1]) == ("ADDED", "DELETED")  # with its node


def test_a_closed_or_cancelled_watch_stops_collecting_events(sim: Simulator) -> None:
    """A controller that stops iterating must not leave a queue behind that grows with
    every later change (adapters._watch, shared by the live cluster)."""

    async def body(w: World) -> tuple[int, int, int]:
        kept = w.cluster.watch("node")
        closed = w.cluster.watch("node")
        cancelled = w.cluster.watch("node")
        closed.close()  # type: ignore[attr-defined]
        closed.close()  # type: ignore[attr-defined]  # twice is harmless
        waiting = asyncio.create_task(anext(cancelled))
        await asyncio.sleep(0)
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        for name in ("a", "b", "c"):
            w.add_node(name)
        return len(await collect(kept)), len(await collect(closed)), len(await collect(cancelled))

    assert sim.run(body) == (3, 0, 0)
