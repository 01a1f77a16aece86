"""The provisioner and the node-claim lifecycle: pending pods become the right instances.

What a user of spotwright sees is the outcome of both controllers together: how many node
claims a burst of pods produces, which instance types a claim may use, that NodePool limits
hold and say why, that nothing is launched twice while an instance boots, and that a spot
shortage or a spot quota sends the next claim to on-demand at once. Every test runs the
real controllers against the in-memory cluster and the simulated market, in virtual time.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from spotwright.controllers import NodeClaimLifecycle, Provisioner
from spotwright.model import labels as wk
from spotwright.model.nodepool import NodePool
from spotwright.model.objects import Node, NodeClaim, Taint, Toleration

if TYPE_CHECKING:
    from conftest import Simulator, World


async def provisioner_only(w: World) -> None:
    """Claims are written but never launched: what the provisioner alone decides."""
    await w.start(Provisioner(w.ctx).run())


async def provisioning(w: World) -> None:
    await w.start(Provisioner(w.ctx).run(), NodeClaimLifecycle(w.ctx).run())


def nominated(w: World, claim: NodeClaim) -> set[str]:
    """The pods the provisioner said should land on ``claim``."""
    return {e.name for e in w.events("Nominated") if e.message.endswith(f"/{claim.name}")}


# -- batching -----------------------------------------------------------------------------


def test_pods_arriving_within_the_idle_window_become_one_round_and_one_claim(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        await provisioner_only(w)
        w.deploy("a", 1)
        await w.advance(0.5)
        w.deploy("b", 1)
        await w.advance(0.7)
        w.deploy("c", 1)
        await w.until(lambda: bool(w.claims()), within=15, what="a claim")
        await w.advance(30)  # later rounds (retries) must not add claims for these pods
        [claim] = w.claims()
        # One second after the last pod, not one second after the first.
        assert w.rel(claim.created_at) == pytest.approx(2.2)
        assert nominated(w, claim) == {p.key for p in w.cluster.pods()}
        assert claim.requests.cpu == 1500

    sim.run(body)


def test_a_steady_stream_of_pods_is_cut_into_rounds_of_at_most_ten_seconds(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        await provisioner_only(w)
        for i in range(40):
            w.deploy(f"p{i}", 1, cpu="100m")
            await w.advance(0.5)
        first = min(w.rel(c.created_at) for c in w.claims())
        assert first == pytest.approx(10.0)

    sim.run(body)


# -- what a claim asks for ----------------------------------------------------------------


def test_a_claim_keeps_every_instance_type_that_fits_cheapest_first(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        await provisioning(w)
        w.deploy("big", 1, cpu="3", memory="2Gi")
        await w.until(lambda: w.all_ready("big"), within=60, what="big ready")
        [claim] = w.claim_history
        fitting = {t.name for t in w.ctx.instance_types.values() if t.allocatable.cpu >= 3000}
        assert set(claim.instance_types) == fitting and len(fitting) > 1
        cheapest = {
            name: min(o.price for o in w.market.offerings() if o.instance_type == name)
            for name in claim.instance_types
        }
        prices = [cheapest[n] for n in claim.instance_types]
        assert prices == sorted(prices)
        # Spot first, and on the cheapest of the types.
        assert (claim.capacity_type, claim.instance_type) == (wk.SPOT, claim.instance_types[0])

    sim.run(body)


# -- NodePool limits ----------------------------------------------------------------------


def test_cpu_limits_stop_new_claims_and_the_pods_left_say_why(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_nodepool(limits={"cpu": "4"})
        await provisioning(w)
        w.deploy("web", 4, cpu="1500m")
        await w.advance(120)
        claimed = sum(w.ctx.instance_types[c.instance_type].allocatable.cpu for c in w.claims())
        assert 0 < claimed <= 4000
        assert len(w.claim_history) == len(w.claims())  # nothing launched and dropped
        pending = [p for p in w.pods_of("web") if p.node_name is None]
        assert pending, "the limit must have left some pods without a node"
        for pod in pending:
            [*_, last] = w.events("FailedScheduling", pod.key)
            assert 'NodePool "default" limits exceeded (cpu)' in last.message

    sim.run(body)


def test_a_zero_cpu_limit_means_no_capacity_at_all(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_nodepool(limits={"cpu": "0"})
        await provisioning(w)
        w.deploy("web", 1)
        await w.advance(60)
        assert w.claim_history == []
        assert w.events("FailedScheduling", w.pods_of("web")[0].key)

    sim.run(body)


def test_a_node_limit_stops_new_claims_and_the_pods_left_say_why(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_nodepool(limits={"nodes": 1}, instance_types=["m5.xlarge"])
        await provisioning(w)
        w.deploy("web", 2, cpu="3")
        await w.advance(120)
        assert len(w.claim_history) == 1
        [pending] = [p for p in w.pods_of("web") if p.node_name is None]
        assert "node limit reached" in w.events("FailedScheduling", pending.key)[-1].message

    sim.run(body)


# -- replacements and in-flight claims ----------------------------------------------------


@pytest.mark.parametrize("signal", ["claim deleted", "node tainted"])
def test_the_pods_of_a_node_on_its_way_out_get_a_replacement_before_any_eviction(
    sim: Simulator, signal: str
) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        await provisioning(w)  # no termination controller: nobody evicts anything
        w.deploy("web", 2)
        await w.until(lambda: w.all_ready("web"), within=60, what="web ready")
        [old] = w.claims()
        if signal == "claim deleted":
            old.deleting_since = w.clock.now()
            await w.cluster.update_node_claim(old)
        else:
            disrupted = Taint(wk.DISRUPTED_TAINT_KEY, "NoSchedule")
            await w.cluster.patch_node(old.node_name, add_taints=[disrupted])
        await w.until(lambda: len(w.claim_history) == 2, within=5, what="a replacement claim")
        new = w.claim_history[1]
        assert nominated(w, new) == {p.key for p in w.pods_of("web")}
        await w.until(lambda: bool(new.initialized_at), within=60, what="replacement ready")
        await w.advance(60)
        # The replacement was ordered while the pods still ran where they were.
        assert [p.node_name for p in w.pods_of("web")] == [old.node_name] * 2
        assert w.ready("web") == 2
        assert len(w.claim_history) == 2  # and the new node covers them: no third claim

    sim.run(body)


def test_no_second_claim_while_the_first_boots_and_registers(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        await provisioning(w)
        w.deploy("web", 3)
        # 2 minutes to boot and one more to turn ready: a dozen retry rounds meanwhile.
        await w.until(lambda: w.all_ready("web"), within=300, what="web ready")
        assert len(w.claim_history) == 1
        assert len(w.market.instances()) == 1
        assert w.counter("spotwright_nodeclaims_created_total", nodepool="default") == 1

    sim.run(body, boot_seconds=120, node_ready_after=60)


def test_a_node_full_by_pod_count_does_not_hide_a_pending_pod(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_nodepool(instance_types=["m5.xlarge"])  # 29 pods at most
        await provisioning(w)
        w.deploy("tiny", 29, cpu="10m", memory="16Mi")
        await w.until(lambda: w.all_ready("tiny"), within=60, what="29 pods ready")
        assert len(w.claims()) == 1
        w.cluster.scale("tiny", 30)
        await w.until(lambda: w.all_ready("tiny"), within=60, what="the 30th pod ready")
        assert len(w.claims()) == 2

    sim.run(body)


def test_an_unschedulable_pod_gets_a_failed_scheduling_event_with_the_reason(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        await provisioner_only(w)
        w.deploy("huge", 1, cpu="100")
        await w.advance(15)
        pod = w.pods_of("huge")[0]
        [event, *_] = w.events("FailedScheduling", pod.key)
        assert event.kind == "Pod" and event.warning
        assert "100 cpu" in event.message
        assert w.claim_history == []

    sim.run(body)


# -- launch failures ----------------------------------------------------------------------


def test_spot_short_everywhere_marks_the_offerings_and_the_next_round_goes_on_demand(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        await provisioning(w)
        w.market.set_capacity(wk.SPOT, instance_types=None, zones=None, available=False)
        w.deploy("web", 2)
        took = await w.until(lambda: w.all_ready("web"), within=120, what="web ready")
        failed, launched = w.claim_history
        assert w.cluster.node_claim(failed.name) is None
        assert w.events("LaunchFailed", failed.name)[0].warning
        # Tried were the spot offerings of its types no dearer than their cheapest
        # on-demand offering: each of them is now avoided.
        offerings = [o for o in w.market.offerings() if o.instance_type in failed.instance_types]
        ceiling = min(o.price for o in offerings if o.capacity_type == wk.ON_DEMAND)
        tried = [o for o in offerings if o.capacity_type == wk.SPOT and o.price <= ceiling]
        assert tried and all(w.ctx.unavailable.is_unavailable(o, w.clock.now()) for o in tried)
        assert w.counter(
            "spotwright_launch_failures_total",
            reason="InsufficientInstanceCapacity",
            capacity_type=wk.SPOT,
        ) == len(tried)
        assert launched.capacity_type == wk.ON_DEMAND
        assert w.instance(launched).capacity_type == wk.ON_DEMAND
        assert took < 60  # a scheduling round away, not the 3-minute cache expiry

    sim.run(body)


def test_a_spot_quota_closes_spot_after_one_error(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        await provisioning(w)
        w.market.set_quota(wk.SPOT, 0)
        w.deploy("web", 1)
        await w.until(lambda: w.all_ready("web"), within=120, what="web ready")
        w.deploy("more", 1, cpu="1500m")
        await w.until(lambda: w.all_ready("more"), within=120, what="more ready")
        assert (
            w.counter(
                "spotwright_launch_failures_total",
                reason="MaxSpotInstanceCountExceeded",
                capacity_type=wk.SPOT,
            )
            == 1
        )
        now = w.clock.now()
        assert all(
            w.ctx.unavailable.is_unavailable(o, now)
            for o in w.market.offerings()
            if o.capacity_type == wk.SPOT
        )
        assert [c.capacity_type for c in w.claims()] == [wk.ON_DEMAND, wk.ON_DEMAND]

    sim.run(body)


def test_a_claim_is_stamped_launched_registered_then_initialized(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        await provisioning(w)
        w.deploy("web", 1)
        await w.until(lambda: w.all_ready("web"), within=120, what="web ready")
        [claim] = w.claims()
        node = w.cluster.node(claim.node_name)
        assert node is not None and node.provider_id == claim.provider_id
        created = w.rel(claim.created_at)
        launched = w.rel(claim.launched_at)
        registered = w.rel(claim.registered_at)
        initialized = w.rel(claim.initialized_at)
        assert launched == pytest.approx(created + 1.0)  # one CreateFleet call
        assert 30 * 0.8 <= registered - launched <= 30 * 1.2  # the instance boots
        assert initialized - registered == pytest.approx(20.0, abs=0.01)  # kubelet ready
        assert claim.allocatable == w.ctx.instance_types[claim.instance_type].allocatable
        assert w.events("Launched", claim.name)

    sim.run(body, boot_seconds=30, node_ready_after=20)


# -- what new nodes carry and hold --------------------------------------------------------


def test_a_pod_selecting_eks_or_eksctl_capacity_labels_runs_on_a_spotwright_node(
    sim: Simulator,
) -> None:
    """Manifests written for EKS managed node groups or eksctl keep scheduling: the node
    carries their labels, so kube-scheduler's literal label match holds as well."""

    async def body(w: World) -> None:
        w.add_nodepool()
        await provisioning(w)
        w.deploy("eks", 1, node_selector={"eks.amazonaws.com/capacityType": "SPOT"})
        w.deploy("eksctl", 1, node_selector={"lifecycle": "Ec2Spot"})
        await w.until(lambda: w.all_ready("eks", "eksctl"), within=120, what="pods ready")
        for app in ("eks", "eksctl"):
            [pod] = w.pods_of(app)
            node = w.cluster.node(pod.node_name or "")
            assert node is not None and node.labels[wk.CAPACITY_TYPE] == wk.SPOT
            assert pod.node_selector.items() <= node.labels.items()

    sim.run(body)


