"""IMDS mode's handler acting on its own node, in the in-memory cluster on the virtual clock.

Events are what the poller would yield: metadata bodies run through the real IMDS parser.
The provisioner, node-claim lifecycle and termination controllers run too, so "the pods
count as pending, the replacement starts at once" and "drained within the deadline and
the PodDisruptionBudgets" are checked the way a user would: node taints and cordon, claims
launched, eviction times, pods lost, Kubernetes Events and metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest
import yaml

from spotwright.adapters.memory_cluster import MemoryCluster
from spotwright.cli.handler import HandlerOptions, HandlerService, handler_command
from spotwright.controllers import Settings
from spotwright.controllers.node_handler import ADDED_LABEL, EXCLUDE_LB_LABEL, NodeHandler
from spotwright.events import EventKind, InterruptionEvent
from spotwright.events._imds_common import iso
from spotwright.events.actions import ActionPolicy
from spotwright.events.imds import parse_imds
from spotwright.events.imds_source import PollerSettings
from spotwright.imds import CONTROL_PREFIX, MockConfig, aws_event_time, start_mock
from spotwright.model import labels as wk
from spotwright.model.objects import Deployment, Node, Pod
from spotwright.model.resources import Resources
from spotwright.observability.webhook import StepReport
from spotwright.ports.clock import LoopClock
from spotwright.ports.cluster import ClusterError

if TYPE_CHECKING:
    from conftest import Simulator, World

INSTANCE = "i-0a1b2c3d4e5f60718"
EVENT_ID = "instance-event-0123456789abcdef0"
NODE_NAME = "ip-172-16-34-43.ec2.internal"


def read(w: World, node: str, path: str, body: Any) -> InterruptionEvent:
    text = body if isinstance(body, str) else json.dumps(body)
    [event] = parse_imds(path, text, instance_id=INSTANCE, node=node, now=w.clock.now())
    return event


def spot_notice(w: World, node: str) -> InterruptionEvent:
    when = math.floor(w.clock.now()) + 120
    return read(w, node, "spot/instance-action", {"action": "terminate", "time": iso(when)})


def rebalance(w: World, node: str) -> InterruptionEvent:
    notice = iso(math.floor(w.clock.now()))
    return read(w, node, "events/recommendations/rebalance", {"noticeTime": notice})


def maintenance(w: World, node: str, state: str) -> InterruptionEvent:
    start = math.floor(w.clock.now()) + 86400
    item = {
        "Code": "system-reboot",
        "Description": "scheduled reboot",
        "EventId": EVENT_ID,
        "State": state,
        "NotBefore": aws_event_time(start),
        "NotAfter": aws_event_time(start + 3600),
    }
    return read(w, node, "events/maintenance/scheduled", [item])


async def node_running(w: World, app: str, replicas: int, **template: Any) -> Node:
    """Controllers up and ``app`` ready, all on one spotwright-launched node."""
    w.add_nodepool()
    await w.start_controllers()
    w.deploy(app, replicas, **template)
    await w.until(lambda: w.all_ready(app), within=600, what=f"{app} ready")
    [claim] = w.claims()
    node = w.cluster.node(claim.node_name or "")
    assert node is not None
    return node


def tainted(node: Node) -> bool:
    return any(t.key == wk.DISRUPTED_TAINT_KEY for t in node.taints)


def steps(w: World, step: str, result: str = "ok") -> float:
    return w.counter("spotwright_node_handler_steps_total", step=step, result=result)


def test_a_spot_notice_taints_cordons_replaces_and_drains_within_the_deadline_and_pdb(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        node = await node_running(w, "web", 4, grace_seconds=5)
        w.pdb("web", max_unavailable=1)
        reports: list[StepReport] = []
        handler = NodeHandler(w.ctx, node.name, listeners=[reports.append])
        event = spot_notice(w, node.name)
        assert event.deadline is not None
        task = asyncio.create_task(handler.handle(event))
        await w.advance(0.01)
        assert tainted(node) and node.unschedulable
        assert node.labels[EXCLUDE_LB_LABEL] == "spotwright"
        assert node.labels[ADDED_LABEL] == "cordon.lb.taint"
        await w.until(lambda: len(w.claim_history) == 2, within=15, what="replacement ordered")
        await w.until(task.done, within=125, what="drain finished")
        assert task.result() is True
        [drained] = w.events("Drained", node.name)
        assert drained.time < event.deadline
        assert (w.ledger.evicted, w.ledger.lost) == (4, 0)
        await w.until(lambda: w.all_ready("web"), within=30, what="web ready elsewhere")
        assert {p.node_name for p in w.pods_of("web")} == {w.claim_history[-1].node_name}
        reasons = [e.reason for e in w.cluster.events if e.kind == "Node" and e.name == node.name]
        assert reasons == [
            "InterruptionReceived",
            "Tainted",
            "Cordoned",
            "ExcludedFromLoadBalancers",
            "ReplacementRequested",
            "Drained",
        ]
        assert [r.step for r in reports] == [
            "received",
            "taint",
            "cordon",
            "exclude-from-load-balancers",
            "launch-replacement",
            "drain",
        ]
        assert {r.action for r in reports} == {"cordon-and-drain"}
        assert steps(w, "drain") == 1
        assert w.counter("spotwright_nodes_drained_total", result="before_deadline") == 1
        assert w.counter(
            "spotwright_interruption_actions_performed_total", action="cordon-and-drain"
        )
        assert any("handler step" in line and '"drain"' in line for line in w.log)

    sim.run(body)


@pytest.mark.parametrize("choice", ["none", "cordon"])
def test_a_rebalance_recommendation_does_what_the_policy_says(sim: Simulator, choice: str) -> None:
    async def body(w: World) -> None:
        node = await node_running(w, "web", 2)
        pods = w.pods_of("web")
        policy = ActionPolicy.model_validate({"rebalanceRecommendation": choice})
        handler = NodeHandler(w.ctx, node.name, policy=policy)
        assert await handler.handle(rebalance(w, node.name)) is True
        await w.advance(120)
        assert not tainted(node)
        assert node.unschedulable is (choice == "cordon")
        assert w.pods_of("web") == pods and len(w.claim_history) == 1
        assert w.counter("spotwright_interruption_actions_performed_total", action=choice) == 1
        assert w.events("InterruptionReceived", node.name)

    sim.run(body)


def test_replace_then_drain_evicts_only_once_the_replacement_is_ready(sim: Simulator) -> None:
    async def body(w: World) -> None:
        node = await node_running(w, "web", 3, grace_seconds=5)
        handler = NodeHandler(w.ctx, node.name)
        task = asyncio.create_task(handler.handle(rebalance(w, node.name)))
        await w.advance(0.01)
        assert tainted(node) and node.unschedulable  # pods count as pending at once
        await w.until(task.done, within=180, what="drain finished")
        assert task.result() is True
        replacement = w.claim_history[-1]
        assert replacement.initialized_at is not None
        first_eviction = min(e.time for e in w.events("Evicted"))
        assert first_eviction >= replacement.initialized_at
        await w.until(lambda: w.all_ready("web"), within=30, what="web ready elsewhere")
        assert (w.ledger.evicted, w.ledger.lost) == (3, 0)
        assert w.events("ReplacementReady", node.name) and steps(w, "wait-for-replacement") == 1

    sim.run(body)


def test_the_wider_view_is_open_for_the_replacement_wait_only(sim: Simulator) -> None:
    """A live handler sees the cluster's Nodes and NodeClaims only inside its capacity
    view: it must be open while the wait reads them, and closed before the drain."""
    opened: list[str] = []

    @contextlib.asynccontextmanager
    async def capacity_view() -> AsyncIterator[None]:
        opened.append("open")
        try:
            yield
        finally:
            opened.append("closed")

    async def body(w: World) -> None:
        node = await node_running(w, "web", 2)
        handler = NodeHandler(w.ctx, node.name, capacity_view=capacity_view)
        task = asyncio.create_task(handler.handle(rebalance(w, node.name)))
        await w.until(lambda: opened == ["open"], within=5, what="the wait to open the view")
        assert w.ledger.evicted == 0
        await w.until(task.done, within=180, what="drain finished")
        assert opened == ["open", "closed"]
        [ready] = w.events("ReplacementReady", node.name)
        assert all(e.time >= ready.time for e in w.events("Evicted"))
        assert w.ledger.evicted == 2

    sim.run(body)


def test_replace_then_drain_drains_anyway_after_the_configured_wait(sim: Simulator) -> None:
    async def body(w: World) -> None:
        node = await node_running(w, "web", 2)
        handler = NodeHandler(w.ctx, node.name)
        since = w.clock.now()
        task = asyncio.create_task(handler.handle(rebalance(w, node.name)))
        await w.until(task.done, within=60, what="drain finished")
        [gave_up] = w.events("ReplacementNotReady", node.name)
        assert gave_up.time - since == pytest.approx(20, abs=1)
        assert steps(w, "wait-for-replacement", "timeout") == 1
        assert w.ledger.evicted == 2
        assert all(w.rel(e.time) >= w.rel(since) + 20 for e in w.events("Evicted"))

    # A first node boots in 30 s; once the replacement is ordered, booting takes longer
    # than the 20 s the policy waits.
    sim.run(body, settings=Settings(replacement_wait_seconds=20), node_ready_after=15)


def test_a_spot_notice_during_a_rebalance_wait_takes_the_drain_over(sim: Simulator) -> None:
    async def body(w: World) -> None:
        node = await node_running(w, "web", 2, grace_seconds=5)
        handler = NodeHandler(w.ctx, node.name)
        waiting = asyncio.create_task(handler.handle(rebalance(w, node.name)))
        await w.advance(5)
        assert not waiting.done() and w.ledger.evicted == 0
        notice = spot_notice(w, node.name)
        assert notice.deadline is not None
        urgent = asyncio.create_task(handler.handle(notice))
        await w.advance(0.01)
        assert waiting.done() and waiting.result() is True  # stopped, not failed
        await w.until(urgent.done, within=125, what="drain finished")
        assert urgent.result() is True
        assert w.ledger.evicted == 2
        assert max(e.time for e in w.events("Evicted")) < notice.deadline
        assert steps(w, "wait-for-replacement") == 0  # the wait was cut short

    sim.run(body, settings=Settings(replacement_wait_seconds=600), node_ready_after=200)


def test_a_canceled_maintenance_stops_the_drain_and_undoes_what_was_done(sim: Simulator) -> None:
    async def body(w: World) -> None:
        node = await node_running(w, "web", 2, grace_seconds=5)
        w.pdb("web", min_available=2)  # nothing may be evicted: the drain stays under way
        handler = NodeHandler(w.ctx, node.name)
        draining = asyncio.create_task(handler.handle(maintenance(w, node.name, "active")))
        await w.advance(30)
        assert tainted(node) and node.unschedulable and not draining.done()
        assert await handler.handle(maintenance(w, node.name, "canceled")) is True
        await w.advance(0.01)
        assert draining.done() and draining.result() is True
        assert not tainted(node) and not node.unschedulable
        assert EXCLUDE_LB_LABEL not in node.labels and ADDED_LABEL not in node.labels
        assert w.ledger.evicted == 0
        [back] = w.events("Uncordoned", node.name)
        assert "canceled" in back.message and "cordon" in back.message

    sim.run(body)


def test_uncordon_undoes_only_what_the_handler_added_even_after_a_restart(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        node = w.add_node("n1", unschedulable=True)  # an operator cordoned it by hand
        first = NodeHandler(w.ctx, node.name)
        assert await first.handle(maintenance(w, node.name, "active")) is True
        assert tainted(node) and node.labels[ADDED_LABEL] == "lb.taint"
        restarted = NodeHandler(w.ctx, node.name)  # remembers nothing but the label
        assert await restarted.handle(maintenance(w, node.name, "completed")) is True
        assert not tainted(node) and EXCLUDE_LB_LABEL not in node.labels
        assert node.unschedulable, "the operator's cordon stays"

    sim.run(body)


def test_a_canceled_maintenance_leaves_a_node_another_event_still_holds(sim: Simulator) -> None:
    async def body(w: World) -> None:
        node = w.add_node("n1")
        handler = NodeHandler(w.ctx, node.name)
        assert await handler.handle(maintenance(w, node.name, "active"))
        assert await handler.handle(spot_notice(w, node.name))
        assert await handler.handle(maintenance(w, node.name, "canceled"))
        assert tainted(node) and node.unschedulable
        assert steps(w, "uncordon", "skipped") == 1

    sim.run(body)


def test_an_event_about_another_node_is_left_alone(sim: Simulator) -> None:
    async def body(w: World) -> None:
        mine, other = w.add_node("mine"), w.add_node("other")
        handler = NodeHandler(w.ctx, mine.name)
        assert await handler.handle(spot_notice(w, other.name))
        assert not other.unschedulable and not mine.unschedulable

    sim.run(body)


def test_a_failed_step_is_reported_and_the_event_handed_back_for_a_retry(
    sim: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body(w: World) -> None:
        node = w.add_node("n1")
        patch = w.cluster.patch_node
        calls: list[int] = []

        async def flaky(name: str, **changes: Any) -> None:
            calls.append(1)
            if len(calls) == 1:
                raise ClusterError("the API server is unavailable")
            await patch(name, **changes)

        monkeypatch.setattr(w.cluster, "patch_node", flaky)
        handler = NodeHandler(w.ctx, node.name)
        retried: list[InterruptionEvent] = []
        event = spot_notice(w, node.name)

        async def once() -> AsyncIterator[InterruptionEvent]:
            yield event

        await handler.run(once(), on_failure=retried.append)
        assert retried == [event] and not tainted(node)
        assert w.events("TaintedFailed", node.name)
        assert steps(w, "taint", "error") == 1
        assert w.counter("spotwright_interruption_message_errors_total", reason="action_failed")
        assert await handler.handle(event) is True  # the next poll's try
        assert tainted(node) and node.unschedulable

    sim.run(body)


def test_the_imds_lifecycle_terminated_state_drains_without_a_hook(sim: Simulator) -> None:
    async def body(w: World) -> None:
        node = await node_running(w, "web", 2)
        event = read(w, node.name, "autoscaling/target-lifecycle-state", "Terminated")
        assert event.kind is EventKind.ASG_LIFECYCLE_TERMINATE
        assert await NodeHandler(w.ctx, node.name).handle(event) is True
        assert w.ledger.evicted == 2 and tainted(node)

    sim.run(body)


# -- the command's wiring: poller, handler, exporter metrics and webhook together ----------

MOCK_INSTANCE = "i-1234567890abcdef0"  # the imds-mock's default instance


def test_the_service_polls_a_real_imds_mock_acts_and_serves_the_exporter_metrics() -> None:
    """Wall-clock wiring test: a notice raised on the mock ends with the node drained."""

    async def main() -> tuple[str, Node, list[str]]:
        async with await start_mock(MockConfig(port=0, require_token=True)) as mock:
            cluster = MemoryCluster(LoopClock())
            node = Node(
                name=NODE_NAME,
                provider_id=f"aws:///us-east-1a/{MOCK_INSTANCE}",
                labels={wk.INSTANCE_TYPE: "m4.xlarge"},
                allocatable=Resources.from_k8s({"cpu": "4", "memory": "16Gi", "pods": 110}),
                ready=True,
            )
            cluster.register_node(node)
            template = Pod(name="", labels={"app": "web"}, grace_seconds=0)
            cluster.apply_deployment(Deployment(name="web", replicas=2, template=template))
            options = HandlerOptions(
                node_name=NODE_NAME,
                imds=PollerSettings(url=mock.url, poll_interval=0.05, backoff_max=0.2),
                policy=ActionPolicy(),
                metrics_host="127.0.0.1",
                metrics_port=0,
            )
            service = HandlerService(options, cluster)
            assert await service.start()
            running = asyncio.create_task(service.run())
            try:
                await until(lambda: len(cluster.pods_on(NODE_NAME)) == 2)
                async with aiohttp.ClientSession() as session:
                    url = f"{mock.url}{CONTROL_PREFIX}/spot-interruption"
                    async with session.post(url, json={"delaySeconds": 0}) as answer:
                        assert answer.status == 200
                    await until(lambda: cluster.events and cluster.pods_on(NODE_NAME) == [])
                    await until(lambda: any(e.reason == "Drained" for e in cluster.events))
                    metrics = f"http://127.0.0.1:{service.metrics_port}/metrics"
                    async with session.get(metrics) as answer:
                        scraped = await answer.text()
            finally:
                service.stop()
                await running
                await service.aclose()
            reasons = [e.reason for e in cluster.events if e.kind == "Node"]
            return scraped, node, reasons

    scraped, node, reasons = asyncio.run(main())
    assert tainted(node) and node.unschedulable
    assert reasons[-1] == "Drained"
    labels = f'instance_id="{MOCK_INSTANCE}",instance_type="m4.xlarge"'
    assert f"aws_instance_metadata_service_available{{{labels}}} 1.0" in scraped
    assert f'aws_instance_termination_imminent{{instance_action="terminate",{labels}}} 1.0' in (
        scraped
    )
    assert f"aws_instance_termination_in{{{labels}}}" in scraped
    assert 'spotwright_node_handler_steps_total{result="ok",step="drain"} 1.0' in scraped


async def until(predicate: Callable[[], object], rounds: int = 500) -> None:
    """Let the real loop run until ``predicate`` holds (a liveness bound, not a timing)."""
    for _ in range(rounds):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("still not true")


def spotwright(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "NODE_NAME"))}
    env.update(HOME=str(home), KUBECONFIG=str(home / "absent"))
    return subprocess.run(
        [sys.executable, "-m", "spotwright", "handler", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_the_command_without_a_cluster_to_talk_to_says_what_it_needs(tmp_path: Path) -> None:
    result = spotwright("--node-name", "n1", "--metrics-port", "0", home=tmp_path)
    assert result.returncode == 2
    assert "needs --kubeconfig / in-cluster config" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_command_refuses_a_bad_policy_or_template_before_starting(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("rebalanceRecommendation: drain-now\n")
    result = spotwright("--node-name", "n1", "--policy", str(policy), home=tmp_path)
    assert result.returncode == 2
    assert f"{policy}: rebalanceRecommendation: expected one of" in result.stderr
    template = tmp_path / "hook.json"
    template.write_text('{"text": "${nodename}"}')
    hook = ("--webhook-url", "http://127.0.0.1:9/hook", "--webhook-template", str(template))
    result = spotwright("--node-name", "n1", *hook, home=tmp_path)
    assert result.returncode == 2
    assert "unknown field(s) nodename" in result.stderr


DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def permissions(document: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in document["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_daemonset_runs_the_command_on_its_node_with_only_the_calls_it_makes() -> None:
    docs = [d for d in yaml.safe_load_all((DEPLOY / "handler-daemonset.yaml").read_text()) if d]
    by_kind = {d["kind"]: d for d in docs}
    granted = permissions(by_kind["ClusterRole"])
    assert granted == {
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "pods", "delete"),
        ("", "pods/eviction", "create"),
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        ("", "nodes", "get"),
        ("", "nodes", "patch"),
        ("spotwright.io", "nodeclaims", "list"),
        ("spotwright.io", "nodeclaims", "watch"),
        ("events.k8s.io", "events", "create"),
    }
    # Both roles are also checked call by call (tests/test_rbac.py for the controller's,
    # tests/test_kube_handler_scope.py for this one); the handler's is a subset.
    [controller] = [
        d
        for d in yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text())
        if d and d["kind"] == "ClusterRole"
    ]
    assert granted <= permissions(controller)
    pod = by_kind["DaemonSet"]["spec"]["template"]["spec"]
    account = by_kind["ServiceAccount"]["metadata"]
    assert pod["serviceAccountName"] == account["name"]
    assert by_kind["ClusterRoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    ]
    assert pod["hostNetwork"] is True
    [container] = pod["containers"]
    [node_name] = [e for e in container["env"] if e["name"] == "NODE_NAME"]
    assert node_name["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    command, *args = container["args"]
    assert command == "handler"
    context = handler_command.make_context("handler", [*args, "--node-name", "n1"])
    assert context.params["metrics_port"] == container["ports"][0]["containerPort"]
