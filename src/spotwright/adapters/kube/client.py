"""The few Kubernetes API calls spotwright makes, throttled, recorded and dict-shaped.

lightkube does the HTTP, the kubeconfig and the fast (msgspec) decoding. This wrapper adds
what a controller needs on top and what the rest of the adapter relies on:

* objects stay plain dicts: list and watch decode into ``dict`` rather than lightkube's
  typed models, because the cache keeps only converted records and the typed models would
  be built just to be thrown away;
* a client-side token bucket (``qps``/``burst``, as client-go's) in front of every request
  except the long-running watches, so a storm of interruptions cannot flood the API server;
  waiting requests are served by priority (Lease renewals, then taints and NodeClaim
  writes, then evictions and pod deletions), and Events have a bucket of their own;
* evictions and pod deletions may hold only some of the HTTP connections at once
  (``bulk_in_flight``): the pool hands its connections out first come first served, so a
  drain storm's queued evictions would otherwise take them all while a taint waits;
* calls that may be repeated (list, get, patch, delete) are retried on a 5xx, a 429 or a
  dropped connection, so one hiccup of the API server does not fail a drain; creates are
  never repeated, since a create that timed out may have happened;
* every call is recorded as the RBAC permission it needs (group, resource, verb), which is
  how the shipped ClusterRole is checked against what the code actually does.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import heapq
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import httpx2
from lightkube import ALL_NS, ApiError, AsyncClient, KubeConfig
from lightkube.core import resource as res
from lightkube.generic_resource import Generic
from lightkube.types import PatchType

__all__ = [
    "EVENTS",
    "LEASES",
    "NODECLAIMS",
    "NODECLASSES",
    "NODEPOOLS",
    "NODES",
    "PDBS",
    "PODS",
    "Api",
    "ApiKind",
    "Permission",
    "Priority",
    "TokenBucket",
    "connect",
    "status_code",
]

FIELD_MANAGER: Final = "spotwright"
_LIST_CHUNK: Final = 500
_ATTEMPTS: Final = 3
_RETRY_DELAY: Final = 0.2
#: Half of the HTTP pool (httpx's default of 100 connections, which lightkube keeps).
_BULK_IN_FLIGHT: Final = 50
T = TypeVar("T")
_ALL_VERBS: Final = [
    "delete",
    "get",
    "global_list",
    "global_watch",
    "list",
    "patch",
    "post",
    "put",
    "watch",
]


@dataclass(frozen=True, slots=True)
class ApiKind:
    """A resource of the API: where it lives and whether it is namespaced."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


NODES: Final = ApiKind("", "v1", "Node", "nodes", namespaced=False)
PODS: Final = ApiKind("", "v1", "Pod", "pods", namespaced=True)
PDBS: Final = ApiKind("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", True)
NODECLAIMS: Final = ApiKind("spotwright.io", "v1alpha1", "NodeClaim", "nodeclaims", False)
NODEPOOLS: Final = ApiKind("spotwright.io", "v1alpha1", "NodePool", "nodepools", False)
NODECLASSES: Final = ApiKind(
    "spotwright.io", "v1alpha1", "EC2NodeClass", "ec2nodeclasses", namespaced=False
)
LEASES: Final = ApiKind("coordination.k8s.io", "v1", "Lease", "leases", namespaced=True)
EVENTS: Final = ApiKind("events.k8s.io", "v1", "Event", "events", namespaced=True)


@dataclass(frozen=True, slots=True, order=True)
class Permission:
    """One RBAC rule line: ``resource`` may be ``plural/subresource``."""

    group: str
    resource: str
    verb: str


def status_code(exc: BaseException) -> int | None:
    """The HTTP status of a failed call (from the Status body when there is one)."""
    if isinstance(exc, ApiError):
        code = exc.status.code
        return int(code) if code is not None else exc.response.status_code
    if isinstance(exc, httpx2.HTTPStatusError):
        return exc.response.status_code
    return None


class Priority(enum.IntEnum):
    """Which waiting request gets the next token: lower first, then in arrival order."""

    #: Leader election: a renewal stuck behind a drain's evictions would cost the Lease.
    LEASE = 0
    #: Ordinary work: taints, cordons, NodeClaim writes, lists, reads.
    NORMAL = 1
    #: Many-at-once work that may wait: evictions and pod deletions.
    BULK = 2