def test_on_demand_nodes_say_so_in_every_vocabulary(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_nodepool(capacity_types=[wk.ON_DEMAND])
        await provisioning(w)
        w.deploy("web", 1)
        await w.until(lambda: w.all_ready("web"), within=120, what="web ready")
        [pod] = w.pods_of("web")
        node = w.cluster.node(pod.node_name or "")
        assert node is not None
        assert node.labels["eks.amazonaws.com/capacityType"] == "ON_DEMAND"
        assert node.labels["lifecycle"] == "OnDemand"

    sim.run(body)


def test_daemonset_pods_are_reserved_room_on_new_nodes(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        w.add_node("existing", cpu="2", memory="4Gi")
        # One DaemonSet pod per node, as on the existing node: 1 cpu on every new node too.
        w.deploy("agent", 1, cpu="1", memory="256Mi", daemon=True)
        await provisioning(w)
        await w.advance(5)
        assert w.pods_of("agent")[0].node_name == "existing"
        w.deploy("web", 1, cpu="1500m", memory="1Gi")
        await w.until(lambda: bool(w.claims()), within=30, what="a claim")
        [claim] = w.claims()
        # 1.5 cpu alone fits a 2-vCPU type (1.9 cpu allocatable); with the agent it does not.
        for name in claim.instance_types:
            assert w.ctx.instance_types[name].allocatable.cpu >= 2500
        assert claim.requests.cpu == 1500

    sim.run(body)


def test_a_daemonset_that_selects_one_nodepool_reserves_room_only_on_its_nodes(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        for name in ("gpu", "general"):
            pool = w.add_nodepool(name)
            pool.spec.template.metadata.labels["team"] = name
        w.add_node("existing", cpu="2", memory="4Gi", labels={"team": "gpu"})
        # The agent runs only on "gpu" nodes: 1 cpu there, nothing on "general" nodes.
        w.deploy("agent", 1, cpu="1", memory="256Mi", daemon=True, node_selector={"team": "gpu"})
        await provisioning(w)
        await w.advance(5)
        assert w.pods_of("agent")[0].node_name == "existing"
        w.deploy("web", 1, cpu="1500m", memory="1Gi", node_selector={"team": "general"})
        w.deploy("ml", 1, cpu="1500m", memory="1Gi", node_selector={"team": "gpu"})
        await w.until(lambda: len(w.claims()) == 2, within=30, what="two claims")
        by_pool = {c.nodepool: c for c in w.claims()}
        smallest = {
            name: min(w.ctx.instance_types[t].allocatable.cpu for t in c.instance_types)
            for name, c in by_pool.items()
        }
        assert smallest["general"] < 2500, "no DaemonSet room on the general pool's nodes"
        assert smallest["gpu"] >= 2500, "the agent's 1 cpu is reserved on gpu nodes"

    sim.run(body)


def test_a_pod_that_fits_nowhere_does_not_hold_up_the_rest_of_its_batch(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        await provisioning(w)
        w.deploy("huge", 1, cpu="100")
        w.deploy("web", 3)
        await w.until(lambda: w.all_ready("web"), within=120, what="web ready")
        [pod] = w.pods_of("huge")
        [event] = w.events("FailedScheduling", pod.key)  # said once, not every round
        assert "100 cpu" in event.message
        assert w.counter("spotwright_pods_unschedulable") == 1
        [logged] = [line for line in w.log if "could not schedule pod" in line]
        assert pod.key in logged and "100 cpu" in logged
        assert not any(pod.key in e.message for e in w.events("Nominated"))

    sim.run(body)


def test_a_pod_that_fits_nowhere_is_reported_once_until_its_reason_changes(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        w.add_nodepool(instance_types=["m5.large"])
        await provisioner_only(w)
        w.deploy("huge", 1, cpu="4")
        await w.advance(120)  # a dozen retry rounds
        [pod] = w.pods_of("huge")
        [first] = w.events("FailedScheduling", pod.key)
        assert w.counter("spotwright_pods_unschedulable") == 1
        w.nodepools[0] = NodePool.model_validate(
            {"metadata": {"name": "default"}, "spec": {"limits": {"cpu": "0"}}}
        )
        await w.advance(60)
        [_, second] = w.events("FailedScheduling", pod.key)
        assert second.message != first.message and "limits exceeded" in second.message
        logged = [line for line in w.log if "could not schedule pod" in line]
        assert len(logged) == 2
        w.nodepools[0] = NodePool.model_validate({"metadata": {"name": "default"}, "spec": {}})
        await w.advance(30)
        assert w.claims() and w.counter("spotwright_pods_unschedulable") == 0

    sim.run(body)


def test_many_pods_failing_for_one_reason_get_an_event_each_and_a_summary_line(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        await provisioner_only(w)
        w.deploy("huge", 25, cpu="100")
        await w.advance(60)
        assert all(len(w.events("FailedScheduling", p.key)) == 1 for p in w.pods_of("huge"))
        assert w.counter("spotwright_pods_unschedulable") == 25
        logged = [line for line in w.log if "could not schedule" in line]
        assert len(logged) == 11  # ten pods by name, then the other 15 counted
        assert "15" in logged[-1] and "100 cpu" in logged[-1]

    sim.run(body)


def test_a_node_from_a_bare_kubelet_gets_its_claims_labels_and_taints(sim: Simulator) -> None:
    """A live kubelet bootstrapped from the user's own user data registers with no
    NodePool labels or taints; registration adds them, so the pods placed on the claim
    (by those labels) can bind and the pods kept off it (by those taints) stay off."""

    async def body(w: World) -> None:
        pool = NodePool.model_validate(
            {
                "metadata": {"name": "team-a"},
                "spec": {
                    "template": {
                        "metadata": {"labels": {"team": "a"}},
                        "spec": {"taints": [{"key": "team", "value": "a", "effect": "NoSchedule"}]},
                    }
                },
            }
        )
        w.nodepools.append(pool)
        register = w.cluster.register_node

        def bare_kubelet(node: Node) -> None:
            node.labels = {wk.HOSTNAME: node.name}
            node.taints = []
            register(node)

        w.cluster.register_node = bare_kubelet  # type: ignore[method-assign]
        await provisioning(w)
        w.deploy(
            "web",
            2,
            node_selector={"team": "a", "eks.amazonaws.com/capacityType": "SPOT"},
            tolerations=(Toleration("team", "Equal", "a"),),
        )
        await w.until(lambda: w.all_ready("web"), within=120, what="web ready")
        [claim] = w.claims()
        node = w.cluster.node(claim.node_name)
        assert node is not None
        assert node.labels["team"] == "a" and node.labels[wk.NODEPOOL] == "team-a"
        assert node.labels[wk.CAPACITY_TYPE] == wk.SPOT
        assert node.labels["lifecycle"] == "Ec2Spot"
        assert node.labels[wk.INSTANCE_TYPE] == claim.instance_type
        assert node.labels[wk.HOSTNAME] == node.name
        assert Taint("team", "NoSchedule", "a") in node.taints

    sim.run(body, node_ready_after=5)


# -- startup taints -------------------------------------------------------------------------

_STARTUP = Taint("example.com/agent-not-ready", "NoSchedule")


def _startup_tainted_pool(w: World) -> NodePool:
    pool = NodePool.model_validate(
        {
            "metadata": {"name": "default"},
            "spec": {
                "template": {
                    "spec": {
                        "requirements": [
                            {"key": wk.CAPACITY_TYPE, "operator": "In", "values": [wk.SPOT]}
                        ],
                        "startupTaints": [{"key": _STARTUP.key, "effect": _STARTUP.effect}],
                    }
                }
            },
        }
    )
    w.nodepools.append(pool)
    return pool


def test_pods_that_do_not_tolerate_a_startup_taint_land_once_the_agent_removes_it(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        _startup_tainted_pool(w)
        await provisioning(w)
        w.deploy("web", 3)
        await w.until(
            lambda: bool(w.claims()) and bool(w.claims()[0].node_name),
            within=120,
            what="the claim's node registered",
        )
        [claim] = w.claims()
        await w.advance(30)  # the node is ready, the agent has not run yet
        node = w.cluster.node(claim.node_name)
        assert node is not None and node.ready
        assert _STARTUP in node.taints, "registration puts the startup taint on the node"
        assert claim.initialized_at is None, "not initialized while a startup taint is on"
        assert all(p.node_name is None for p in w.pods_of("web"))
        assert len(w.claim_history) == 1, "no second node for pods waiting on the first"

        await w.cluster.patch_node(node.name, remove_taints=[_STARTUP.key])  # the agent
        await w.until(lambda: w.all_ready("web"), within=60, what="web ready")
        assert {p.node_name for p in w.pods_of("web")} == {node.name}
        assert w.claims()[0].initialized_at is not None
        assert len(w.claim_history) == 1

    sim.run(body, node_ready_after=5.0)


def test_a_scenario_whose_nodepool_has_startup_taints_still_runs_every_pod(
    tmp_path: Path,
) -> None:
    """In ``spotwright simulate`` the node's agent clears startup taints a few seconds
    after the node is up, so workloads that do not tolerate them still run there."""
    from spotwright.catalog import load_catalog
    from spotwright.model.scenario import load_scenario
    from spotwright.observability.logs import configure_logging
    from spotwright.simulation import simulate

    source = Path(__file__).resolve().parents[1] / "examples" / "spot-interruption.yaml"
    doc = yaml.safe_load(source.read_text())
    doc["spec"]["events"] = []
    template = doc["spec"]["nodePools"][0]["spec"]["template"]["spec"]
    template["startupTaints"] = [{"key": _STARTUP.key, "effect": _STARTUP.effect}]
    path = tmp_path / "startup-taints.yaml"
    path.write_text(yaml.safe_dump(doc))
    configure_logging(sink=lambda _line: None)
    catalog = load_catalog()
    summary = simulate(load_scenario(path, catalog), catalog, seed=1)
    assert summary["pods"]["lost"] == 0
    assert summary["availability_pct"] > 90
    assert sum(summary["nodes"]["launched"].values()) == 1
