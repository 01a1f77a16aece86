"""Which instances are this cluster's, for messages that arrive after their node claim.

A shared interruption queue carries other clusters' messages, which must be released for
their owner; but a message about one of this cluster's instances whose claim is gone
already (a copy delivered again after the drain finished, a late state change, a restart
between the claim's removal and the message's deletion) must be deleted, or it would be
released forever. ``InstanceIndex`` answers from the claims it has seen (every claim this
process saw keeps its instance id for a while), then from the cloud:

* the instance is still among this cluster's instances (``Cloud.list_owned``): its claim
  was removed by hand, and garbage collection terminates it;
* described, it carries one of this cluster's NodePool (or node group) names in
  ``karpenter.sh/nodepool`` and no cluster-ownership tag
  (``kubernetes.io/cluster/<name>: owned``) that this cluster's live instances lack. EC2
  tags every launch with the cluster's tag, so another cluster's instance, even from a
  pool of the same name, is not mistaken for ours; with no live instance to compare with,
  a tagged instance counts as foreign, which errs on the side of releasing.

An answer "not ours" is kept for a while, so each foreign message does not cost a cloud
call at each delivery.
"""

from __future__ import annotations

from collections import OrderedDict

from spotwright.controllers.context import Context
from spotwright.model import labels as wk
from spotwright.model.objects import NodeClaim
from spotwright.observability.logs import get_logger
from spotwright.ports.cloud import CloudError, Instance

__all__ = ["InstanceIndex"]

log = get_logger("interruption")

_CLUSTER_TAG = "kubernetes.io/cluster/"


class InstanceIndex:
    def __init__(
        self,
        ctx: Context,
        *,
        remembered: int = 50_000,
        owned_ttl: float = 30.0,
        foreign_ttl: float = 600.0,
    ) -> None:
        self.ctx = ctx
        self.remembered = remembered
        self.owned_ttl = owned_ttl
        self.foreign_ttl = foreign_ttl
        #: Instance id -> node claim name, for every claim seen (gone ones included).
        self._claims: OrderedDict[str, str] = OrderedDict()
        self._foreign: dict[str, float] = {}
        self._owned: tuple[float, list[Instance]] | None = None

    def note(self, claim: NodeClaim) -> None:
        """Remember the claim's instance (a no-op before it launched)."""
        instance_id = claim.provider_id.rsplit("/", 1)[-1]
        if not instance_id:
            return
        self._claims[instance_id] = claim.name
        self._claims.move_to_end(instance_id)
        if len(self._claims) > self.remembered:
            self._claims.popitem(last=False)

    def claim_for(self, instance_id: str) -> NodeClaim | None:
        """The live node claim of the instance, if any."""
        if not instance_id:
            return None
        suffix = "/" + instance_id
        name = self._claims.get(instance_id)
        if name is not None:
            claim = self.ctx.cluster.node_claim(name)
            if claim is not None and claim.provider_id.endswith(suffix):
                return claim
        for claim in self.ctx.cluster.node_claims():
            if claim.provider_id.endswith(suffix):
                self.note(claim)
                return claim
        return None

    async def was_ours(self, instance_id: str) -> bool:
        """Whether the instance is (or was) this cluster's, though it has no claim now."""
        if instance_id in self._claims:
            return True
        now = self.ctx.clock.now()
        if self._foreign.get(instance_id, 0.0) > now:
            return False
        try:
            if self._owned is None or self._owned[0] <= now:
                self._owned = (now + self.owned_ttl, await self.ctx.cloud.list_owned())
            owned = self._owned[1]
            if any(i.id == instance_id for i in owned):
                return True
            described = await self.ctx.cloud.describe([instance_id])
        except CloudError as exc:
            log.warning("could not ask the cloud who owns an instance", error=str(exc))
            return False
        if described and self._tagged_ours(described[0], owned):
            return True
        self._foreign = {k: t for k, t in self._foreign.items() if t > now}
        self._foreign[instance_id] = now + self.foreign_ttl
        return False

    def _tagged_ours(self, instance: Instance, owned: list[Instance]) -> bool:
        pools = {p.name for p in self.ctx.nodepools} | self.ctx.nodegroup_names
        if instance.tags.get(wk.NODEPOOL) not in pools:
            return False
        ours = {k for i in owned for k, v in i.tags.items() if _owned_tag(k, v)}
        return all(k in ours for k, v in instance.tags.items() if _owned_tag(k, v))


def _owned_tag(key: str, value: str) -> bool:
    return key.startswith(_CLUSTER_TAG) and value == "owned"
