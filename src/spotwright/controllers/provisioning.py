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
from spotwright.model import labels as wk
from spotwright.model.objects import NodeClaim, NodeSelectorRequirement, Pod
from spotwright.model.resources import Resources
from spotwright.observability.logs import get_logger
from spotwright.ports.cluster import WatchEvent
from spotwright.scheduling import (
    ClaimPlan,
    ExistingCapacity,
    NodePoolTemplate,
    Requirements,
    pod_requests,
    pod_requirements,
    schedule,
    tolerates,
)
from spotwright.scheduling.min_values import enforce_min_values

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
                self._trigger.set()

    def _is_trigger(self, event: WatchEvent) -> bool:
        cluster = self.ctx.cluster
        if event.kind == "pod":
            pod = cluster.pod(event.name)
            return pod is not None and _provisionable(pod)
        if event.kind == "nodeclaim":
            return event.type != "ADDED"
        node = cluster.node(event.name)
        return node is not None and is_disrupting(None, node.taints)

    async def _retry_loop(self) -> None:
        """Pods that stay pending are looked at again every ``pending_retry_seconds``."""
        while True:
            await self.ctx.clock.sleep(self.ctx.settings.pending_retry_seconds)
            if any(_provisionable(p) for p in self.ctx.cluster.pods()):
                self._trigger.set()

    async def _batch(self) -> None:
        settings = self.ctx.settings
        deadline = self.ctx.clock.now() + settings.batch_max_seconds
        while True:
            self._trigger.clear()
            self._pending_keys.update(p.key for p in self.ctx.cluster.pods() if _provisionable(p))
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
            return []
        templates = self._templates()
        offerings = ctx.unavailable.apply(ctx.cloud.offerings(), now)
        started = time.perf_counter()
        types = list(ctx.instance_types.values())
        overhead = self._daemon_overhead(templates)
        plan = schedule(pods, existing, templates, types, offerings, daemon_overhead=overhead)
        plan = enforce_min_values(plan, templates, types, offerings, daemon_overhead=overhead)
        ctx.metrics.scheduling_duration.observe(time.perf_counter() - started)
        floors = {t.name: tuple(r for r in t.requirements if r.min_values) for t in templates}
        ctx.metrics.pods_unschedulable.set(len(plan.unschedulable))
        by_key = {p.key: p for p in pods}
        for key, reason in sorted(plan.unschedulable.items()):
            log.warning("could not schedule pod", pod=key, reason=reason)
            pod = by_key[key]
            await ctx.cluster.record_event(
                "Pod",
                pod.key,
                "FailedScheduling",
                f"Failed to schedule pod, {reason}",
                warning=True,
            )
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
                    taints=tuple(node.taints),
                    free=node.allocatable - used,
                    in_flight=not node.ready,
                    instance_type=node.labels.get(wk.INSTANCE_TYPE),
                )
            )
        for claim in cluster.node_claims():
            if claim.node_name or claim.deleting_since is not None:
                continue
            allocatable = claim.allocatable or self._smallest(claim.instance_types)
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

    def _daemon_overhead(self, templates: Sequence[NodePoolTemplate]) -> Resources:
        """What the DaemonSets will take on every new node, before any pod lands there.

        The cluster port has no DaemonSet objects, so each DaemonSet is known by its pods
        on existing nodes (the largest one, as sizes may differ per node). Only those
        that would run on every NodePool's nodes (tolerating its taints, allowing its
        requirements) count: the scheduler takes one figure for all pools, and a lower
        bound never refuses a node that would have fitted. DaemonSets that run
        everywhere (kube-proxy, the CNI, log and metrics agents) are the usual case.
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
                largest[key] = Resources(
                    max(have.cpu, need.cpu),
                    max(have.memory, need.memory),
                    max(have.gpu, need.gpu),
                    max(have.pods, need.pods),
                    max(have.ephemeral, need.ephemeral),
                )
        total = Resources()
        for key, pod in sorted(sample.items()):
            if templates and all(_runs_on(pod, t) for t in templates):
                total = total + largest[key]
        return total

    def _smallest(self, names: Sequence[str]) -> Resources | None:
        types = [self.ctx.instance_types[n] for n in names if n in self.ctx.instance_types]
        if not types:
            return None
        return min((t.allocatable for t in types), key=lambda r: (r.cpu, r.memory))

    def _templates(self) -> list[NodePoolTemplate]:
        """NodePools with what their limits still allow, counting every live claim."""
        ctx = self.ctx
        templates = []
        for pool in ctx.nodepools:
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
                    requirements=pool.requirements(),
                    labels=pool.labels(),
                    taints=pool.taints(),
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
            created_at=now,
        )


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
    pool = Requirements.from_terms(template.requirements)
    return any(pool.compatible(term) for term in pod_requirements(pod))


def _reschedulable(pod: Pod) -> bool:
    return not pod.terminating and not pod.daemon and not pod.mirror


def _capacity_left(limits: Resources, used: Resources) -> Resources:
    """Limits minus usage. A limit of 0 allows nothing; a dimension the NodePool does not
    limit arrives as ``UNLIMITED`` (see ``NodePool.limits``) and stays out of reach."""
    big = 2**62
    return Resources(
        cpu=limits.cpu - used.cpu,
        memory=limits.memory - used.memory,
        gpu=limits.gpu - used.gpu,
        pods=big,
        ephemeral=big,
    )


def _summarise(names: Sequence[str], shown: int = 5) -> str:
    head = ", ".join(names[:shown])
    return f"{head} and {len(names) - shown} other(s)" if len(names) > shown else head
