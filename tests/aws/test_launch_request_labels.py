"""What the lifecycle controller asks the cloud for: a node that registers with its claim's
labels and taints. The launch request carries them (the EC2 adapter writes them into the
user data), so they are on the node from its first moment, not added after pods bound.
The real provisioner and lifecycle controller run against the in-memory world."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spotwright.controllers import NodeClaimLifecycle, Provisioner
from spotwright.model import labels as wk
from spotwright.model.nodepool import NodePool
from spotwright.model.objects import Taint, Toleration
from spotwright.ports.cloud import Instance, LaunchRequest

if TYPE_CHECKING:
    from conftest import Simulator, World


def test_a_launch_request_names_the_labels_and_taints_the_node_registers_with(
    sim: Simulator,
) -> None:
    async def body(w: World) -> None:
        pool = NodePool.model_validate(
            {
                "metadata": {"name": "ml"},
                "spec": {
                    "template": {
                        "metadata": {"labels": {"team": "ml"}},
                        "spec": {
                            "requirements": [
                                {"key": wk.CAPACITY_TYPE, "operator": "In", "values": ["spot"]}
                            ],
                            "taints": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}],
                            "startupTaints": [{"key": "agent-not-ready", "effect": "NoExecute"}],
                        },
                    }
                },
            }
        )
        w.nodepools.append(pool)
        requests: list[LaunchRequest] = []
        launch = w.ctx.cloud.launch

        async def recording(request: LaunchRequest) -> Instance:
            requests.append(request)
            return await launch(request)

        w.ctx.cloud.launch = recording  # type: ignore[method-assign]
        await w.start(Provisioner(w.ctx).run(), NodeClaimLifecycle(w.ctx).run())
        w.deploy("train", 1, tolerations=(Toleration("dedicated", "Equal", "ml"),))
        await w.until(lambda: bool(requests), within=60, what="a launch")
        labels = dict(requests[0].labels)
        assert labels["team"] == "ml"
        assert labels[wk.NODEPOOL] == "ml"
        assert labels[wk.CAPACITY_TYPE] == "spot"
        assert labels["eks.amazonaws.com/capacityType"] == "SPOT"
        assert labels["lifecycle"] == "Ec2Spot"
        assert requests[0].taints == (
            Taint("dedicated", "NoSchedule", "ml"),
            Taint("agent-not-ready", "NoExecute"),
        )

    sim.run(body)
