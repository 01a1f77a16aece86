"""The Kubernetes port: the reads and the few writes the controllers make.

Reads come from a cache (a list-then-watch cache live, the objects themselves in memory)
and are synchronous. Writes are coroutines and are patches, never whole-object updates.
Change notifications arrive through ``watch()``, one queue per subscriber.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from spotwright.model.objects import Node, NodeClaim, Pod, PodDisruptionBudget, Taint

__all__ = [
    "Cluster",
    "ClusterError",
    "EvictionBlocked",
    "Kind",
    "NotFound",
    "WatchEvent",
]

Kind = Literal["pod", "node", "nodeclaim"]


@dataclass(frozen=True, slots=True)
class WatchEvent:
    kind: Kind
    type: Literal["ADDED", "MODIFIED", "DELETED"]
    name: str


class ClusterError(Exception):
    pass


class NotFound(ClusterError):
    pass


class EvictionBlocked(ClusterError):
    """The Eviction API answered 429: a PodDisruptionBudget allows no disruption now.

    ``budget`` is the refusing budget's ``namespace/name`` when the answer says which
    (the drain names it in the Event it records), else None.
    """

    def __init__(self, message: str, budget: str | None = None) -> None:
        super().__init__(message)
        self.budget = budget


class Cluster(Protocol):
    # -- reads (from the cache) -------------------------------------------------------
    def pods(self) -> Sequence[Pod]: ...

    def pod(self, key: str) -> Pod | None:
        """A pod by ``namespace/name``."""
        ...

    def pods_on(self, node_name: str) -> Sequence[Pod]: ...

    def nodes(self) -> Sequence[Node]: ...

    def node(self, name: str) -> Node | None: ...

    def node_claims(self) -> Sequence[NodeClaim]: ...

    def node_claim(self, name: str) -> NodeClaim | None: ...

    def pdbs(self) -> Sequence[PodDisruptionBudget]:
        """The cached budgets; empty when the cache does not hold them."""
        ...

    def watch(self, *kinds: Kind) -> AsyncIterator[WatchEvent]:
        """Changes to objects of these kinds, from now on, until the iterator is closed."""
        ...

    # -- writes -----------------------------------------------------------------------
    async def create_node_claim(self, claim: NodeClaim) -> None: ...

    async def update_node_claim(self, claim: NodeClaim) -> None:
        """Write the claim's status fields (launch result, registration, deletion)."""
        ...

    async def remove_node_claim(self, name: str) -> None:
        """Drop the claim's finalizer once its instance is gone; the object disappears."""
        ...

    async def patch_node(
        self,
        name: str,
        *,
        add_taints: Sequence[Taint] = (),
        remove_taints: Sequence[str] = (),
        unschedulable: bool | None = None,
        labels: Mapping[str, str | None] | None = None,
    ) -> None: ...

    async def delete_node(self, name: str) -> None: ...

    async def evict(self, pod: Pod) -> None:
        """Evict through the Eviction API; raises EvictionBlocked on a PDB 429."""
        ...

    async def delete_pod(self, pod: Pod, grace_seconds: float | None = None) -> None: ...

    async def record_event(
        self, kind: str, name: str, reason: str, message: str, *, warning: bool = False
    ) -> None:
        """A Kubernetes Event about an object, for ``kubectl describe`` readers."""
        ...