class TokenBucket:
    """Client-side rate limit: ``burst`` requests at once, then ``qps`` per second.

    When requests have to wait, the most urgent go first and equals in arrival order: 200
    nodes interrupted at once mean thousands of evictions, and the taint of the 200th node
    (and every Lease renewal) must not queue behind them.
    """

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic):
        if qps <= 0 or burst < 1:
            raise ValueError("qps must be > 0 and burst >= 1")
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._stamp = clock()
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()
        self._pump: asyncio.Task[None] | None = None

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.qps)
        self._stamp = now

    async def acquire(self, priority: Priority = Priority.NORMAL) -> None:
        self._refill()
        if not self._waiting and self._tokens >= 1.0:
            self._tokens -= 1.0
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (int(priority), next(self._arrivals), turn))
        if self._pump is None or self._pump.done():
            self._pump = asyncio.create_task(self._hand_out())
        await turn

    async def _hand_out(self) -> None:
        while self._waiting:
            self._refill()
            if self._tokens < 1.0:
                await asyncio.sleep((1.0 - self._tokens) / self.qps)
                continue
            _, _, turn = heapq.heappop(self._waiting)
            if not turn.done():  # a waiter that was cancelled gives its turn up
                self._tokens -= 1.0
                turn.set_result(None)


def _resource_class(kind: ApiKind, subresource: str | None = None) -> type[Any]:
    """A lightkube resource class whose instances are plain dicts."""
    base: type[Any] = res.NamespacedResourceG if kind.namespaced else res.GlobalResource
    definition = res.ResourceDef(kind.group, kind.version, kind.kind)
    if subresource is None:
        info = res.ApiInfo(resource=definition, plural=kind.plural, verbs=list(_ALL_VERBS))
    else:
        sub_base: type[Any] = (
            res.NamespacedSubResource if kind.namespaced else res.GlobalSubResource
        )
        base = sub_base
        info = res.ApiInfo(
            resource=definition,
            parent=definition,
            plural=kind.plural,
            verbs=["get", "patch", "post"],
            action=subresource,
        )
    return type(
        f"Raw{kind.kind}{(subresource or '').title()}", (base, Generic), {"_api_info": info}
    )


_EVICTION_CLASS: Final = type(
    "RawEviction",
    (res.NamespacedSubResource, Generic),
    {
        "_api_info": res.ApiInfo(
            resource=res.ResourceDef("policy", "v1", "Eviction"),
            parent=res.ResourceDef("", "v1", "Pod"),
            plural="pods",
            verbs=["post"],
            action="eviction",
        )
    },
)


def connect(kubeconfig: str | Path | None = None, *, timeout: float = 10.0) -> AsyncClient:
    """A lightkube client from a kubeconfig file, else the in-cluster service account."""
    config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
    return AsyncClient(config=config, field_manager=FIELD_MANAGER, timeout=httpx2.Timeout(timeout))


