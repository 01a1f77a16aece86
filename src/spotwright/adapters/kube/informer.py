"""List-then-watch caches of API objects, kept as converted records.

The controllers read the cluster synchronously and often (every provisioning round looks
at every pod), so reads must come from memory. An informer lists a kind once, then watches
from the list's resourceVersion and applies each change. When the API server has
compacted past that version it answers 410 Gone; the informer then lists again and turns
the difference between its store and the new list into the ADDED/MODIFIED/DELETED changes
it missed, so subscribers never see a gap. Any other failure re-watches from the last
version seen, with backoff, and after three failures in a row lists afresh too (a watch
can fail for good from one version, e.g. when etcd compacted away the previous state an
event needs).

Only the converted record is stored (plus the object's resourceVersion), never the API
object, so memory follows the number of objects rather than the size of their specs:
``managedFields``, status details and last-applied copies are gone once an object is
converted, and a list is converted page by page as it arrives rather than held whole. An
informer may also be given a field selector (``spec.nodeName=...``), so a per-node handler
caches its node's objects, not the cluster's.

Writes made through the adapter feed their responses in with ``apply``, so a controller
reads its own writes at once; the watch event for the same version that arrives later is
then recognised and not announced twice. Versions are compared as integers when both look
like integers (etcd's revisions do), which also drops events older than what is cached.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Generic, Literal, TypeVar

from spotwright.adapters.kube.client import Api, ApiKind, status_code
from spotwright.observability.logs import get_logger

__all__ = ["ChangeType", "Informer", "newer"]

T = TypeVar("T")
ChangeType = Literal["ADDED", "MODIFIED", "DELETED"]
#: ``(type, key, old, new)``: called synchronously for every change to the store.
Listener = Callable[[ChangeType, str, Any, Any], None]

log = get_logger("kube.informer")

_BACKOFF_MIN = 0.5
_BACKOFF_MAX = 30.0
_RELIST_AFTER_FAILURES = 3


def newer(candidate: str, current: str | None) -> bool:
    """Whether version ``candidate`` is later than ``current`` (unknown order: assume so)."""
    if current is None:
        return True
    if candidate.isdigit() and current.isdigit():
        return int(candidate) > int(current)
    return candidate != current


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` for namespaced objects, ``name`` for cluster-scoped ones."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))


class Informer(Generic[T]):
    """One kind's cache: ``items`` maps keys to converted records."""

    def __init__(
        self,
        api: Api,
        kind: ApiKind,
        convert: Callable[[Mapping[str, Any]], T | None],
        *,
        listener: Listener | None = None,
        server_timeout: int = 300,
        fields: Mapping[str, str] | None = None,
    ) -> None:
        self.api = api
        self.kind = kind
        self.convert = convert
        #: A field selector: only the objects it matches are listed, watched and cached.
        self.fields = dict(fields) if fields else None
        self.listener = listener
        self.server_timeout = server_timeout
        self.items: dict[str, T] = {}
        self.resource_version: str | None = None
        #: How many times the informer listed again after a 410 Gone.
        self.relists = 0
        self.synced = asyncio.Event()
        self._versions: dict[str, str] = {}
        #: Keys deleted by our own writes, with the last version seen: older events are stale.
        self._tombstones: dict[str, str] = {}

    # -- the loop -------------------------------------------------------------------------
    async def run(self, *, resume_from: str | None = None) -> None:
        """List (unless resuming), then watch forever; cancel to stop."""
        version = resume_from
        backoff = _BACKOFF_MIN
        failures = 0
        while True:
            try:
                if version is None:
                    version = await self.relist()
                async for event_type, obj in self.api.watch(
                    self.kind, version, server_timeout=self.server_timeout, fields=self.fields
                ):
                    version = self._on_watch_event(event_type, obj) or version
                    backoff, failures = _BACKOFF_MIN, 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # every failure is retried: the cache must live on
                if status_code(exc) == 410:
                    self.relists += 1
                    log.info("watch expired, listing again", kind=self.kind.plural, version=version)
                    version = None
                    continue
                failures += 1
                log.warning(
                    "list or watch failed, retrying",
                    kind=self.kind.plural,
                    error=f"{type(exc).__name__}: {exc}",
                    retry_in=f"{backoff:.1f}s",
                )
                await asyncio.sleep(backoff)
                backoff = min(_BACKOFF_MAX, backoff * 2)
                if failures >= _RELIST_AFTER_FAILURES and version is not None:
                    # A watch that keeps failing from the same version may never recover
                    # from it (the server cannot rebuild an event etcd compacted away):
                    # start over from a fresh list.
                    self.relists += 1
                    version, failures = None, 0

    async def relist(self) -> str:
        """List everything and reconcile the store with it; returns the list's version."""
        seen: set[str] = set()

        def take(obj: dict[str, Any]) -> None:
            key = object_key(obj)
            seen.add(key)
            self._store(key, obj, force=True)

        version = await self.api.list_each(self.kind, take, fields=self.fields)
        for key in [k for k in self.items if k not in seen]:
            self._drop(key)
        for key in [k for k in self._versions if k not in seen]:
            self._versions.pop(key, None)
        self._tombstones.clear()
        self.resource_version = version
        self.synced.set()
        return version

    # -- applying changes ------------------------------------------------------------------
    def _on_watch_event(self, event_type: str, obj: Mapping[str, Any]) -> str | None:
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "") or None
        key = object_key(obj)
        if event_type == "DELETED":
            self._tombstones.pop(key, None)
            self._versions.pop(key, None)
            self._drop(key)
        elif event_type in ("ADDED", "MODIFIED"):
            self._store(key, obj)
        if version is not None:
            self.resource_version = version
        return version

    def apply(self, obj: Mapping[str, Any]) -> T | None:
        """Take a write's response into the cache now (read-your-writes)."""
        key = object_key(obj)
        self._store(key, obj)
        return self.items.get(key)

    def version_of(self, key: str) -> str | None:
        """The resourceVersion the cached record was converted from."""
        return self._versions.get(key)

    def touch(self, key: str) -> None:
        """Announce a change made to a cached record in place (ahead of its watch event)."""
        record = self.items.get(key)
        if record is not None:
            self._announce("MODIFIED", key, record, record)

    def forget(self, key: str) -> None:
        """Our own write deleted the object: drop it now, and ignore stale events for it."""
        self._tombstones[key] = self._versions.pop(key, "0")
        self._drop(key)

    def _store(self, key: str, obj: Mapping[str, Any], *, force: bool = False) -> None:
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        known = self._versions.get(key)
        if known is not None and version == known:
            return  # unchanged: our own write came back, or a relist found it as it was
        if not force and known is not None and not newer(version, known):
            return  # an event older than what is cached
        tomb = self._tombstones.get(key)
        if tomb is not None:
            if not newer(version, tomb):
                return
            del self._tombstones[key]
        record = self.convert(obj)
        if record is None:  # e.g. a pod that finished: as good as deleted
            self._versions.pop(key, None)
            self._drop(key)
            return
        if version:
            self._versions[key] = version
        old = self.items.get(key)
        self.items[key] = record
        self._announce("MODIFIED" if old is not None else "ADDED", key, old, record)

    def _drop(self, key: str) -> None:
        old = self.items.pop(key, None)
        if old is not None:
            self._announce("DELETED", key, old, None)

    def _announce(self, change: ChangeType, key: str, old: T | None, new: T | None) -> None:
        if self.listener is not None:
            self.listener(change, key, old, new)
