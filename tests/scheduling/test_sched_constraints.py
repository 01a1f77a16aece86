"""Constraints Karpenter users rely on, checked on what the scheduler plans.

Each test states a rule a NodePool or pod manifest expresses and checks it on every
claim planned: numeric comparisons on instance labels (Gt, Lt, and Gte/Lte, which a
NodePool may use), PreferNoSchedule taints steering pods away unless nothing else
works, and NodePool limits on memory and GPUs as well as CPU.
"""

from __future__ import annotations

from sched_fixtures import GIB, catalog, offers, pod

from spotwright.model import labels as wk
from spotwright.model.nodepool import NodePool
from spotwright.model.objects import NodeSelectorRequirement as R
from spotwright.model.objects import Taint, Toleration
from spotwright.model.resources import Resources
from spotwright.scheduling import NodePoolTemplate, schedule

TYPES = catalog()
BY_NAME = {t.name: t for t in TYPES}
OFFERS = offers(TYPES)
UNLIMITED = 2**62


def test_gt_and_lt_on_a_pod_bound_every_candidate_type() -> None:
    between = pod(
        "p",
        cpu=500,
        required_affinity=((R(wk.INSTANCE_CPU, "Gt", ("2",)), R(wk.INSTANCE_CPU, "Lt", ("16",))),),
    )
    plan = schedule([between], [], [NodePoolTemplate("default")], TYPES, OFFERS)
    [claim] = plan.new_claims
    cpus = {BY_NAME[n].vcpu for n in claim.instance_types}
    assert cpus and all(2 < c < 16 for c in cpus)
    assert cpus == {4, 8}


def test_gte_and_lte_in_a_nodepool_include_their_bounds() -> None:
    pool = NodePool.model_validate(
        {
            "metadata": {"name": "mid"},
            "spec": {
                "template": {
                    "spec": {
                        "requirements": [
                            {"key": wk.INSTANCE_MEMORY, "operator": "Gte", "values": ["16384"]},
                            {"key": wk.INSTANCE_MEMORY, "operator": "Lte", "values": ["32768"]},
                        ]
                    }
                }
            },
        }
    )
    template = NodePoolTemplate("mid", requirements=pool.requirements())
    plan = schedule([pod("p", cpu=500)], [], [template], TYPES, OFFERS)
    [claim] = plan.new_claims
    memories = {BY_NAME[n].memory_mib for n in claim.instance_types}
    assert memories == {16384, 32768}


def test_a_prefer_no_schedule_pool_is_used_only_when_nothing_else_works() -> None:
    soft = (Taint("dedicated", "PreferNoSchedule", "batch"),)
    tainted = NodePoolTemplate("batch", weight=100, taints=soft)
    plain = NodePoolTemplate("general", weight=1)
    plan = schedule([pod("p")], [], [tainted, plain], TYPES, OFFERS)
    assert [c.nodepool for c in plan.new_claims] == ["general"]
    plan = schedule([pod("q")], [], [tainted], TYPES, OFFERS)
    assert [c.nodepool for c in plan.new_claims] == ["batch"] and not plan.unschedulable
    tolerant = pod("t", tolerations=(Toleration("dedicated", "Equal", "batch"),))
    plan = schedule([tolerant], [], [tainted, plain], TYPES, OFFERS)
    assert [c.nodepool for c in plan.new_claims] == ["batch"]  # by weight, as it tolerates


def test_memory_and_gpu_limits_hold_like_cpu_limits() -> None:
    memory_capped = NodePoolTemplate(
        "default", remaining=Resources(UNLIMITED, 40 * GIB, UNLIMITED, UNLIMITED, UNLIMITED)
    )
    pods = [pod(f"m{i}", cpu=250, mem_gib=12) for i in range(6)]
    plan = schedule(pods, [], [memory_capped], TYPES, OFFERS)
    planned = sum(BY_NAME[c.instance_types[0]].allocatable.memory for c in plan.new_claims)
    assert planned <= 40 * GIB
    assert plan.unschedulable
    assert all("limits exceeded (memory)" in r for r in plan.unschedulable.values())

    gpu_capped = NodePoolTemplate(
        "default", remaining=Resources(UNLIMITED, UNLIMITED, 1, UNLIMITED, UNLIMITED)
    )
    gpu_pods = [pod(f"g{i}", cpu=500, gpu=1) for i in range(2)]
    plan = schedule(gpu_pods, [], [gpu_capped], TYPES, OFFERS)
    assert len(plan.new_claims) == 1 and len(plan.unschedulable) == 1
    assert "limits exceeded" in next(iter(plan.unschedulable.values()))
