"""What a ``KubeCluster`` caches: the whole cluster, or one node's share of it.

The controller needs the cluster: every pending pod, every node, every NodeClaim. The
IMDS-mode handler runs on every node (a DaemonSet) and acts on its own node only; if it
cached the cluster too, a 1,000-node cluster would hold 1,000 copies of every pod and
the API server would serve 1,000 cluster-wide watches of pods and nodes, every pod
change sent to every node. ``CacheScope.one_node`` has it list and watch with field
selectors instead: its Node (``metadata.name``) and the pods bound to it
(``spec.nodeName``). It skips the PodDisruptionBudgets (the Eviction API enforces them on
the server; nothing the handler runs reads them) and the NodeClaims.

One step of the handler needs to look wider: a rebalance recommendation's
replace-then-drain waits until the capacity launched since the node was tainted is ready,
which means looking at every Node and NodeClaim created since. ``WideView`` provides that
for the length of the wait only: cluster-wide informers of Nodes and NodeClaims, started
when the wait begins and stopped when it ends, so the wide watches exist on the few nodes
being replaced, not on all of them all the time. A cluster without spotwright's CRDs (the
handler next to Karpenter) has no NodeClaims to list: the view then falls back to Nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spotwright.adapters.kube.client import NODECLAIMS, NODES, Api
from spotwright.adapters.kube.convert import READINESS_TAINTS, node_from_api
from spotwright.adapters.kube.informer import Informer
from spotwright.adapters.kube.nodeclaims import StoredClaim, claim_from_api
from spotwright.model.objects import Node
from spotwright.observability.logs import get_logger

__all__ = ["CacheScope", "WideView", "visible_node"]

log = get_logger("kube.scope")


@dataclass(frozen=True, slots=True)
class CacheScope:
    """Which objects the caches hold. The default is everything (the controller's)."""

    #: Only this Node and the pods bound to it; None: every node and pod.
    node: str | None = None
    node_claims: bool = True
    pdbs: bool = True

    @classmethod
    def one_node(cls, name: str) -> CacheScope:
        """The IMDS handler's scope: its node, its pods, no NodeClaims, no budgets."""
        if not name:
            raise ValueError("a node-scoped cache needs the node's name")
        return cls(node=name, node_claims=False, pdbs=False)

    @property
    def pod_fields(self) -> Mapping[str, str] | None:
        return {"spec.nodeName": self.node} if self.node else None

    @property
    def node_fields(self) -> Mapping[str, str] | None:
        return {"metadata.name": self.node} if self.node else None


def visible_node(obj: Mapping[str, Any]) -> Node:
    """The node as the controllers see it: without the readiness taints, which the
    record's ``ready`` already says (see ``convert.READINESS_TAINTS``)."""
    node = node_from_api(obj)
    node.taints = [t for t in node.taints if t.key not in READINESS_TAINTS]
    return node


class WideView:
    """Cluster-wide Node and NodeClaim caches that live only while someone needs them."""

    def __init__(self, api: Api, *, claims: bool = True) -> None:
        self.nodes: Informer[Node] = Informer(api, NODES, visible_node)
        self.claims: Informer[StoredClaim] | None = (
            Informer(api, NODECLAIMS, claim_from_api) if claims else None
        )
        self._tasks: dict[str, asyncio.Task[None]] = {
            "nodes": asyncio.create_task(self.nodes.run())
        }
        if self.claims is not None:
            self._tasks["claims"] = asyncio.create_task(self.claims.run())
        self._ready: asyncio.Task[None] | None = None

    async def ready(self, timeout: float) -> None:
        """Wait until the caches have listed; whatever has not within ``timeout`` is stopped
        (and logged), so a missing CRD or permission costs one wait, not one per poll."""
        if self._ready is None:
            self._ready = asyncio.create_task(self._sync(timeout))
        await asyncio.shield(self._ready)

    async def _sync(self, timeout: float) -> None:
        waits = {"nodes": asyncio.create_task(self.nodes.synced.wait())}
        if self.claims is not None:
            waits["claims"] = asyncio.create_task(self.claims.synced.wait())
        await asyncio.wait(list(waits.values()), timeout=timeout)
        for what, wait in waits.items():
            if not wait.done():
                wait.cancel()
                log.warning(
                    "could not list cluster-wide, going on without them",
                    objects=what,
                    waited=f"{timeout:.0f}s",
                )
                await self._stop(what)

    @property
    def node_items(self) -> Mapping[str, Node]:
        return self.nodes.items if self.nodes.synced.is_set() else {}

    @property
    def claim_items(self) -> Mapping[str, StoredClaim]:
        if self.claims is None or not self.claims.synced.is_set():
            return {}
        return self.claims.items

    async def _stop(self, what: str) -> None:
        task = self._tasks.pop(what, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if what == "claims":
            self.claims = None

    async def close(self) -> None:
        if self._ready is not None:
            self._ready.cancel()
        for what in list(self._tasks):
            await self._stop(what)