class Api:
    """The calls the adapter makes, each throttled (watches aside) and recorded."""

    def __init__(
        self,
        client: AsyncClient,
        *,
        qps: float = 200.0,
        burst: int = 300,
        event_qps: float = 20.0,
        event_burst: int = 50,
        bulk_in_flight: int = _BULK_IN_FLIGHT,
    ) -> None:
        if bulk_in_flight < 1:
            raise ValueError("bulk_in_flight must be >= 1")
        self.client = client
        self.bucket = TokenBucket(qps, burst)
        #: The low-priority lane: evictions and pod deletions in flight at once. Taints,
        #: cordons, claim writes and Lease renewals never wait for it, so with the pool's
        #: 100 connections at least half are always theirs.
        self.bulk_lane = asyncio.Semaphore(bulk_in_flight)
        #: Events have a budget of their own: recording them never delays an action.
        self.events_bucket = TokenBucket(event_qps, event_burst)
        #: Every permission a call so far has needed, for the RBAC check.
        self.used: set[Permission] = set()
        self._classes: dict[tuple[ApiKind, str | None], type[Any]] = {}

    def _cls(self, kind: ApiKind, subresource: str | None = None) -> type[Any]:
        key = (kind, subresource)
        if key not in self._classes:
            self._classes[key] = _resource_class(kind, subresource)
        return self._classes[key]

    def _record(self, kind: ApiKind, verb: str, subresource: str | None = None) -> None:
        resource = f"{kind.plural}/{subresource}" if subresource else kind.plural
        self.used.add(Permission(kind.group, resource, verb))

    async def list(
        self, kind: ApiKind, *, fields: Mapping[str, str] | None = None
    ) -> tuple[list[dict[str, Any]], str]:
        """Every object of the kind (all namespaces), and the list's resourceVersion."""
        items: list[dict[str, Any]] = []
        version = await self.list_each(kind, items.append, fields=fields)
        return items, version

    async def list_each(
        self,
        kind: ApiKind,
        each: Callable[[dict[str, Any]], object],
        *,
        fields: Mapping[str, str] | None = None,
    ) -> str:
        """Hand every object of the kind to ``each`` as its page arrives; the list's version.

        Only one page (``_LIST_CHUNK`` objects) is decoded at a time, so listing ten
        thousand pods does not hold ten thousand API objects at once. ``fields`` is a field
        selector (``{"spec.nodeName": "ip-10-0-0-1"}``). A list retried after a transient
        failure starts over, so ``each`` may see an object twice: it must be idempotent.
        """
        self._record(kind, "list")
        namespace = ALL_NS if kind.namespaced else None
        selector: dict[str, Any] | None = dict(fields) if fields else None

        async def call() -> str:
            listing = self.client.list(
                self._cls(kind), namespace=namespace, chunk_size=_LIST_CHUNK, fields=selector
            )
            async for item in listing:
                each(dict(item))
            return str(listing.resourceVersion)

        return await self._again_if_transient(call, kind, "list")

    def watch(
        self,
        kind: ApiKind,
        resource_version: str,
        *,
        server_timeout: int = 300,
        fields: Mapping[str, str] | None = None,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Changes after ``resource_version``; raises on any error, 410 Gone included."""
        self._record(kind, "watch")
        namespace = ALL_NS if kind.namespaced else None
        stream = self.client.watch(
            self._cls(kind),
            namespace=namespace,
            resource_version=resource_version,
            server_timeout=server_timeout,
            fields=dict(fields) if fields else None,
        )
        return _dicts(stream)

    async def get(self, kind: ApiKind, name: str, namespace: str | None = None) -> dict[str, Any]:
        self._record(kind, "get")

        async def call() -> dict[str, Any]:
            return dict(await self.client.get(self._cls(kind), name, namespace=namespace))

        return await self._again_if_transient(call, kind, "get")

    async def create(
        self, kind: ApiKind, obj: Mapping[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        self._record(kind, "create")
        await self._bucket(kind).acquire(_priority(kind, "create"))
        body = self._cls(kind)({"apiVersion": kind.api_version, "kind": kind.kind, **obj})
        created: Any = await self.client.create(body, namespace=namespace)  # type: ignore[call-overload]
        return dict(created)

    async def patch(
        self,
        kind: ApiKind,
        name: str,
        patch: Mapping[str, Any],
        *,
        namespace: str | None = None,
        patch_type: PatchType = PatchType.MERGE,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """A merge or strategic-merge patch (or apply); never a read-modify-write."""
        self._record(kind, "patch", subresource)

        async def call() -> dict[str, Any]:
            patched = await self.client.patch(
                self._cls(kind, subresource),
                name,
                dict(patch),
                namespace=namespace,
                patch_type=patch_type,
                force=patch_type is PatchType.APPLY,
            )
            return dict(patched)

        return await self._again_if_transient(call, kind, "patch")

    async def delete(
        self,
        kind: ApiKind,
        name: str,
        *,
        namespace: str | None = None,
        grace_seconds: int | None = None,
    ) -> None:
        self._record(kind, "delete")

        async def call() -> None:
            await self.client.delete(
                self._cls(kind), name, namespace=namespace, grace_period=grace_seconds
            )

        await self._again_if_transient(call, kind, "delete")

    async def evict(self, namespace: str, name: str, uid: str = "") -> None:
        """POST an Eviction (policy/v1); the caller maps 429 to a blocked eviction.

        Unlike other creates this one may be repeated after a timeout or a 5xx: evicting a
        pod that is already going is harmless (and a gone one is a 404), while a drain that
        gave up on an overloaded API server would leave the node to die with its pods.
        """
        self.used.add(Permission("", "pods/eviction", "create"))
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        if uid:
            body["deleteOptions"] = {"preconditions": {"uid": uid}}

        async def call() -> None:
            eviction: Any = _EVICTION_CLASS(body)
            await self.client.create(eviction, name, namespace=namespace)

        await self._again_if_transient(call, PODS, "evict", retry_429=False)

    async def close(self) -> None:
        await self.client.close()

    def _bucket(self, kind: ApiKind) -> TokenBucket:
        return self.events_bucket if kind == EVENTS else self.bucket

    async def _again_if_transient(
        self,
        call: Callable[[], Awaitable[T]],
        kind: ApiKind,
        verb: str,
        *,
        retry_429: bool = True,
    ) -> T:
        """Throttle, and retry a call that may safely be repeated after a transient failure.

        Creates are never repeated: a create that timed out may have happened, and a second
        one would make a second object.
        """
        delay = _RETRY_DELAY
        bucket, priority = self._bucket(kind), _priority(kind, verb)
        for attempt in range(1, _ATTEMPTS + 1):
            # A bulk request takes its lane slot before its token, so requests waiting for
            # the lane do not spend the rate that urgent ones need.
            lane = self.bulk_lane if priority is Priority.BULK else contextlib.nullcontext()
            async with lane:
                await bucket.acquire(priority)
                try:
                    return await call()
                except Exception as exc:
                    code = status_code(exc)
                    transient = (
                        code >= 500 or (code == 429 and retry_429)
                        if code is not None
                        else isinstance(exc, httpx2.TransportError)
                    )
                    if attempt == _ATTEMPTS or not transient:
                        raise
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")


def _priority(kind: ApiKind, verb: str) -> Priority:
    if kind == LEASES:
        return Priority.LEASE
    if kind == PODS and verb in ("delete", "evict"):
        return Priority.BULK
    return Priority.NORMAL


async def _dicts(
    stream: Any,
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    try:
        async for event_type, obj in stream:
            yield str(event_type), dict(obj)
    finally:
        await stream.aclose()
