"""A node claim removed while the lifecycle controller works on it is no failure.

During a mass termination claims disappear between the watch event that woke the
controller and its write: a launch result or a registration lands on a claim that is gone.
Before, the write's NotFound stopped the lifecycle controller, and every later claim
waited forever for its launch. Now the claim is simply let go (and an instance launched
for it terminated, not leaked), and the next claims launch and register as usual. The real
provisioner and lifecycle controllers run against the in-memory cluster, in virtual time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from spotwright.controllers import NodeClaimLifecycle, Provisioner
from spotwright.model.objects import NodeClaim

if TYPE_CHECKING:
    from conftest import Simulator, World


def remove_before_update(w: World, when: Callable[[NodeClaim], bool]) -> list[NodeClaim]:
    """Make the cluster remove the first claim matching ``when`` just before it is
    written, as a concurrent deletion would; the removed claims are listed."""
    removed: list[NodeClaim] = []
    update = w.cluster.update_node_claim

    async def racing_update(claim: NodeClaim) -> None:
        if not removed and when(claim):
            removed.append(claim)
            await w.cluster.remove_node_claim(claim.name)
        await update(claim)

    w.cluster.update_node_claim = racing_update  # type: ignore[method-assign]
    return removed


async def next_claim_runs(w: World, app: str) -> None:
    """A later workload (too big for the first node) still gets a claim that launches,
    registers and runs its pods."""
    w.deploy(app, 1, cpu="3")
    await w.until(lambda: w.all_ready(app), within=180, what=f"{app} ready")
    [pod] = w.pods_of(app)
    [claim] = [c for c in w.claims() if c.node_name == pod.node_name]
    assert claim.registered_at is not None


def test_a_claim_removed_as_its_launch_result_is_written_leaks_no_instance(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        removed = remove_before_update(w, lambda c: bool(c.provider_id))
        await w.start(Provisioner(w.ctx).run(), NodeClaimLifecycle(w.ctx).run())
        w.deploy("web", 1)
        await w.until(lambda: bool(removed), within=60, what="the race")
        await w.advance(5)  # w.check() fails the test if a controller died
        [gone] = removed
        instance = w.instance(gone)
        assert instance.state in ("shutting-down", "terminated")
        await next_claim_runs(w, "api")

    sim.run(body)


def test_a_claim_removed_as_its_registration_is_written_is_let_go(sim: Simulator) -> None:
    async def body(w: World) -> None:
        w.add_nodepool()
        removed = remove_before_update(w, lambda c: c.registered_at is not None)
        await w.start(Provisioner(w.ctx).run(), NodeClaimLifecycle(w.ctx).run())
        w.deploy("web", 1)
        await w.until(lambda: bool(removed), within=120, what="the race")
        await w.advance(5)
        assert w.cluster.node_claim(removed[0].name) is None
        await next_claim_runs(w, "api")

    sim.run(body)
