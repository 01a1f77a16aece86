"""The provisioner: turns pending pods into node claims.

It batches triggers (1 s idle, 10 s at most), then runs one scheduling round over every
provisionable pod plus the pods of nodes being drained, so a drained node's replacement is
ordered before its pods are even evicted. The round itself is pure code (``scheduling``);
this module only gathers the cluster's state for it and writes the resulting claims.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence

from spotwright.controllers.context import Context
from spotwright.controllers.kubelet_plan import claim_allocatable, plan_by_kubelet
from spotwright.model import labels as wk
from spotwright.model.kubelet import KubeletConfiguration
from spotwright.model.objects import NodeClaim, NodeSelectorRequirement, Pod, Taint
from spotwright.model.resources import Resources
from spotwright.observability.logs import get_logger
from spotwright.ports.cloud import NodeClassState, node_class_state
from spotwright.ports.cluster import WatchEvent
from spotwright.scheduling import (
    ClaimPlan,
    ExistingCapacity,
    NodePoolTemplate,
    Requirements,
    pod_requests,
    pod_requirements,
    tolerates,
)

__all__ = ["Provisioner", "is_disrupting"]

log = get_logger("provisioner")


def is_disrupting(claim: NodeClaim | None, taints: Sequence[object] = ()) -> bool:
    """A node is on its way out once its claim is being deleted or it carries the taint."""
    if claim is not None and claim.deleting_since is not None:
        return True
    return any(getattr(t, "key", None) == wk.DISRUPTED_TAINT_KEY for t in taints)


#: What the API server's ``generateName`` draws from: lowercase alphanumerics without
#: vowels and look-alike digits, so a random suffix never spells a word.
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
#: ``generateName`` cuts the prefix to this, so the name fits 63 characters.
_NAME_PREFIX_MAX = 58
#: Pods newly found unschedulable for one reason that get a log line each, per round.
_LOGGED_ONE_BY_ONE = 10


class Provisioner:
    def __init__(self, ctx: Context, *, rng: random.Random | None = None) -> None:
        """``rng`` draws the random part of claim names.

        Without one, it is seeded from the clock: a simulation (whose virtual clock always
        starts at the same instant) then names its claims identically on every run, while
        a restarted live controller does not replay its predecessor's names.
        """
        self.ctx = ctx
        self._trigger = asyncio.Event()
        self._names = rng if rng is not None else random.Random(round(ctx.clock.now() * 1e6))
        self._pending_keys: set[str] = set()
        #: Set when a node starts being disrupted: its pods need a node now, and the batch
        #: window (made for pods arriving one by one) would only delay their replacement.
        self._urgent = False
        #: Nodes already seen disrupted: only the moment a node becomes disrupted skips the
        #: batch window; its later updates (cordon, pods leaving) must not start a round each,
        #: or a thousand draining nodes keep the provisioner planning back to back.
        self._disrupted: set[str] = set()
        #: NodePool -> why its node class cannot launch, as last reported.
        self._class_problems: dict[str, str] = {}
        #: NodePool -> its class's kubelet block, as of the last round (sizes its claims).
        self._kubelets: dict[str, KubeletConfiguration | None] = {}
        #: Pod -> why it fits nowhere, as last said (logged and recorded as an Event). Only
        #: pods the last round could not place are kept, so it never outgrows the cluster.
        self._unschedulable_told: dict[str, str] = {}

    async def run(self) -> None:
        watcher = asyncio.create_task(self._watch())
        retry = asyncio.create_task(self._retry_loop())
        self._trigger.set()  # pods may already be pending when the controller starts
        try:
            while True:
                await self._trigger.wait()
                started = self.ctx.clock.now()
                await self._batch()
                batched, self._pending_keys = len(self._pending_keys), set()
                await self.reconcile(batched=batched, waited=self.ctx.clock.now() - started)
        finally:
            watcher.cancel()
            retry.cancel()

    async def _watch(self) -> None:
        cluster = self.ctx.cluster
        async for event in cluster.watch("pod", "node", "nodeclaim"):
            if self._is_trigger(event):
                if event.kind == "node":
                    self._urgent = True
                    self._disrupted.add(event.name)
                self._trigger.set()
            elif event.kind == "node":
                node = self.ctx.cluster.node(event.name)
                if node is None or not is_disrupting(None, node.taints):
                    self._disrupted.discard(event.name)  # gone, or back in service

    def _is_trigger(self, event: WatchEvent) -> bool:
        cluster = self.ctx.cluster
        if event.kind == "pod":
            if event.name in self._unschedulable_told:
                return True  # placed or gone: a round takes it off the gauge and memory
            pod = cluster.pod(event.name)
            return pod is not None and _provisionable(pod)
        if event.kind == "nodeclaim":
            return event.type != "ADDED"
        node = cluster.node(event.name)
        if node is None or not is_disrupting(None, node.taints):
            return False
        return event.name not in self._disrupted

    async def _retry_loop(self) -> None:
        """Pods that stay pending are looked at again every ``pending_retry_seconds``."""
        while True:
            await self.ctx.clock.sleep(self.ctx.settings.pending_retry_seconds)
            if any(_provisionable(p) for p in self.ctx.cluster.pods()) or self._held_back():
                self._trigger.set()

    def _held_back(self) -> bool:
        """Pods still on a disrupted node: a replace-then-drain holds them there until a
        ready node has room, which the scheduler may have given to others meanwhile."""
        cluster = self.ctx.cluster
        return any(
            not (p.daemon or p.mirror or p.terminating)
            for n in cluster.nodes()
            if is_disrupting(None, n.taints)
            for p in cluster.pods_on(n.name)
        )

    async def _batch(self) -> None:
        settings = self.ctx.settings
        deadline = self.ctx.clock.now() + settings.batch_max_seconds
        while True:
            self._trigger.clear()
            self._pending_keys.update(p.key for p in self.ctx.cluster.pods() if _provisionable(p))
            if self._urgent:
                self._urgent = False
                return
            remaining = deadline - self.ctx.clock.now()
            if remaining <= 0:
                return
            try:
                await asyncio.wait_for(
                    self._trigger.wait(), min(settings.batch_idle_seconds, remaining)
                )
            except TimeoutError:
                return

    async def reconcile(self, *, batched: int = 0, waited: float = 0.0) -> list[NodeClaim]:
        """One scheduling round; returns the claims it created.

        Rounds that change nothing (pods already covered by booting claims) stay silent, so
        the log shows decisions rather than the retry heartbeat.
        """
        ctx = self.ctx
        now = ctx.clock.now()
        pods, existing = self._snapshot()
        if not pods:
            ctx.metrics.pods_unschedulable.set(0)
            self._unschedulable_told.clear()
            return []
        classes = await self._node_classes()
        templates = self._templates(classes)
        offerings = ctx.unavailable.apply(ctx.cloud.offerings(), now)
        started = time.perf_counter()
        overhead = self._daemon_overhead(templates)
        self._kubelets = {name: state.kubelet for name, state in classes.items()}
        args = (pods, existing, templates, ctx.instance_types, offerings, overhead, self._kubelets)
        if ctx.settings.plan_in_thread:
            # A round over thousands of pods takes CPU seconds; in a thread the GIL still
            # hands the event loop a turn every few milliseconds, so taints and lease
            # renewals are not held up behind the packing (the inputs are a snapshot).
            plan = await asyncio.to_thread(plan_by_kubelet, *args)
        else:
            plan = plan_by_kubelet(*args)
        ctx.metrics.scheduling_duration.observe(time.perf_counter() - started)
        floors = {t.name: tuple(r for r in t.requirements if r.min_values) for t in templates}
        ctx.metrics.pods_unschedulable.set(len(plan.unschedulable))
        await self._tell_unschedulable(plan.unschedulable)
        if not plan.new_claims:
            return []
        log.info("batched pods", pods=max(batched, len(pods)), duration=f"{waited:.1f}s")
        log.info(
            "computed packing",
            nodeclaims=len(plan.new_claims),
            pods=sum(len(c.pods) for c in plan.new_claims),
        )
        created = []
        taken = {c.name for c in ctx.cluster.node_claims()}
        for claim_plan in plan.new_claims:
            name = self._claim_name(claim_plan.nodepool, taken)
            claim = self._to_claim(claim_plan, now, name, floors.get(claim_plan.nodepool, ()))
            claim.node_class = classes[claim.nodepool].name or ""
            claim.kubelet = classes[claim.nodepool].kubelet
            taken.add(claim.name)
            await ctx.cluster.create_node_claim(claim)
            ctx.metrics.nodeclaims_created.labels(claim.nodepool).inc()
            log.info(
                "created nodeclaim",
                nodeclaim=claim.name,
                nodepool=claim.nodepool,
                pods=len(claim_plan.pods),
                requests=claim.requests.describe(),
                instance_types=_summarise(claim.instance_types),
            )
            for pod in claim_plan.pods:
                await ctx.cluster.record_event(
                    "Pod", pod.key, "Nominated", f"Pod should schedule on nodeclaim/{claim.name}"
                )
            created.append(claim)
        return created

    async def _tell_unschedulable(self, unschedulable: dict[str, str]) -> None:
        """Log and record (FailedScheduling) why each pod fits nowhere, once per reason.

        Every retry round finds the same pods unplaceable for the same reason; saying so
        each time buried the log (45,000 lines in one benchmark run) and the API server in
        Events. A pod is told about again when its reason changes, or when it comes back
        after having been placed (its memory goes with it).
        """
        left_out = "; ".join(
            f"NodePool {name} left out: {problem}"
            for name, problem in sorted(self._class_problems.items())
        )
        told = self._unschedulable_told
        now_told: dict[str, str] = {}
        fresh: dict[str, list[str]] = {}
        for key, reason in sorted(unschedulable.items()):
            if left_out:
                reason = f"{reason} ({left_out})"
            now_told[key] = reason
            if told.get(key) == reason:
                continue
            fresh.setdefault(reason, []).append(key)
            await self.ctx.cluster.record_event(
                "Pod", key, "FailedScheduling", f"Failed to schedule pod, {reason}", warning=True
            )
        self._unschedulable_told = now_told
        for reason, keys in fresh.items():
            # A drained fleet's pods can all fail at once for one reason: past a few of
            # them, one line with the count says as much (each pod still has its Event).
            for key in keys[:_LOGGED_ONE_BY_ONE]:
                log.warning("could not schedule pod", pod=key, reason=reason)
            if len(keys) > _LOGGED_ONE_BY_ONE:
                log.warning(
                    "could not schedule more pods for the same reason",
                    pods=len(keys) - _LOGGED_ONE_BY_ONE,
                    reason=reason,
                )

    def _snapshot(self) -> tuple[list[Pod], list[ExistingCapacity]]:
        """Pods to place and the capacity they may use, read from the cluster cache.

        Pods of nodes being drained count as pending; those nodes offer no capacity. Claims
        still booting offer the capacity of their (smallest candidate) instance type.
        """
        ctx = self.ctx
        cluster = ctx.cluster
        claims_by_node = {c.node_name: c for c in cluster.node_claims() if c.node_name}
        pods = [p for p in cluster.pods() if _provisionable(p)]
        existing: list[ExistingCapacity] = []
        for node in cluster.nodes():
            claim = claims_by_node.get(node.name)
            on_node = [p for p in cluster.pods_on(node.name)]
            if is_disrupting(claim, node.taints):
                pods.extend(p for p in on_node if _reschedulable(p))
                continue
            if node.unschedulable:
                continue
            used = sum((pod_requests(p) for p in on_node), Resources())
            existing.append(
                ExistingCapacity(
                    name=node.name,
                    labels=node.labels,
                    taints=_settled_taints(node.taints, claim),
                    free=node.allocatable - used,
                    in_flight=not node.ready,
                    instance_type=node.labels.get(wk.INSTANCE_TYPE),
                )
            )
        for claim in cluster.node_claims():
            if claim.node_name or claim.deleting_since is not None:
                continue
            kubelet = claim.kubelet or self._kubelets.get(claim.nodepool)
            allocatable = claim_allocatable(claim, ctx.instance_types, kubelet)
            if allocatable is None:
                continue
            labels = dict(claim.labels)
            if claim.instance_type:
                labels.update(ctx.instance_types[claim.instance_type].labels)
                labels[wk.ZONE] = claim.zone
                labels[wk.CAPACITY_TYPE] = claim.capacity_type
            existing.append(
                ExistingCapacity(
                    name=f"nodeclaim/{claim.name}",
                    labels=labels,
                    taints=claim.taints,
                    free=allocatable,
                    in_flight=True,
                    instance_type=claim.instance_type or None,
                )
            )
        return pods, existing

    def _daemon_overhead(self, templates: Sequence[NodePoolTemplate]) -> dict[str, Resources]:
        """What the DaemonSets will take on a new node of each NodePool, before any pod.

        The cluster port has no DaemonSet objects, so each DaemonSet is known by its pods
        on existing nodes (the largest one, as sizes may differ per node). A DaemonSet
        counts for a pool if its pods would run on that pool's nodes (tolerating its
        taints, allowing its requirements and labels): a GPU driver DaemonSet that selects
        GPU nodes weighs on the GPU pool only, kube-proxy on every pool.
        """
        largest: dict[tuple[str, str], Resources] = {}
        sample: dict[tuple[str, str], Pod] = {}
        for pod in self.ctx.cluster.pods():
            if not pod.daemon or pod.terminating:
                continue
            key = (pod.namespace, pod.owner or pod.name)
            need = pod_requests(pod)
            have = largest.get(key)
            if have is None:
                sample[key] = pod
                largest[key] = need
            else:
                largest[key] = have.larger(need)
        overhead: dict[str, Resources] = {}
        for template in templates:
            total = Resources()
            for key, pod in sorted(sample.items()):
                if _runs_on(pod, template):
                    total = total + largest[key]
            overhead[template.name] = total
        return overhead

    def _smallest(self, names: Sequence[str]) -> Resources | None:
        types = [self.ctx.instance_types[n] for n in names if n in self.ctx.instance_types]
        if not types:
            return None
        return min((t.allocatable for t in types), key=lambda r: (r.cpu, r.memory))

    async def _node_classes(self) -> dict[str, NodeClassState]:
        """Each NodePool's node class as the cloud resolved it; a class that cannot launch
        is logged and recorded (as a warning Event on it) when its problem first shows."""
        states: dict[str, NodeClassState] = {}
        problems: dict[str, str] = {}
        for pool in self.ctx.nodepools:
            state = await node_class_state(self.ctx.cloud, pool.node_class)
            states[pool.name] = state
            if state.ready:
                continue
            problems[pool.name] = state.problem
            if self._class_problems.get(pool.name) != state.problem:
                log.error(
                    "leaving NodePool out, its node class cannot launch",
                    nodepool=pool.name,
                    nodeclass=state.name or "<default>",
                    reason=state.problem,
                )
                kind, name = ("EC2NodeClass", state.name) if state.name else ("NodePool", pool.name)
                await self.ctx.cluster.record_event(
                    kind, name, "NodeClassNotReady", state.problem, warning=True
                )
        for name in sorted(self._class_problems.keys() - problems.keys()):
            log.info("node class can launch again, NodePool back in", nodepool=name)
        self._class_problems = problems
        return states

    def _templates(self, classes: dict[str, NodeClassState]) -> list[NodePoolTemplate]:
        """NodePools with what their limits still allow, counting every live claim, and
        narrowed to the zones and architectures their node class can launch in."""
        ctx = self.ctx
        templates = []
        for pool in ctx.nodepools:
            state = classes.get(pool.name)
            if state is not None and not state.ready:
                continue
            claims = [
                c
                for c in ctx.cluster.node_claims()
                if c.nodepool == pool.name and c.deleting_since is None
            ]
            limits = pool.limits()
            remaining = None
            if limits is not None:
                used = sum(
                    (
                        c.allocatable or self._smallest(c.instance_types) or Resources()
                        for c in claims
                    ),
                    Resources(),
                )
                remaining = _capacity_left(limits, used)
            node_limit = pool.node_limit()
            templates.append(
                NodePoolTemplate(
                    name=pool.name,
                    weight=pool.weight,
                    requirements=(*pool.requirements(), *_class_requirements(state)),
                    labels=pool.labels(),
                    taints=pool.taints(),
                    startup_taints=pool.startup_taints(),
                    remaining=remaining,
                    nodes_remaining=None if node_limit is None else node_limit - len(claims),
                )
            )
        return templates

    def _claim_name(self, nodepool: str, taken: set[str]) -> str:
        """``<nodepool>-<5 random characters>``, Karpenter's shape, unused by any claim."""
        prefix = f"{nodepool}-"[:_NAME_PREFIX_MAX]
        while True:
            name = prefix + "".join(self._names.choices(_NAME_ALPHABET, k=5))
            if name not in taken:
                return name

    def _to_claim(
        self,
        plan: ClaimPlan,
        now: float,
        name: str,
        floors: tuple[NodeSelectorRequirement, ...] = (),
    ) -> NodeClaim:
        """The claim for ``plan``; the pool's ``minValues`` terms ride along so the launch
        keeps enough instance types to honour them."""
        labels = dict(plan.labels)
        labels[wk.NODEPOOL] = plan.nodepool
        return NodeClaim(
            name=name,
            nodepool=plan.nodepool,
            requirements=(*plan.requirements, *floors),
            instance_types=plan.instance_types,
            requests=plan.requests,
            labels=labels,
            taints=plan.taints,
            startup_taints=plan.startup_taints,
            created_at=now,
        )


