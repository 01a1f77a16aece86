"""Queue mode and Auto Scaling terminate hooks: drain, heartbeat, complete, then delete.

An ASG-managed node has no node claim: the handler must find it by providerID (or by the
instance's private DNS name), taint, cordon and drain it while heartbeats keep the hook
open, then complete the lifecycle action once, with CONTINUE, or ABANDON when the drain
failed, and delete the message only after that. The hook is the in-memory Auto Scaling
(``SimAutoScaling``), which applies Auto Scaling's timeouts, so a hook the handler forgot
to heartbeat expires, as it would live. Everything runs on the virtual clock: a ten-minute
drain takes no time. The messages are the EventBridge and direct-from-ASG samples in
``tests/data/events``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from spotwright.adapters.memory_queue import MemoryQueue
from spotwright.adapters.sim_autoscaling import SimAutoScaling
from spotwright.controllers import InterruptionHandler
from spotwright.events import LifecycleHook, parse_eventbridge
from spotwright.events.actions import ActionPolicy
from spotwright.model import labels as wk
from spotwright.model.objects import Node
from spotwright.model.resources import Resources
from spotwright.ports.autoscaling import LifecycleActionGone
from spotwright.ports.cloud import CloudError, LaunchRequest
from spotwright.ports.cluster import ClusterError
from spotwright.ports.queue import Message

if TYPE_CHECKING:
    from conftest import Simulator, World

EVENTS = Path(__file__).parent / "data" / "events"
#: The instance, group and hook of asg_terminate_lifecycle.json.
INSTANCE = "i-0d4c3b2a1f0e98765"
NODE = "ip-10-0-17-42.ec2.internal"
LB_LABEL = "node.kubernetes.io/exclude-from-external-load-balancers"


def terminate_message() -> str:
    return (EVENTS / "asg_terminate_lifecycle.json").read_text()


def hook_of(body: str) -> LifecycleHook:
    [event] = parse_eventbridge(body)
    assert event.lifecycle is not None
    return event.lifecycle


class RecordingQueue(MemoryQueue):
    """The in-memory queue, noting what the Auto Scaling side had seen at each delete."""

    def __init__(self, asg: SimAutoScaling) -> None:
        super().__init__()
        self.asg = asg
        self.completions_at_delete: list[int] = []
        self.released: list[str] = []

    async def delete(self, message: Message) -> None:
        self.completions_at_delete.append(len(self.asg.completions))
        await super().delete(message)

    async def release(self, message: Message) -> None:
        self.released.append(message.id)
        await super().release(message)


def register(w: World, name: str, *, provider_id: str = "", pool: str = "asg") -> Node:
    """A node that joined on its own, as an ASG-launched kubelet does."""
    node = Node(
        name=name,
        provider_id=provider_id,
        labels={wk.HOSTNAME: name, "pool": pool},
        allocatable=Resources.from_k8s({"cpu": "4", "memory": "16Gi", "pods": 110}),
        ready=True,
        created_at=w.clock.now(),
    )
    w.cluster.register_node(node)
    return node


async def asg_node_running(w: World, app: str = "web", *, grace: float = 30.0) -> Node:
    """The ASG node with two pods of ``app`` on it, and a spare node for them to move to."""
    node = register(w, NODE, provider_id=f"aws:///us-east-1a/{INSTANCE}")
    w.deploy(app, 2, grace_seconds=grace)
    await w.until(lambda: w.all_ready(app), within=60, what=f"{app} ready")
    assert {p.node_name for p in w.pods_of(app)} == {NODE}
    register(w, "spare", pool="spare")
    return node


async def start(
    w: World,
    asg: SimAutoScaling | None,
    queue: MemoryQueue,
    policy: ActionPolicy | None = None,
) -> InterruptionHandler:
    handler = InterruptionHandler(w.ctx, queue, asg, policy=policy)
    await w.start(handler.run())
    return handler


def test_a_terminate_hook_drains_with_heartbeats_then_continues_and_deletes_after(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        asg = SimAutoScaling(w.clock, strict=True)
        queue = RecordingQueue(asg)
        node = await asg_node_running(w, grace=300)  # each pod takes 5 minutes to stop
        hook = hook_of(terminate_message())
        # Without a heartbeat the group would give up waiting after 90 s.
        asg.begin(hook, heartbeat_timeout=90)
        await start(w, asg, queue)
        started = w.clock.now()
        queue.put(terminate_message())
        await w.until(lambda: bool(asg.completions), within=900, what="hook completed")
        await w.advance(1)

        [completion] = asg.completions
        assert completion.result == "CONTINUE" and completion.hook == hook
        assert asg.outcomes[hook.token] == ("CONTINUE", "completed")
        # Drained: tainted, cordoned, out of the load balancers, and empty.
        assert any(t.key == wk.DISRUPTED_TAINT_KEY for t in node.taints)
        assert node.unschedulable and node.labels[LB_LABEL] == "spotwright"
        assert [p for p in w.cluster.pods_on(NODE) if not p.daemon] == []
        assert (w.ledger.evicted, w.ledger.lost) == (2, 0)
        took = completion.at - started
        assert took >= 300
        # A heartbeat every minute (the policy's default) from the start of the drain
        # until the completion, none after it.
        beats = [at - started for at in asg.heartbeats_for(hook)]
        assert len(beats) >= 4
        assert beats == pytest.approx([60.0 * (i + 1) for i in range(len(beats))], abs=0.01)
        assert took - 60 <= beats[-1] <= took
        # The message went only once the action was completed, and only once: kept in
        # flight through a drain ten times the queue's 30 s visibility timeout, it never
        # came back as a copy.
        assert queue.completions_at_delete == [1]
        assert (queue.deleted, len(queue), queue.released) == (1, 0, [])
        assert (
            w.counter(
                "spotwright_interruption_actions_performed_total",
                action="complete-lifecycle-continue",
            )
            == 1
        )
        assert w.events("LifecycleActionCompleted", NODE)

    sim.run(body)


def test_the_heartbeat_interval_comes_from_the_policy(sim: Simulator) -> None:
    async def body(w: World) -> None:
        asg = SimAutoScaling(w.clock, strict=True)
        await asg_node_running(w, grace=200)
        hook = hook_of(terminate_message())
        asg.begin(hook, heartbeat_timeout=60)
        queue = MemoryQueue()
        await start(w, asg, queue, ActionPolicy(lifecycle_heartbeat_interval="45s"))
        started = w.clock.now()
        queue.put(terminate_message())
        await w.until(lambda: bool(asg.completions), within=900, what="hook completed")
        beats = [at - started for at in asg.heartbeats_for(hook)]
        assert beats[:4] == pytest.approx([45.0, 90.0, 135.0, 180.0], abs=0.01)
        assert [c.result for c in asg.completions] == ["CONTINUE"]

    sim.run(body)


def test_a_failing_drain_abandons_the_hook(sim: Simulator, monkeypatch: pytest.MonkeyPatch) -> None:
    async def body(w: World) -> None:
        asg = SimAutoScaling(w.clock, strict=True)
        queue = RecordingQueue(asg)
        node = await asg_node_running(w)
        hook = hook_of(terminate_message())
        asg.begin(hook)

        async def refused(*_args: Any, **_kwargs: Any) -> None:
            raise ClusterError("the API server answered 500")

        monkeypatch.setattr(w.cluster, "evict", refused)
        await start(w, asg, queue)
        queue.put(terminate_message())
        await w.until(lambda: bool(asg.completions), within=120, what="hook completed")
        await w.advance(1)

        assert [c.result for c in asg.completions] == ["ABANDON"]
        assert node.unschedulable  # the cordon went through before the eviction failed
        # ABANDON ends the lifecycle action: nothing is left to retry, the message goes.
        assert queue.completions_at_delete == [1] and len(queue) == 0
        [event] = w.events("LifecycleActionCompleted", NODE)
        assert event.warning and "ABANDON" in event.message
        assert w.counter("spotwright_interruption_message_errors_total", reason="ClusterError")
        assert any("drain for lifecycle hook failed" in line for line in w.log)

    sim.run(body)


def test_a_failed_completion_releases_the_message_and_the_retry_completes(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        asg = SimAutoScaling(w.clock, strict=True)
        queue = RecordingQueue(asg)
        await asg_node_running(w)
        hook = hook_of(terminate_message())
        asg.begin(hook)
        asg.fail_next("complete", CloudError("AccessDenied", "not authorized (injected)"))
        await start(w, asg, queue)
        message = queue.put(terminate_message())
        # Released after the failure, delivered again 30 s later, completed then.
        await w.until(lambda: bool(asg.completions), within=300, what="hook completed")
        await w.advance(1)
        assert queue.released == [message.id]
        assert [c.result for c in asg.completions] == ["CONTINUE"]
        assert queue.completions_at_delete == [1] and len(queue) == 0
        assert queue.dead_letters == []

    sim.run(body)


def test_a_copy_received_during_the_drain_is_kept_and_deleted_with_the_first(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        asg = SimAutoScaling(w.clock, strict=True)
        queue = RecordingQueue(asg)
        await asg_node_running(w, grace=120)
        hook = hook_of(terminate_message())
        asg.begin(hook)
        await start(w, asg, queue)
        queue.put(terminate_message())
        await w.advance(10)
        queue.put(terminate_message())  # e.g. redelivered after a visibility timeout
        await w.advance(1)
        assert queue.deleted == 0 and queue.released == []
        await w.until(lambda: bool(asg.completions), within=600, what="hook completed")
        await w.advance(1)
        assert [c.result for c in asg.completions] == ["CONTINUE"]
        assert queue.completions_at_delete == [1, 1] and len(queue) == 0
        # And once more, afterwards: recognised, deleted, not completed again.
        queue.put(terminate_message())
        await w.advance(1)
        assert len(asg.completions) == 1 and queue.deleted == 3

    sim.run(body)


def test_after_a_restart_a_hook_already_completed_is_recognised_and_deleted(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        asg = SimAutoScaling(w.clock, strict=True)
        await asg_node_running(w)
        hook = hook_of(terminate_message())
        asg.begin(hook)
        await asg.complete(hook, "CONTINUE")  # by the previous process, before it died
        queue = MemoryQueue()
        await start(w, asg, queue)  # a fresh handler: it has seen nothing
        queue.put(terminate_message())
        await w.until(lambda: queue.deleted == 1, within=120, what="message deleted")
        assert len(asg.completions) == 1
        assert any("lifecycle action was already over" in line for line in w.log)
        with pytest.raises(LifecycleActionGone):
            await asg.heartbeat(hook)

    sim.run(body)


def test_heartbeats_stop_once_the_hook_has_timed_out(sim: Simulator) -> None:
    async def body(w: World) -> None:
        asg = SimAutoScaling(w.clock, strict=True)
        await asg_node_running(w, grace=300)
        hook = hook_of(terminate_message())
        asg.begin(hook, heartbeat_timeout=30, default_result="CONTINUE")  # shorter than 60 s
        queue = MemoryQueue()
        await start(w, asg, queue)
        queue.put(terminate_message())
        await w.until(lambda: queue.deleted == 1, within=900, what="message deleted")
        assert asg.heartbeats == [] and asg.completions == []
        assert asg.outcomes[hook.token] == ("CONTINUE", "timeout")
        assert any("stopping heartbeats" in line for line in w.log)

    sim.run(body)


def test_a_node_without_provider_id_is_found_by_its_private_dns_name(sim: Simulator) -> None:
    async def body(w: World) -> None:
        # An instance of the (simulated) EC2, whose kubelet registered without a providerID.
        offering = next(o for o in w.market.offerings() if o.capacity_type == "on-demand")
        instance = await w.market.launch(
            LaunchRequest("asg-managed", "none", "on-demand", (offering,))
        )
        await w.until(
            lambda: w.cluster.node(instance.private_dns) is not None,
            within=120,
            what="node registered",
        )
        node = w.cluster.node(instance.private_dns)
        assert node is not None
        node.provider_id = ""
        asg = SimAutoScaling(w.clock)
        queue = RecordingQueue(asg)
        await start(w, asg, queue)
        body_text = json.loads(terminate_message())
        body_text["detail"]["EC2InstanceId"] = instance.id
        queue.put(body_text)
        await w.until(lambda: bool(asg.completions), within=120, what="hook completed")
        assert node.unschedulable
        assert [c.result for c in asg.completions] == ["CONTINUE"]

    sim.run(body)


def test_a_hook_for_an_instance_of_another_cluster_is_released(sim: Simulator) -> None:
    async def body(w: World) -> None:
        asg = SimAutoScaling(w.clock)
        queue = RecordingQueue(asg)
        node = await asg_node_running(w)
        await start(w, asg, queue)
        other = json.loads(terminate_message())
        other["detail"]["EC2InstanceId"] = "i-0123456789abcdef0"
        message = queue.put(other)
        await w.advance(5)
        assert queue.released == [message.id] and queue.deleted == 0
        assert asg.completions == [] and asg.heartbeats == []
        assert not node.unschedulable and not node.taints

    sim.run(body)


def test_the_direct_asg_message_and_its_test_notification(sim: Simulator) -> None:
    async def body(w: World) -> None:
        asg = SimAutoScaling(w.clock)
        queue = RecordingQueue(asg)
        node = await asg_node_running(w)
        await start(w, asg, queue)
        queue.put((EVENTS / "asg_test_notification.json").read_text())
        await w.advance(1)
        assert queue.deleted == 1 and queue.released == []
        assert any("deleting Auto Scaling test notification" in line for line in w.log)
        # The SNS-wrapped direct message, about our node's instance.
        direct = json.loads((EVENTS / "asg_terminate_direct_sns.json").read_text())
        inner = json.loads(direct["Message"])
        inner["EC2InstanceId"] = INSTANCE
        direct["Message"] = json.dumps(inner)
        queue.put(direct)
        await w.until(lambda: bool(asg.completions), within=120, what="hook completed")
        [completion] = asg.completions
        assert completion.hook.asg_name == "eks-ondemand-workers"
        assert completion.hook.token == inner["LifecycleActionToken"]
        assert node.unschedulable

    sim.run(body)


def test_without_an_autoscaling_port_the_node_is_still_drained(sim: Simulator) -> None:
    async def body(w: World) -> None:
        await asg_node_running(w, grace=0)
        queue = MemoryQueue()
        await start(w, None, queue)
        queue.put(terminate_message())
        await w.until(lambda: queue.deleted == 1, within=120, what="message deleted")
        assert [p for p in w.cluster.pods_on(NODE)] == []
        assert any("left to time out" in line for line in w.log)

    sim.run(body)
