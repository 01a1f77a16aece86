"""Why a pod could not be placed, in one sentence a user can act on.

Only computed for pods that failed, so it can afford to re-check every NodePool step by
step (taints, requirements, instance types, offerings, resources, limits, topology) and
stop at the first step that rules each pool out. The message names the constraint and
the NodePool, because "0/3 nodes are available" is what users complain about.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spotwright.model.objects import Pod
from spotwright.model.resources import GPU
from spotwright.scheduling.requirements import Requirements, canonical_key
from spotwright.scheduling.state import Pool
from spotwright.scheduling.taints import tolerates, untolerated_prefer_no_schedule

if TYPE_CHECKING:
    from spotwright.scheduling.packing import _Scheduler
    from spotwright.scheduling.queue import Group, Variant

__all__ = ["explain"]


#: The packer's resource dimensions by their Kubernetes names, as NodePool limits use them.
_LIMITED = ("cpu", "memory", GPU, "pods", "ephemeral-storage")


def _gib(value: int) -> str:
    return f"{value / 2**30:g}Gi"


def _pod_side(pod: Pod, key: str, reqs: Requirements) -> str:
    for sel_key, value in pod.node_selector.items():
        if canonical_key(sel_key) == key:
            return f"pod nodeSelector {key}={value}"
    req = reqs.get(key)
    return f"pod node affinity {req.describe(key)}" if req is not None else f"pod {key}"


def _pool_reason(sched: _Scheduler, pool: Pool, group: Group, v: Variant) -> str:
    pod = group.pods[0]
    name = f'NodePool "{pool.template.name}"'
    taint = tolerates(pod.tolerations, pool.template.taints)
    if taint is None and not v.tolerate_prefer_no_schedule:
        taint = untolerated_prefer_no_schedule(pod.tolerations, pool.template.taints)
    if taint is not None:
        return f"{name} has taint {taint} that the pod does not tolerate"
    key = pool.reqs.conflict(v.reqs)
    if key is not None:
        mine = pool.reqs.get(key)
        theirs = _pod_side(pod, key, v.reqs)
        if mine is None:
            return f"incompatible with {name}: {theirs} but the NodePool sets no {key} label"
        return f"incompatible with {name}: requirement {mine.describe(key)} vs {theirs}"
    reqs = pool.reqs.intersect(v.reqs)
    cands = pool.catalog.candidates(reqs)
    if not cands.types:
        if not pool.catalog.label_compatible(reqs):
            return f"no instance type in {name} matches {reqs}"
        return f"no available offering in {name} for {reqs} (all are unavailable now)"
    need = group.req
    if cands.first_fit(need) < 0:
        best = [max(t.cap[d] for t in cands.types) for d in range(5)]
        short = []
        if need[2] > best[2]:
            short.append(f"{need[2]} {GPU}")
        if need[0] > best[0]:
            short.append(f"{need[0] / 1000:g} cpu")
        if need[1] > best[1]:
            short.append(f"{_gib(need[1])} memory")
        if need[3] > best[3]:
            short.append("room for another pod")
        if need[4] > best[4]:
            short.append(f"{_gib(need[4])} ephemeral-storage")
        if short:
            return f"no instance type in {name} has {' and '.join(short)} allocatable"
        return (
            f"no instance type in {name} fits cpu={need[0]}m memory={_gib(need[1])}"
            f"{f' {GPU}={need[2]}' if need[2] else ''} at once"
        )
    if pool.nodes_left is not None and pool.nodes_left <= 0:
        return f"{name} node limit reached"
    if pool.budget is not None:
        left = [pool.budget[d] - pool.used[d] for d in range(5)]
        fitting = [t for t in cands.types if all(t.cap[d] >= need[d] for d in range(5))]
        if fitting and not any(all(t.alloc[d] <= left[d] for d in range(5)) for t in fitting):
            smallest = min(fitting, key=lambda t: (t.alloc[0], t.alloc[1]))
            dims = [n for d, n in enumerate(_LIMITED) if smallest.alloc[d] > left[d]]
            return f"{name} limits exceeded ({', '.join(dims)})"
    if v.has_terms:
        return f"{name} cannot satisfy the pod's {_terms(v)}"
    return f"no capacity in {name} for the pod"


def _terms(v: Variant) -> str:
    parts = [f"topology spread on {key} (maxSkew {skew})" for key, _, skew, _ in v.spreads]
    parts += [f"pod affinity on {t.topology_key}" for t in v.affinity]
    parts += [f"pod anti-affinity on {t.topology_key}" for t in v.anti]
    return ", ".join(parts)


def explain(sched: _Scheduler, group: Group) -> str:
    """One reason for the whole group, judged against its loosest variant."""
    v = group.variants[-1]
    if group.ext:
        # no instance type lists extended resources, so only existing nodes can take these
        names = ", ".join(f"{n} {name}" for name, n in group.ext)
        return (
            f"no instance type offers {names}: only an existing node with it free can take the pod"
        )
    if not sched.pools:
        return "no NodePool can create capacity and no existing node fits"
    reasons = [_pool_reason(sched, pool, group, v) for pool in sched.pools]
    if v.has_terms and all("cannot satisfy" in r for r in reasons):
        return f"{_terms(v)} cannot be satisfied by any NodePool or existing node"
    return "; ".join(dict.fromkeys(reasons))
