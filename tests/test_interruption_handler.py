"""Queue-mode interruption handling: each EventBridge message leads to the right action, once.

A spot interruption warning must taint and cordon the node at once and turn into a drain
bounded by the notice's deadline and an avoided pool; its message must stay in flight until
the drain is over, so that a crash in between loses nothing; a message about someone
else's instance must be left for its owner; garbage must not block the queue; a notice
delivered twice, out of order, or again after a restart must act once; a thousand notices
at once are handled side by side; and the rebalance action setting must do exactly what it
says. Messages have the exact shape EventBridge delivers
(built by the simulated market's own event builders) and go through the in-memory queue,
with the real provisioner, lifecycle and termination controllers behind the handler.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import pytest

from spotwright.adapters import _market_signals as signals
from spotwright.controllers import InterruptionHandler, Settings
from spotwright.controllers.nodegroups import NodeGroupController
from spotwright.controllers.ownership import InstanceIndex
from spotwright.model import labels as wk
from spotwright.model.nodegroup import NodeGroup
from spotwright.model.objects import NodeClaim
from spotwright.ports.cloud import Instance, Offering
from spotwright.ports.queue import Message

if TYPE_CHECKING:
    from conftest import Simulator, World

_RNG = random.Random(7)
LB_LABEL = "node.kubernetes.io/exclude-from-external-load-balancers"


def instance_id(claim: NodeClaim) -> str:
    return claim.provider_id.rsplit("/", 1)[-1]


def spot_warning(w: World, instance: str) -> dict[str, Any]:
    now = w.clock.now()
    return signals.spot_interruption_warning(
        _RNG, now=now, region=w.market.region, instance_id=instance
    )


def rebalance(w: World, instance: str) -> dict[str, Any]:
    now = w.clock.now()
    return signals.rebalance_recommendation(
        _RNG, now=now, region=w.market.region, instance_id=instance
    )


async def running(w: World, app: str, replicas: int = 2, **template: Any) -> NodeClaim:
    """Controllers up, ``app`` ready on one node; its claim."""
    w.add_nodepool()
    await w.start_controllers(interruptions=True)
    w.deploy(app, replicas, **template)
    await w.until(lambda: w.all_ready(app), within=120, what=f"{app} ready")
    [claim] = w.claims()
    return claim


def test_a_spot_warning_deletes_the_claim_with_the_notice_deadline_and_avoids_the_pool(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        claim = await running(w, "web")
        sent_at = w.clock.now()
        w.queue.put(spot_warning(w, instance_id(claim)))
        await w.advance(0.01)
        assert claim.deleting_since is not None
        assert claim.deletion_reason == "spot_interruption"
        # EventBridge times have whole seconds; EC2 acts 120 s after the event's time.
        assert claim.drain_deadline == math.floor(sent_at) + 120
        pool = Offering(claim.instance_type, claim.zone, wk.SPOT, claim.price)
        assert w.ctx.unavailable.is_unavailable(pool, w.clock.now())
        # Tainted, cordoned and out of the load balancers at receipt, with one patch.
        node = w.cluster.node(claim.node_name)
        assert node is not None and node.unschedulable and node.labels[LB_LABEL] == "spotwright"
        assert any(t.key == wk.DISRUPTED_TAINT_KEY for t in node.taints)
        assert w.counter("spotwright_interruption_receipt_to_taint_seconds_count") == 1
        assert w.events("InstanceInterrupted", claim.node_name)
        # The message stays in flight until the drain is over.
        assert (w.queue.deleted, w.queue.in_flight) == (0, 1)
        await w.until(lambda: w.cluster.node_claim(claim.name) is None, within=120, what="gone")
        await w.until(lambda: w.queue.deleted == 1, within=2, what="message deleted")
        assert len(w.queue) == 0
        assert len(w.events("Cordoned", node.name)) == 1  # the termination did not patch again
        await w.until(lambda: w.all_ready("web"), within=120, what="web ready elsewhere")
        replacement = w.claims()[0]
        assert (replacement.instance_type, replacement.zone) != (claim.instance_type, claim.zone)
        assert (w.ledger.evicted, w.ledger.lost) == (2, 0)
        kind = "spot_interruption"
        assert w.counter("spotwright_interruption_received_messages_total", kind=kind) == 1

    sim.run(body)


def test_a_message_about_an_instance_we_do_not_own_is_released_for_its_owner(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        claim = await running(w, "web")
        w.queue.put(spot_warning(w, "i-0123456789abcdef0"))
        # Released, not deleted: it comes back until the queue's redrive moves it aside.
        await w.until(lambda: bool(w.queue.dead_letters), within=300, what="dead-lettered")
        assert w.queue.deleted == 0
        assert claim.deleting_since is None and w.cluster.node_claim(claim.name) is claim
        assert w.counter("spotwright_interruption_actions_performed_total", action="drain") == 0

    sim.run(body)


@pytest.mark.parametrize(
    ("body_text", "reason"),
    [
        ("this is not json", "MalformedEvent"),
        (
            json.dumps(
                {
                    "version": "0",
                    "id": "5f2b6c1e-0000-4000-8000-000000000001",
                    "detail-type": "EC2 Spot Instance Interruption Warning",
                    "source": "aws.ec2",
                    "time": "2026-01-01T00:01:00Z",
                    "detail": {"instance-action": "terminate"},
                }
            ),
            "MalformedEvent",
        ),
        (
            json.dumps(
                {
                    "version": "0",
                    "id": "5f2b6c1e-0000-4000-8000-000000000002",
                    "detail-type": "Object Created",
                    "source": "aws.s3",
                    "time": "2026-01-01T00:01:00Z",
                    "detail": {"bucket": {"name": "logs"}},
                }
            ),
            "UnknownEvent",
        ),
    ],
)
def test_a_message_that_cannot_be_parsed_is_deleted_counted_and_does_not_stop_the_handler(
    sim: Simulator, body_text: str, reason: str
) -> None:
    async def body(w: World) -> None:
        claim = await running(w, "web")
        w.queue.put(body_text)
        await w.advance(1)
        assert (w.queue.deleted, len(w.queue)) == (1, 0)
        assert w.counter("spotwright_interruption_message_errors_total", reason=reason) == 1
        w.queue.put(spot_warning(w, instance_id(claim)))
        await w.advance(1)
        assert claim.deleting_since is not None

    sim.run(body)


def test_a_notice_delivered_twice_acts_once_and_every_copy_goes_with_the_drain(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        claim = await running(w, "web")
        notice = spot_warning(w, instance_id(claim))
        w.queue.put(notice)
        w.queue.put(notice)  # SQS delivers at least once: both arrive in one batch
        await w.advance(1)
        first_deleted_at = claim.deleting_since
        await w.advance(5)
        w.queue.put(notice)
        await w.advance(1)
        assert claim.deleting_since == first_deleted_at
        assert (w.queue.deleted, w.queue.in_flight) == (0, 3)
        await w.until(lambda: w.queue.deleted == 3, within=120, what="copies deleted")
        assert w.cluster.node_claim(claim.name) is None
        # Once more after the claim is gone: recognised as ours, deleted, not released.
        w.queue.put(notice)
        await w.advance(1)
        assert (w.queue.deleted, len(w.queue), w.queue.dead_letters) == (4, 0, [])
        assert w.counter("spotwright_interruption_actions_performed_total", action="drain") == 1
        kind = "spot_interruption"
        assert w.counter("spotwright_interruption_received_messages_total", kind=kind) == 1

    sim.run(body)


Action = Literal["none", "cordon", "replace-then-drain"]


@pytest.mark.parametrize("action", ["none", "cordon", "replace-then-drain"])
def test_a_rebalance_recommendation_does_what_the_setting_says(
    sim: Simulator, action: Action
) -> None:
    async def body(w: World) -> None:
        claim = await running(w, "web")
        node = w.cluster.node(claim.node_name)
        assert node is not None
        pods = w.pods_of("web")
        w.queue.put(rebalance(w, instance_id(claim)))
        await w.advance(1)
        # Nothing left to wait for but with replace-then-drain, whose drain is still ahead.
        assert w.queue.deleted == (0 if action == "replace-then-drain" else 1)
        tainted = any(t.key == wk.DISRUPTED_TAINT_KEY for t in node.taints)
        if action == "none":
            await w.advance(60)
            assert not node.unschedulable and not tainted
            assert claim.deleting_since is None
            assert w.pods_of("web") == pods and len(w.claim_history) == 1
        elif action == "cordon":
            await w.advance(60)
            assert node.unschedulable and not tainted  # cordoned, not drained
            assert claim.deleting_since is None
            assert w.pods_of("web") == pods and all(p.ready for p in pods)
            assert len(w.claim_history) == 1
        else:
            # Replacement first: tainted so the pods count as pending, drained later.
            assert tainted and claim.deleting_since is None
            assert all(p.ready for p in pods)
            await w.until(lambda: claim.deleting_since is not None, within=180, what="drain")
            assert claim.drain_deadline is None
            replacement = w.claim_history[-1]
            assert replacement.name != claim.name and replacement.initialized_at is not None
            await w.until(lambda: w.cluster.node_claim(claim.name) is None, within=120, what="gone")
            await w.until(lambda: w.queue.deleted == 1, within=2, what="message deleted")
            await w.until(lambda: w.all_ready("web"), within=60, what="web ready elsewhere")
            assert (w.ledger.evicted, w.ledger.lost) == (2, 0)

    sim.run(body, settings=Settings(rebalance_action=action))


def test_a_warning_after_a_rebalance_drain_bounds_it_by_the_deadline(sim: Simulator) -> None:
    async def body(w: World) -> None:
        claim = await running(w, "web", grace_seconds=10)
        w.pdb("web", min_available=2)  # the rebalance drain can never evict anything
        w.queue.put(rebalance(w, instance_id(claim)))
        await w.advance(30)
        assert claim.deleting_since is not None and claim.drain_deadline is None
        assert w.ledger.evicted == 0 and w.cluster.node(claim.node_name) is not None
        w.queue.put(spot_warning(w, instance_id(claim)))
        await w.advance(1)
        deadline = claim.drain_deadline
        assert deadline is not None
        await w.until(lambda: w.cluster.node_claim(claim.name) is None, within=150, what="gone")
        assert w.clock.now() <= deadline + 0.1
        assert w.counter("spotwright_pods_evicted_total", reason="deadline") == 2

    sim.run(body, settings=Settings(rebalance_action="replace-then-drain"))


def test_a_rebalance_for_a_node_already_gone_does_not_stop_the_handler(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_nodepool(instance_types=["c5.large"])
        await w.start_controllers(interruptions=True)
        w.deploy("web", 2, cpu="1500m")  # one pod per node
        await w.until(lambda: w.all_ready("web"), within=120, what="web ready")
        first, second = w.claims()
        w.cluster.node_lost(first.node_name)  # someone deleted the Node object
        w.queue.put(rebalance(w, instance_id(first)))
        await w.advance(1)
        w.queue.put(spot_warning(w, instance_id(second)))
        await w.advance(1)
        assert second.deleting_since is not None
        # The cordon is done and its message gone; the warning's waits for the drain.
        assert (w.queue.deleted, w.queue.in_flight) == (1, 1)
        await w.until(lambda: w.queue.deleted == 2, within=120, what="message deleted")

    sim.run(body, settings=Settings(rebalance_action="cordon"))


def times_received(w: World) -> int:
    return sum("interruption received" in line for line in w.log)


async def handler(w: World) -> asyncio.Task[None]:
    """An interruption handler of its own, to be killed and replaced as a process would be."""
    task = asyncio.create_task(InterruptionHandler(w.ctx, w.queue).run())
    await asyncio.sleep(0)
    return task


async def held_up_drain(w: World) -> NodeClaim:
    """Controllers without a handler; ``web`` on one node under a budget forbidding eviction."""
    w.add_nodepool()
    await w.start_controllers()
    w.deploy("web", 2, grace_seconds=10)
    w.pdb("web", min_available=2)
    await w.until(lambda: w.all_ready("web"), within=120, what="web ready")
    [claim] = w.claims()
    return claim


def test_the_message_stays_in_flight_through_a_long_drain_without_coming_back(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        claim = await held_up_drain(w)
        first = await handler(w)
        w.queue.put(spot_warning(w, instance_id(claim)))
        # Longer than the queue's 30 s visibility timeout and the handler's 60 s.
        await w.advance(100)
        assert w.cluster.node_claim(claim.name) is not None  # the budget holds the drain
        assert (w.queue.deleted, w.queue.in_flight) == (0, 1)
        await w.until(lambda: w.cluster.node_claim(claim.name) is None, within=60, what="gone")
        await w.until(lambda: w.queue.deleted == 1, within=2, what="message deleted")
        assert times_received(w) == 1  # kept in flight all along, never delivered again
        first.cancel()

    sim.run(body)


def test_after_a_restart_the_message_comes_back_finds_the_drain_under_way_and_waits(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        claim = await held_up_drain(w)
        first = await handler(w)
        w.queue.put(spot_warning(w, instance_id(claim)))
        await w.advance(1)
        deleting_since, deadline = claim.deleting_since, claim.drain_deadline
        assert deleting_since is not None
        first.cancel()  # the process dies: the message is neither deleted nor released
        second = await handler(w)  # a new process, which has seen nothing
        await w.until(lambda: times_received(w) == 2, within=61, what="delivered again")
        assert (claim.deleting_since, claim.drain_deadline) == (deleting_since, deadline)
        assert (w.queue.deleted, w.queue.in_flight) == (0, 1)
        await w.until(lambda: w.cluster.node_claim(claim.name) is None, within=120, what="gone")
        await w.until(lambda: w.queue.deleted == 1, within=2, what="message deleted")
        assert w.counter("spotwright_interruption_actions_performed_total", action="drain") == 1
        assert w.queue.dead_letters == [] and len(w.queue) == 0
        second.cancel()

    sim.run(body)


def test_after_a_restart_a_message_whose_claim_is_gone_is_deleted_not_released(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        await w.start_controllers()
        w.deploy("web", 2, grace_seconds=0)
        await w.until(lambda: w.all_ready("web"), within=120, what="web ready")
        [claim] = w.claims()
        first = await handler(w)
        w.queue.put(spot_warning(w, instance_id(claim)))
        await w.advance(0.5)
        first.cancel()  # dies before the drain ends
        await w.until(lambda: w.cluster.node_claim(claim.name) is None, within=60, what="gone")
        second = await handler(w)  # never saw the claim: the cloud says whose it was
        await w.until(lambda: w.queue.deleted == 1, within=61, what="message deleted")
        assert w.queue.dead_letters == [] and len(w.queue) == 0
        assert any("node claim already gone, deleting the message" in line for line in w.log)
        second.cancel()

    sim.run(body)


def test_an_older_warning_after_the_instance_stopped_changes_nothing_and_is_deleted(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        claim = await running(w, "web")
        warning = spot_warning(w, instance_id(claim))  # issued now, delivered last
        await w.advance(5)
        stopping = signals.state_change(
            _RNG,
            now=w.clock.now(),
            region=w.market.region,
            instance_id=instance_id(claim),
            state="shutting-down",
        )
        w.queue.put(stopping)
        await w.advance(0.01)
        deadline = claim.drain_deadline
        assert deadline is not None and deadline <= w.clock.now()
        w.queue.put(warning)
        await w.advance(0.01)
        assert claim.drain_deadline == deadline  # the later deadline does not loosen it
        await w.until(lambda: w.queue.deleted == 2, within=120, what="both messages deleted")
        assert w.queue.dead_letters == [] and len(w.queue) == 0
        assert w.counter("spotwright_interruption_actions_performed_total", action="drain") == 1

    sim.run(body)


def test_many_notices_at_once_are_handled_side_by_side_within_the_concurrency_bound(
    sim: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body(w: World) -> None:
        w.add_nodepool(instance_types=["c5.large"])
        await w.start_controllers(interruptions=True)
        w.deploy("web", 24, cpu="1500m")  # one pod per node
        await w.until(lambda: w.all_ready("web"), within=600, what="web ready")
        claims = w.claims()
        assert len(claims) == 24
        original = w.cluster.patch_node
        patching = [0, 0]  # now, most at once

        async def slow_patch(name: str, **changes: Any) -> None:
            """Each patch takes a second, as a busy API server might."""
            patching[0] += 1
            patching[1] = max(patching[1], patching[0])
            try:
                await w.clock.sleep(1.0)
                await original(name, **changes)
            finally:
                patching[0] -= 1

        monkeypatch.setattr(w.cluster, "patch_node", slow_patch)
        sent = w.clock.now()
        for claim in claims:
            w.queue.put(spot_warning(w, instance_id(claim)))

        def all_marked() -> bool:
            nodes = [w.cluster.node(c.node_name) for c in claims if c.node_name]
            return len(nodes) == 24 and all(n is not None and n.unschedulable for n in nodes)

        await w.until(all_marked, within=60, step=0.01, what="every node cordoned")
        # Eight patches at a time: three rounds of one second, where one message after
        # the other would have taken 24.
        assert patching[1] == 8
        assert w.clock.now() - sent < 4
        await w.until(lambda: w.queue.deleted == 24, within=600, what="every message deleted")
        assert w.queue.dead_letters == [] and len(w.queue) == 0

    sim.run(body, settings=Settings(interruption_concurrency=8))


def test_an_instance_without_a_claim_is_ours_only_if_the_cloud_says_so(
    sim: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shared queue: a late message is deleted only for this cluster's own instances."""

    async def body(w: World) -> None:
        w.add_nodepool("default")
        blue = {"kubernetes.io/cluster/blue": "owned"}

        def instance(name: str, state: str, **tags: str) -> Instance:
            return Instance(
                name, "m5.large", "us-east-1a", wk.SPOT, 0.04, 0.0, state=state, tags=tags
            )

        live = instance("i-live", "running", **{wk.NODEPOOL: "default"}, **blue)
        known = {
            i.id: i
            for i in (
                instance("i-ours", "terminated", **{wk.NODEPOOL: "default"}, **blue),
                instance(
                    "i-green",
                    "terminated",
                    **{wk.NODEPOOL: "default", "kubernetes.io/cluster/green": "owned"},
                ),
                instance("i-batch", "terminated", **{wk.NODEPOOL: "batch"}, **blue),
            )
        }

        async def list_owned() -> list[Instance]:
            return [live]

        async def describe(ids: Sequence[str]) -> list[Instance]:
            return [known[i] for i in ids if i in known]

        monkeypatch.setattr(w.market, "list_owned", list_owned)
        monkeypatch.setattr(w.market, "describe", describe)
        index = InstanceIndex(w.ctx)
        assert await index.was_ours("i-live")  # still running, its claim removed by hand
        assert await index.was_ours("i-ours")  # terminated, our pool and our cluster's tag
        assert not await index.was_ours("i-green")  # same pool name, another cluster
        assert not await index.was_ours("i-batch")  # a pool that is not ours
        assert not await index.was_ours("i-0123456789abcdef0")  # unknown to the cloud

    sim.run(body)


