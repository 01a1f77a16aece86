"""Liveness and garbage collection of node claims and instances.

Two kinds of leftovers cost money without serving pods: a claim whose instance launched but
whose node never registered (a bad AMI, a broken bootstrap), and an instance that no claim
knows about (the controller restarted between launch and recording it, or a claim was
removed by hand). The first is deleted after the registration timeout, so its pods are
provisioned again elsewhere; the second is terminated once it is older than a grace period.
"""

from __future__ import annotations

from spotwright.controllers.context import Context
from spotwright.observability.logs import get_logger

__all__ = ["GarbageCollector"]

log = get_logger("nodeclaim.garbagecollection")


class GarbageCollector:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    async def run(self) -> None:
        while True:
            await self.ctx.clock.sleep(self.ctx.settings.garbage_collection_interval_seconds)
            await self.collect()

    async def collect(self) -> None:
        """One pass: expire unregistered claims, terminate instances nobody claims."""
        ctx = self.ctx
        now = ctx.clock.now()
        timeout = ctx.settings.registration_timeout_seconds
        for claim in ctx.cluster.node_claims():
            if (
                claim.deleting_since is None
                and claim.launched_at is not None
                and claim.registered_at is None
                and now - claim.launched_at > timeout
            ):
                claim.deleting_since = now
                claim.deletion_reason = "registration_timeout"
                await ctx.cluster.update_node_claim(claim)
                log.warning(
                    "deleting nodeclaim, node did not register in time",
                    nodeclaim=claim.name,
                    provider_id=claim.provider_id,
                    timeout=f"{timeout:.0f}s",
                )
                await ctx.cluster.record_event(
                    "NodeClaim",
                    claim.name,
                    "RegistrationTimeout",
                    f"Node did not register within {timeout:.0f}s",
                    warning=True,
                )
        await self._forget_vanished(now)
        known = {c.provider_id for c in ctx.cluster.node_claims() if c.provider_id}
        grace = ctx.settings.garbage_collection_grace_seconds
        for instance in await ctx.cloud.list_owned():
            if instance.provider_id in known or now - instance.launched_at < grace:
                continue
            await ctx.cloud.terminate(instance.id)
            ctx.metrics.nodeclaims_terminated.labels("garbage_collected").inc()
            log.info(
                "garbage-collected orphaned instance",
                instance_id=instance.id,
                instance_type=instance.instance_type,
                zone=instance.zone,
            )

    async def _forget_vanished(self, now: float) -> None:
        """Delete claims whose instance is gone (a state-change message was missed)."""
        ctx = self.ctx
        live = [c for c in ctx.cluster.node_claims() if c.provider_id and c.deleting_since is None]
        if not live:
            return
        ids = [c.provider_id.rsplit("/", 1)[-1] for c in live]
        states = {i.id: i.state for i in await ctx.cloud.describe(ids)}
        for claim, instance_id in zip(live, ids, strict=True):
            if states.get(instance_id, "terminated") not in ("terminated", "shutting-down"):
                continue
            claim.deleting_since = now
            claim.drain_deadline = now
            claim.deletion_reason = "instance_terminated"
            await ctx.cluster.update_node_claim(claim)
            log.info(
                "deleting nodeclaim, its instance is gone",
                nodeclaim=claim.name,
                instance_id=instance_id,
            )
