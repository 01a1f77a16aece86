"""The simulated world the controllers run in: a market, a cluster and a queue, wired.

The world plays the parts that are not ours to write in production: EC2 (the simulated
market), the kubelet joining a node when its instance has booted, the node disappearing when
its instance is gone, and EventBridge delivering the market's notices into the queue. It
also keeps the books a user sees at the end of a run, node groups' nodes included.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Mapping
from typing import Any

from spotwright.adapters.memory_cluster import MemoryCluster
from spotwright.adapters.memory_queue import MemoryQueue
from spotwright.adapters.sim_market import SimulatedMarket
from spotwright.catalog import InstanceType
from spotwright.model import labels as wk
from spotwright.model.nodegroup import NODEGROUP_LABEL
from spotwright.model.nodes import node_for_instance
from spotwright.ports.clock import Clock
from spotwright.ports.cloud import Instance
from spotwright.ports.cluster import NotFound
from spotwright.simulation.ledger import Ledger

__all__ = ["SimWorld"]

#: How long after a node is up its agent (a CNI, a GPU operator) clears the startup taints.
STARTUP_AGENT_SECONDS = 5.0
_SPOT_WARNING = "EC2 Spot Instance Interruption Warning"
_REBALANCE = "EC2 Instance Rebalance Recommendation"


class SimWorld:
    def __init__(
        self,
        *,
        instance_types: Mapping[str, InstanceType],
        region: str,
        zones: list[str],
        clock: Clock,
        rng: random.Random,
        interruptions: str,
        rebalance_lead_seconds: float | None,
        boot_seconds: float,
    ) -> None:
        self.clock = clock
        self.instance_types = instance_types
        self.region = region
        self.ledger = Ledger()
        self.cluster = MemoryCluster(clock, self.ledger)
        self.queue = MemoryQueue()
        self.market = SimulatedMarket(
            list(instance_types.values()),
            region=region,
            zones=zones,
            clock=clock,
            rng=rng,
            interruptions="none" if interruptions == "none" else "advisor",
            rebalance_lead_seconds=rebalance_lead_seconds,
            boot_seconds=boot_seconds,
            on_running=self._on_running,
            on_terminated=self._on_terminated,
            publish=self._publish,
        )
        self._node_of: dict[str, str] = {}
        self.running = 0
        self.peak_nodes = 0
        self.notices = 0
        self.rebalances = 0
        self.drained_before_deadline = 0
        self.lost_before_drained = 0
        self._noticed: set[str] = set()
        #: Node groups whose nodes are counted, and the group each node belongs to.
        self._group_of: dict[str, str] = {}
        #: Node agents clearing startup taints (kept so their tasks are not collected).
        self._agents: set[asyncio.Future[None]] = set()

    def track_groups(self, targets: Mapping[str, Mapping[str, int]]) -> None:
        """Count the nodes of these groups (name -> target nodes by capacity type)."""
        for name, target in targets.items():
            self.ledger.track_group(name, dict(target), self.clock.now())
            self._count_group(name)

    def _count_group(self, group: str) -> None:
        nodes: dict[str, int] = {wk.ON_DEMAND: 0, wk.SPOT: 0}
        for node in self.cluster.nodes():
            if node.labels.get(NODEGROUP_LABEL) == group:
                ct = node.labels.get(wk.CAPACITY_TYPE, wk.SPOT)
                nodes[ct] = nodes.get(ct, 0) + 1
        self.ledger.group_nodes(group, nodes, self.clock.now())

    # -- EC2 -> kubelet ---------------------------------------------------------------
    def _on_running(self, instance: Instance) -> None:
        itype = self.instance_types[instance.instance_type]
        claim = self.cluster.node_claim(instance.tags.get("karpenter.sh/nodeclaim", ""))
        name = instance.private_dns or instance.id
        node = node_for_instance(
            name=name,
            provider_id=instance.provider_id,
            claim=claim,
            instance_type=itype,
            zone=instance.zone,
            region=self.region,
            capacity_type=instance.capacity_type,
            now=self.clock.now(),
        )
        if claim is not None and claim.startup_taints:
            # the kubelet registers with them; the node's agent clears them once it is up
            node.taints.extend(t for t in claim.startup_taints if t not in node.taints)
            keys = [t.key for t in claim.startup_taints]
            asyncio.get_running_loop().call_later(
                STARTUP_AGENT_SECONDS, self._start_agent, name, keys
            )
        self._node_of[instance.id] = name
        self.running += 1
        self.peak_nodes = max(self.peak_nodes, self.running)
        self.cluster.register_node(node)
        self.ledger.node_ready(name, self.clock.now())
        group = node.labels.get(NODEGROUP_LABEL)
        if group is not None and group in self.ledger.groups:
            self._group_of[name] = group
            self.ledger.group_launched(group, instance.capacity_type)
            self._count_group(group)

    def _start_agent(self, name: str, keys: list[str]) -> None:
        task = asyncio.ensure_future(self._clear_startup_taints(name, keys))
        self._agents.add(task)
        task.add_done_callback(self._agents.discard)

    async def _clear_startup_taints(self, name: str, keys: list[str]) -> None:
        with contextlib.suppress(NotFound):  # the node went away before its agent ran
            await self.cluster.patch_node(name, remove_taints=keys)

    def _on_terminated(self, instance: Instance, reason: str) -> None:
        name = self._node_of.pop(instance.id, None)
        if name is None:
            return
        self.running -= 1
        if instance.id in self._noticed:
            left = [p for p in self.cluster.pods_on(name) if not p.daemon]
            if left:
                self.lost_before_drained += 1
            else:
                self.drained_before_deadline += 1
            self._noticed.discard(instance.id)
        self.cluster.node_lost(name)
        group = self._group_of.pop(name, None)
        if group is not None:
            self._count_group(group)

    # -- EventBridge -> SQS ---------------------------------------------------------------
    def _publish(self, event: dict[str, Any]) -> None:
        kind = event.get("detail-type")
        instance_id = str(event.get("detail", {}).get("instance-id", ""))
        if kind == _SPOT_WARNING:
            self.notices += 1
            self._noticed.add(instance_id)
            node = self._node_of.get(instance_id)
            if node is not None:
                self.ledger.notice(node, self.clock.now())
        elif kind == _REBALANCE:
            self.rebalances += 1
            node = self._node_of.get(instance_id)
            if node is not None:
                self.ledger.rebalance(node, self.clock.now())
        self.queue.put(event)

    def finish(self) -> None:
        """Count noticed instances that our drain terminated before the market did, and
        close the books of interrupted nodes that still held pods to move."""
        for instance_id in list(self._noticed):
            if instance_id not in self._node_of:
                self.drained_before_deadline += 1
                self._noticed.discard(instance_id)
        self.ledger.interrupted.close(
            {
                name: any(not p.daemon for p in self.cluster.pods_on(name))
                for name in self.ledger.interrupted.nodes
            }
        )
