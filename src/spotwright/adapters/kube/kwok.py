"""``--cloud sim`` on a real cluster: the simulated market, with kwok fake Nodes as instances.

Anyone with a cluster and kwok can watch spotwright provision and drain without an AWS
account: launches go to the same ``SimulatedMarket`` the simulator uses (on the wall
clock), and when an instance has "booted" a Node is created for it, annotated
``kwok.x-k8s.io/node=fake`` so kwok plays its kubelet, with the labels and taints of the
claim and the instance type, the instance's providerID and the type's allocatable. The
Node is deleted when the instance ends. The real scheduler then binds pods to it.

The market lives in the controller's memory, but the fake Nodes and the NodeClaims (which
carry each instance's providerID, type, zone and price) live in the API server. A new
leader or a restarted controller therefore adopts what the previous process launched:
instances it finds through fake Nodes or launched claims are its own to terminate and to
garbage-collect, and a claimed instance whose Node never appeared (the process died while
it booted) is booted again. Each process draws instance ids from fresh randomness so two
incarnations never hand out the same id.
"""

from __future__ import annotations

import asyncio
import random
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from spotwright.adapters.kube.client import NODES, Api, status_code
from spotwright.adapters.kube.cluster import KubeCluster
from spotwright.adapters.kube.convert import format_time, parse_time, taint_to_api
from spotwright.adapters.kube.nodeclaims import quantities
from spotwright.adapters.sim_market import SimulatedMarket
from spotwright.catalog import InstanceType
from spotwright.model import labels as wk
from spotwright.model.nodes import node_for_instance
from spotwright.model.objects import Node, NodeClaim
from spotwright.observability.logs import get_logger
from spotwright.ports.clock import Clock
from spotwright.ports.cloud import Instance, LaunchRequest, Offering

__all__ = ["KWOK_ANNOTATION", "SIMULATED_LABEL", "KwokCloud", "fake_node"]

log = get_logger("kwok")

KWOK_ANNOTATION: Final = ("kwok.x-k8s.io/node", "fake")
#: Marks Nodes that stand for simulated instances (what garbage collection may delete).
SIMULATED_LABEL: Final = "spotwright.io/simulated"
_LAUNCHED_ANNOTATION: Final = "spotwright.io/launched-at"
_PRICE_ANNOTATION: Final = "spotwright.io/price"


def fake_node(
    instance: Instance,
    itype: InstanceType,
    claim: NodeClaim | None,
    *,
    region: str,
) -> dict[str, Any]:
    """The Node a booted simulated instance registers as (``model.nodes`` decides its
    labels and taints, as for every world), marked for kwok and as simulated."""
    node = node_for_instance(
        name=instance.private_dns or instance.id,
        provider_id=instance.provider_id,
        claim=claim,
        instance_type=itype,
        zone=instance.zone,
        region=region,
        capacity_type=instance.capacity_type,
        now=instance.launched_at,
    )
    labels = {**node.labels, wk.OS: "linux", SIMULATED_LABEL: "true", "type": "kwok"}
    allocatable = quantities(node.allocatable)
    key, value = KWOK_ANNOTATION
    return {
        "metadata": {
            "name": node.name,
            "labels": labels,
            "annotations": {
                key: value,
                _LAUNCHED_ANNOTATION: format_time(instance.launched_at),
                _PRICE_ANNOTATION: f"{instance.price:.6f}",
            },
        },
        "spec": {
            "providerID": node.provider_id,
            "taints": [taint_to_api(t) for t in node.taints],
        },
        "status": {"capacity": allocatable, "allocatable": allocatable},
    }


def _instance_id(provider_id: str) -> str:
    return provider_id.rsplit("/", 1)[-1] if provider_id else ""


def _zone(provider_id: str) -> str:
    """``aws:///us-east-1a/i-0123`` -> ``us-east-1a``."""
    parts = provider_id.split("/")
    return parts[-2] if len(parts) >= 2 else ""


