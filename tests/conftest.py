"""A small world on the virtual clock, shared by the cluster and controller tests.

The controllers only make sense against a cluster that schedules pods and a cloud that
boots instances, so their tests run against the real parts the simulator uses: the
in-memory cluster (with the simulator's ledger as its observer, so evictions and lost pods
are counted the way ``spotwright simulate`` reports them), the simulated market with its
random interruptions switched off, and the in-memory queue. ``World`` wires them as
``simulation.world`` does, plus the knobs these tests need: how long a node takes to turn
ready, whether the market's EventBridge events reach the queue, and builders for nodes,
deployments, budgets and NodePools. Each test body runs on the virtual event loop, so
minutes of controller time pass instantly and every run is the same.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import pytest
import structlog

from spotwright.adapters.memory_cluster import MemoryCluster, RecordedEvent
from spotwright.adapters.memory_queue import MemoryQueue
from spotwright.adapters.sim_market import SimulatedMarket
from spotwright.adapters.virtual_loop import run_virtual
from spotwright.catalog import InstanceType
from spotwright.controllers import (
    Context,
    InterruptionHandler,
    NodeClaimLifecycle,
    Provisioner,
    Settings,
    Terminator,
)
from spotwright.model import labels as wk
from spotwright.model.nodepool import NodePool
from spotwright.model.nodes import node_for_instance
from spotwright.model.objects import (
    Deployment,
    Node,
    NodeClaim,
    Pod,
    PodDisruptionBudget,
    Taint,
)
from spotwright.model.resources import GPU, Resources
from spotwright.observability.logs import configure_logging
from spotwright.observability.metrics import Metrics
from spotwright.ports.clock import LoopClock
from spotwright.ports.cloud import Instance
from spotwright.simulation.ledger import Ledger

__all__ = ["CATALOG", "EPOCH", "GIB", "REGION", "ZONES", "Simulator", "World"]

T = TypeVar("T")

GIB = 2**30
EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z, as the simulator uses
REGION = "us-east-1"
ZONES = ("us-east-1a", "us-east-1b")


def _itype(name: str, vcpu: int, mem_gib: int, od_price: float, *, gpu: int = 0) -> InstanceType:
    """A type with round allocatable figures: 100m cpu and 1 GiB kept for the system."""
    family, _, size = name.partition(".")
    return InstanceType(
        name=name,
        family=family,
        category=family[0],
        generation=int("".join(c for c in family if c.isdigit()) or 1),
        size=size,
        vcpu=vcpu,
        memory_mib=mem_gib * 1024,
        arch="amd64",
        gpu_count=gpu,
        gpu_name="a10g" if gpu else "",
        allocatable=Resources(
            cpu=vcpu * 1000 - 100, memory=(mem_gib - 1) * GIB, gpu=gpu, pods=29, ephemeral=20 * GIB
        ),
        od_price=od_price,
        spot_savings_pct=60.0,
        interruption_band=1,
    )


#: Prices far enough apart that the zone spread of spot prices never reorders them.
CATALOG: dict[str, InstanceType] = {
    t.name: t
    for t in (
        _itype("c5.large", 2, 4, 0.085),
        _itype("m5.large", 2, 8, 0.096),
        _itype("m5.xlarge", 4, 16, 0.192),
        _itype("m5.2xlarge", 8, 32, 0.384),
        _itype("g5.xlarge", 4, 16, 1.006, gpu=1),
    )
}


class ControllerFailed(AssertionError):
    """A controller task died: the test fails with its exception as the cause."""


class World:
    """The cluster, the market and the queue around the controllers under test."""

    def __init__(
        self,
        *,
        settings: Settings,
        boot_seconds: float,
        node_ready_after: float,
        forward_events: bool,
        types: Mapping[str, InstanceType],
        seed: int,
    ) -> None:
        self.clock = LoopClock(epoch=EPOCH)
        self.ledger = Ledger()
        self.cluster = MemoryCluster(self.clock, self.ledger)
        self.queue = MemoryQueue()
        #: Every EventBridge event the market emitted, forwarded to the queue or not.
        self.published: list[dict[str, Any]] = []
        self.log: list[str] = []
        self.market = SimulatedMarket(
            list(types.values()),
            region=REGION,
            zones=ZONES,
            clock=self.clock,
            rng=random.Random(seed),
            interruptions="none",
            boot_seconds=boot_seconds,
            on_running=self._on_running,
            on_terminated=self._on_terminated,
            publish=self._publish,
        )
        self.nodepools: list[NodePool] = []
        self.metrics = Metrics()
        self.ctx = Context(
            cluster=self.cluster,
            cloud=self.market,
            clock=self.clock,
            metrics=self.metrics,
            nodepools=self.nodepools,
            instance_types=types,
            settings=settings,
        )
        self._types = types
        self._node_ready_after = node_ready_after
        self._forward = forward_events
        self._node_of: dict[str, str] = {}
        self._tasks: list[asyncio.Task[None]] = []
        #: Every node claim ever created, in order, including those since removed.
        self.claim_history: list[NodeClaim] = []
        self._tasks.append(asyncio.create_task(self._record_claims()))

    # -- time -----------------------------------------------------------------------------
    def elapsed(self) -> float:
        """Virtual seconds since the world started."""
        return self.clock.now() - EPOCH

    def rel(self, moment: float | None) -> float:
        """A clock reading (``ready_at``, ``created_at``...) as seconds since the start."""
        assert moment is not None, "that has not happened"
        return moment - EPOCH

    async def advance(self, seconds: float) -> None:
        await self.clock.sleep(seconds)
        self.check()

    async def until(
        self, predicate: Callable[[], bool], *, within: float, what: str, step: float = 0.1
    ) -> float:
        """Let time pass until ``predicate`` holds; returns the elapsed time then.

        Fails after ``within`` seconds, naming ``what`` was awaited.
        """
        give_up = self.clock.now() + within
        while not predicate():
            if self.clock.now() >= give_up:
                raise AssertionError(f"{what}: still not true after {within:g}s")
            await self.clock.sleep(step)
            self.check()
        return self.elapsed()

    # -- controllers ----------------------------------------------------------------------
    async def start(self, *controllers: Coroutine[Any, Any, None]) -> None:
        """Start controllers and let them subscribe to their watches, as at process start."""
        for controller in controllers:
            self._tasks.append(asyncio.create_task(controller))
        for _ in range(3):
            await asyncio.sleep(0)

    async def start_controllers(self, *, interruptions: bool = False) -> None:
        """Provisioner, node-claim lifecycle and termination; the interruption handler too."""
        await self.start(
            Provisioner(self.ctx).run(),
            NodeClaimLifecycle(self.ctx).run(),
            Terminator(self.ctx).run(),
        )
        if interruptions:
            await self.start(InterruptionHandler(self.ctx, self.queue).run())

    async def stop(self) -> None:
        """Cancel the controllers (a failed test must not leave the loop waiting forever)."""
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=1.0)

    def check(self) -> None:
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise ControllerFailed(f"controller {task.get_coro()!r} failed") from (
                    task.exception()
                )

    # -- building the world ---------------------------------------------------------------
    def add_nodepool(
        self,
        name: str = "default",
        *,
        capacity_types: Sequence[str] = (wk.SPOT, wk.ON_DEMAND),
        limits: Mapping[str, str | int] | None = None,
        instance_types: Sequence[str] | None = None,
    ) -> NodePool:
        requirements: list[dict[str, Any]] = [
            {"key": wk.CAPACITY_TYPE, "operator": "In", "values": list(capacity_types)}
        ]
        if instance_types is not None:
            requirements.append(
                {"key": wk.INSTANCE_TYPE, "operator": "In", "values": list(instance_types)}
            )
        spec: dict[str, Any] = {"template": {"spec": {"requirements": requirements}}}
        if limits is not None:
            spec["limits"] = dict(limits)
        pool = NodePool.model_validate({"metadata": {"name": name}, "spec": spec})
        self.nodepools.append(pool)
        return pool

    def add_node(
        self,
        name: str,
        *,
        cpu: str = "4",
        memory: str = "16Gi",
        gpu: int = 0,
        max_pods: int = 110,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Taint] = (),
        ready: bool = True,
        unschedulable: bool = False,
    ) -> Node:
        """A node that joins by itself (no claim, no instance), as a kubelet would."""
        node = Node(
            name=name,
            labels={wk.HOSTNAME: name, **(labels or {})},
            taints=list(taints),
            unschedulable=unschedulable,
            allocatable=Resources.from_k8s(
                {"cpu": cpu, "memory": memory, GPU: gpu, "pods": max_pods}
            ),
            ready=ready,
            created_at=self.clock.now(),
        )
        self.cluster.register_node(node)
        return node

    def deploy(
        self,
        name: str,
        replicas: int = 1,
        *,
        cpu: str = "500m",
        memory: str = "512Mi",
        gpu: int = 0,
        **template: Any,
    ) -> Deployment:
        """Apply a Deployment whose pods are labelled ``app: <name>``."""
        requests = Resources.from_k8s({"cpu": cpu, "memory": memory, GPU: gpu})
        labels = {"app": name, **template.pop("labels", {})}
        deployment = Deployment(
            name=name,
            replicas=replicas,
            template=Pod(name="", labels=labels, requests=requests, **template),
        )
        self.cluster.apply_deployment(deployment)
        return deployment

    def pdb(
        self,
        app: str,
        *,
        min_available: int | str | None = None,
        max_unavailable: int | str | None = None,
    ) -> PodDisruptionBudget:
        budget = PodDisruptionBudget(
            name=f"{app}-pdb",
            selector={"app": app},
            min_available=min_available,
            max_unavailable=max_unavailable,
        )
        self.cluster.apply_pdb(budget)
        return budget

    # -- reading the world ----------------------------------------------------------------
    def pods_of(self, app: str) -> list[Pod]:
        """The live (not terminating) pods of a Deployment, oldest first."""
        pods = [p for p in self.cluster.pods() if p.owner == app and not p.terminating]
        return sorted(pods, key=lambda p: (p.created_at, p.name))

    def ready(self, app: str) -> int:
        return sum(1 for p in self.pods_of(app) if p.ready)

    def all_ready(self, *apps: str) -> bool:
        wanted = {d.name: d.replicas for d in self.cluster.deployments()}
        return all(self.ready(app) == wanted[app] for app in apps)

    def claims(self) -> list[NodeClaim]:
        return sorted(self.cluster.node_claims(), key=lambda c: (c.created_at, c.name))

    def events(self, reason: str, name: str | None = None) -> list[RecordedEvent]:
        return [
            e
            for e in self.cluster.events
            if e.reason == reason and (name is None or e.name == name)
        ]

    def instance(self, claim: NodeClaim) -> Instance:
        """The market's view of the instance behind a launched claim."""
        found = [i for i in self.market.instances() if i.provider_id == claim.provider_id]
        assert found, f"nodeclaim {claim.name} has no instance"
        return found[0]

    def counter(self, name: str, **labels: str) -> float:
        """A metric sample, read back from the registry (0 when never incremented)."""
        value = self.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    async def _record_claims(self) -> None:
        async for event in self.cluster.watch("nodeclaim"):
            claim = self.cluster.node_claim(event.name)
            if event.type == "ADDED" and claim is not None:
                self.claim_history.append(claim)

    # -- EC2 and kubelet ------------------------------------------------------------------
    def _on_running(self, instance: Instance) -> None:
        itype = self._types[instance.instance_type]
        claim = self.cluster.node_claim(instance.tags.get("karpenter.sh/nodeclaim", ""))
        name = instance.private_dns or instance.id
        ready = self._node_ready_after <= 0
        node = node_for_instance(
            name=name,
            provider_id=instance.provider_id,
            claim=claim,
            instance_type=itype,
            zone=instance.zone,
            region=REGION,
            capacity_type=instance.capacity_type,
            now=self.clock.now(),
            ready=ready,
        )
        self._node_of[instance.id] = name
        self.cluster.register_node(node)
        if not ready:
            asyncio.get_running_loop().call_later(
                self._node_ready_after, self.cluster.set_node_ready, name
            )

    def _on_terminated(self, instance: Instance, _reason: str) -> None:
        name = self._node_of.pop(instance.id, None)
        if name is not None:
            self.cluster.node_lost(name)

    def _publish(self, event: dict[str, Any]) -> None:
        self.published.append(event)
        if self._forward:
            self.queue.put(event)


class Simulator:
    """Runs one test body in a fresh ``World`` on the virtual event loop."""

    def run(
        self,
        body: Callable[[World], Awaitable[T]],
        *,
        settings: Settings | None = None,
        boot_seconds: float = 30.0,
        node_ready_after: float = 0.0,
        forward_events: bool = False,
        types: Mapping[str, InstanceType] = CATALOG,
        seed: int = 1,
    ) -> T:
        async def main() -> T:
            world = World(
                settings=settings or Settings(),
                boot_seconds=boot_seconds,
                node_ready_after=node_ready_after,
                forward_events=forward_events,
                types=types,
                seed=seed,
            )
            configure_logging(clock=world.clock.now, sink=world.log.append, level="debug")
            try:
                result = await body(world)
                world.check()
            finally:
                await world.stop()
            return result

        return run_virtual(main())


@pytest.fixture
def sim() -> Iterator[Simulator]:
    """A simulator; the global log configuration is restored afterwards."""
    saved = structlog.get_config()
    try:
        yield Simulator()
    finally:
        structlog.configure(**saved)
