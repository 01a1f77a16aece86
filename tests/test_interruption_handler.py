"""Queue-mode interruption handling: each EventBridge message leads to the right action, once.

A spot interruption warning must turn into a drain bounded by the notice's deadline and an
avoided pool; a message about someone else's instance must be left for its owner; garbage
must not block the queue; a notice delivered twice must act once; and the rebalance action
setting must do exactly what it says. Messages have the exact shape EventBridge delivers
(built by the simulated market's own event builders) and go through the in-memory queue,
with the real provisioner, lifecycle and termination controllers behind the handler.
"""

from __future__ import annotations

import json
import math
import random
from typing import TYPE_CHECKING, Any, Literal

import pytest

from spotwright.adapters import _market_signals as signals
from spotwright.controllers import Settings
from spotwright.model import labels as wk
from spotwright.model.objects import NodeClaim
from spotwright.ports.cloud import Offering

if TYPE_CHECKING:
    from conftest import Simulator, World

_RNG = random.Random(7)


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
        assert (w.queue.deleted, len(w.queue)) == (1, 0)
        assert w.events("InstanceInterrupted", claim.node_name)
        await w.until(lambda: w.cluster.node_claim(claim.name) is None, within=120, what="gone")
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


def test_a_notice_delivered_twice_acts_once(sim: Simulator) -> None:
    async def body(w: World) -> None:
        claim = await running(w, "web")
        notice = spot_warning(w, instance_id(claim))
        w.queue.put(notice)
        w.queue.put(notice)  # SQS delivers at least once
        await w.advance(1)
        first_deleted_at = claim.deleting_since
        await w.advance(5)
        w.queue.put(notice)
        await w.advance(1)
        assert claim.deleting_since == first_deleted_at
        assert w.queue.deleted == 3 and len(w.queue) == 0
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
        assert w.queue.deleted == 1
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
        assert w.queue.deleted == 2

    sim.run(body, settings=Settings(rebalance_action="cordon"))