def _settled_taints(taints: Sequence[Taint], claim: NodeClaim | None) -> tuple[Taint, ...]:
    """A node's taints as they will be once it is initialized: an agent removes the startup
    taints, so pods are not kept off (nor a second node opened for them) on their account."""
    if claim is None or claim.initialized_at is not None or not claim.startup_taints:
        return tuple(taints)
    startup = {(t.key, t.effect) for t in claim.startup_taints}
    return tuple(t for t in taints if (t.key, t.effect) not in startup)


def _class_requirements(state: NodeClassState | None) -> tuple[NodeSelectorRequirement, ...]:
    """The zones of a class's subnets and the architectures of its images, as requirements
    (so a claim never names an offering the class cannot launch)."""
    if state is None:
        return ()
    out = []
    if state.zones is not None:
        out.append(NodeSelectorRequirement(wk.ZONE, "In", tuple(sorted(state.zones))))
    if state.architectures is not None:
        out.append(NodeSelectorRequirement(wk.ARCH, "In", tuple(sorted(state.architectures))))
    return tuple(out)


def _provisionable(pod: Pod) -> bool:
    return (
        pod.node_name is None
        and pod.unschedulable
        and not pod.terminating
        and not pod.daemon
        and not pod.mirror
    )


def _runs_on(pod: Pod, template: NodePoolTemplate) -> bool:
    """Would a DaemonSet pod like ``pod`` be scheduled on a new node of ``template``?"""
    if tolerates(pod.tolerations, template.taints) is not None:
        return False
    pool = Requirements.from_terms(template.requirements).intersect(
        Requirements.from_labels(template.labels)
    )
    return any(pool.compatible(term) for term in pod_requirements(pod))


def _reschedulable(pod: Pod) -> bool:
    return not pod.terminating and not pod.daemon and not pod.mirror


def _capacity_left(limits: Resources, used: Resources) -> Resources:
    """Limits minus usage. A limit of 0 allows nothing; a dimension the NodePool does not
    limit arrives as ``UNLIMITED`` (see ``NodePool.limits``) and stays out of reach."""
    return limits - used


def _summarise(names: Sequence[str], shown: int = 5) -> str:
    head = ", ".join(names[:shown])
    return f"{head} and {len(names) - shown} other(s)" if len(names) > shown else head