def test_an_instance_of_a_configured_node_group_is_ours_after_a_restart(
    sim: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mixed node group's instance carries the group's name where a NodePool's would be:
    a late message about it is deleted, not released forever, by a fresh process."""

    async def body(w: World) -> None:
        w.add_nodepool("default")
        owned = {"kubernetes.io/cluster/blue": "owned"}

        def instance(name: str, state: str, pool: str) -> Instance:
            tags = {wk.NODEPOOL: pool, **owned}
            return Instance(
                name, "m5.large", "us-east-1a", wk.SPOT, 0.04, 0.0, state=state, tags=tags
            )

        live = instance("i-live", "running", "default")
        gone = (
            instance("i-workers", "terminated", "workers"),
            instance("i-other", "terminated", "other-group"),
        )
        known = {i.id: i for i in gone}

        async def list_owned() -> list[Instance]:
            return [live]

        async def describe(ids: Sequence[str]) -> list[Instance]:
            return [known[i] for i in ids if i in known]

        monkeypatch.setattr(w.market, "list_owned", list_owned)
        monkeypatch.setattr(w.market, "describe", describe)
        group = NodeGroup.model_validate(
            {
                "name": "workers",
                "minSize": 0,
                "maxSize": 4,
                "desiredCapacity": 0,
                "instancesDistribution": {"instanceTypes": ["m5.large", "c5.large"]},
            }
        )
        NodeGroupController(w.ctx, [group])  # configured, as the controller starts
        index = InstanceIndex(w.ctx)  # a fresh process: no claim seen yet
        assert await index.was_ours("i-workers")
        assert not await index.was_ours("i-other")  # a group this cluster does not run

    sim.run(body)


def test_a_message_whose_first_step_is_slow_is_kept_in_flight_from_its_receipt(
    sim: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body(w: World) -> None:
        original_patch, original_receive = w.cluster.patch_node, w.queue.receive
        delivered: list[str] = []

        async def stuck_patch(name: str, **changes: Any) -> None:
            await w.clock.sleep(45.0)  # an API server that takes its time
            await original_patch(name, **changes)

        async def receive(max_messages: int = 10, wait_seconds: float = 20.0) -> list[Message]:
            batch = await original_receive(max_messages, wait_seconds)
            delivered.extend(m.id for m in batch)
            return batch

        monkeypatch.setattr(w.queue, "receive", receive)
        claim = await running(w, "web")
        monkeypatch.setattr(w.cluster, "patch_node", stuck_patch)
        w.queue.put(spot_warning(w, instance_id(claim)))
        await w.advance(60)  # past the queue's 30 s visibility timeout, the taint still slow
        assert claim.deleting_since is not None
        assert len(delivered) == 1 and w.queue.in_flight == 1
        await w.until(lambda: w.queue.deleted == 1, within=300, what="message deleted")
        assert len(delivered) == 1

    sim.run(body)