class KwokCloud:
    """The Cloud port: a SimulatedMarket whose running instances are kwok Nodes."""

    def __init__(
        self,
        cluster: KubeCluster,
        api: Api,
        instance_types: Sequence[InstanceType],
        *,
        region: str,
        zones: Sequence[str],
        clock: Clock,
        boot_seconds: float = 35.0,
        interruptions: str = "none",
        publish: Callable[[dict[str, Any]], object] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.region = region
        self.cluster = cluster
        self.api = api
        self._clock = clock
        self._types: Mapping[str, InstanceType] = {t.name: t for t in instance_types}
        self._forward = publish
        self._launched: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.market = SimulatedMarket(
            list(instance_types),
            region=region,
            zones=zones,
            clock=clock,
            rng=rng or random.Random(secrets.randbits(64)),
            interruptions="advisor" if interruptions == "advisor" else "none",
            boot_seconds=boot_seconds,
            on_running=self._on_running,
            on_terminated=self._on_terminated,
            publish=self._publish,
        )

    # -- the Cloud port --------------------------------------------------------------------
    def instance_types(self) -> Sequence[InstanceType]:
        return self.market.instance_types()

    def offerings(self) -> Sequence[Offering]:
        return self.market.offerings()

    async def launch(self, request: LaunchRequest) -> Instance:
        instance = await self.market.launch(request)
        self._launched.add(instance.id)
        return instance

    async def terminate(self, instance_id: str) -> None:
        """Ours: the market ends it (its Node goes). Adopted: its Node is deleted."""
        if instance_id in self._launched:
            await self.market.terminate(instance_id)
            return
        for node in self._fake_nodes():
            if _instance_id(node.provider_id) == instance_id:
                await self._delete_node(node.name)
                log.info("terminated adopted instance", instance_id=instance_id, node=node.name)
                return
        log.info("instance already gone", instance_id=instance_id)

    async def describe(self, instance_ids: Sequence[str]) -> list[Instance]:
        ours = {i.id: i for i in await self.market.describe(instance_ids)}
        adopted = {i.id: i for i in self._adopted()}
        return [ours.get(i) or adopted[i] for i in instance_ids if i in ours or i in adopted]

    async def list_owned(self) -> list[Instance]:
        return [*await self.market.list_owned(), *self._adopted()]

    # -- adoption ----------------------------------------------------------------------------
    def _fake_nodes(self) -> list[Node]:
        return [n for n in self.cluster.nodes() if n.labels.get(SIMULATED_LABEL) == "true"]

    def _adopted(self) -> list[Instance]:
        """Instances a previous process launched: fake Nodes the market does not know."""
        out = []
        for node in self._fake_nodes():
            instance_id = _instance_id(node.provider_id)
            if not instance_id or instance_id in self._launched:
                continue
            out.append(
                Instance(
                    id=instance_id,
                    instance_type=node.labels.get(wk.INSTANCE_TYPE, ""),
                    # The providerID's zone, so the instance's providerID is the node's.
                    zone=_zone(node.provider_id) or node.labels.get(wk.ZONE, ""),
                    capacity_type=node.labels.get(wk.CAPACITY_TYPE, ""),
                    price=float(node.annotations.get(_PRICE_ANNOTATION) or 0.0),
                    launched_at=parse_time(node.annotations.get(_LAUNCHED_ANNOTATION))
                    or node.created_at,
                    private_dns=node.name,
                    state="running",
                )
            )
        return out

    async def adopt(self) -> int:
        """Boot again the claimed instances whose Node never appeared; returns how many."""
        nodes = {n.provider_id for n in self.cluster.nodes()}
        booted = 0
        for claim in self.cluster.node_claims():
            instance_id = _instance_id(claim.provider_id)
            if (
                not instance_id
                or instance_id in self._launched
                or claim.provider_id in nodes
                or claim.deleting_since is not None
                or claim.instance_type not in self._types
            ):
                continue
            instance = Instance(
                id=instance_id,
                instance_type=claim.instance_type,
                zone=claim.zone,
                capacity_type=claim.capacity_type,
                price=claim.price,
                launched_at=claim.launched_at or self._clock.now(),
                private_dns=f"ip-{instance_id[2:10]}.sim.internal",
                state="running",
                tags={"karpenter.sh/nodeclaim": claim.name},
            )
            log.info("booting an adopted instance", instance_id=instance_id, nodeclaim=claim.name)
            await self._create_node(instance)
            booted += 1
        return booted

    # -- market callbacks ----------------------------------------------------------------------
    async def run(self) -> None:
        """The market's interruption process (a no-op unless interruptions are on)."""
        try:
            await self.market.run()
            await asyncio.Event().wait()
        finally:
            self.market.close()
            for task in list(self._tasks):
                task.cancel()

    def _spawn(self, work: Any) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_running(self, instance: Instance) -> None:
        self._spawn(self._create_node(instance))

    def _on_terminated(self, instance: Instance, reason: str) -> None:
        self._spawn(self._delete_node(instance.private_dns or instance.id))

    def _publish(self, event: dict[str, Any]) -> None:
        if self._forward is not None:
            self._forward(event)

    async def _create_node(self, instance: Instance) -> None:
        itype = self._types[instance.instance_type]
        claim = self.cluster.node_claim(instance.tags.get("karpenter.sh/nodeclaim", ""))
        body = fake_node(instance, itype, claim, region=self.region)
        try:
            await self.api.create(NODES, body)
        except Exception as exc:
            log.error(
                "could not create the fake node",
                node=body["metadata"]["name"],
                error=f"{type(exc).__name__}: {exc}",
            )
            return
        log.info(
            "fake node joined",
            node=body["metadata"]["name"],
            instance_type=instance.instance_type,
            provider_id=instance.provider_id,
        )

    async def _delete_node(self, name: str) -> None:
        try:
            await self.api.delete(NODES, name)
        except Exception as exc:
            if status_code(exc) != 404:
                log.warning("could not delete the fake node", node=name, error=str(exc))
