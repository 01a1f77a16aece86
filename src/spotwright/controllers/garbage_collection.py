"""Liveness and garbage collection of node claims and instances.

Leftovers cost money or hold pods back without serving them: a claim whose instance
launched but whose node never registered (a bad AMI, a broken bootstrap), a claim that
never launched at all (a launch call that hangs, a controller that died mid-launch), and
an instance that no claim knows about (the controller restarted between launch and
recording it, a launch given up on that still went through, a claim removed by hand).
The claims are deleted after the registration timeout (15 minutes after launch) or the
launch timeout (5 minutes after creation), so their pods, still pending, are provisioned
again elsewhere; the lifecycle controller applies the launch timeout to its own calls
too, so this sweep only catches claims nobody is launching. Unclaimed instances are
terminated once they are older than a grace period.
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
        """One pass: expire stuck claims, terminate instances nobody claims."""
        ctx = self.ctx
        now = ctx.clock.now()
        await self._expire_stuck(now)
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

    async def _expire_stuck(self, now: float) -> None:
        """Delete claims that never launched or whose node never registered in time."""
        ctx = self.ctx
        launch = ctx.settings.launch_timeout_seconds
        registration = ctx.settings.registration_timeout_seconds
        for claim in ctx.cluster.node_claims():
            if claim.deleting_since is not None or claim.registered_at is not None:
                continue
            if claim.launched_at is None and 0 < claim.created_at < now - launch:
                reason, event, what, timeout = (
                    "launch_timeout",
                    "LaunchTimeout",
                    "launch did not succeed",
                    launch,
                )
            elif claim.launched_at is not None and now - claim.launched_at > registration:
                reason, event, what, timeout = (
                    "registration_timeout",
                    "RegistrationTimeout",
                    "node did not register",
                    registration,
                )
            else:
                continue
            claim.deleting_since = now
            claim.deletion_reason = reason
            await ctx.cluster.update_node_claim(claim)
            log.warning(
                f"deleting nodeclaim, {what} in time",
                nodeclaim=claim.name,
                provider_id=claim.provider_id,
                timeout=f"{timeout:.0f}s",
            )
            await ctx.cluster.record_event(
                "NodeClaim",
                claim.name,
                event,
                f"{what.capitalize()} within {timeout:.0f}s",
                warning=True,
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
