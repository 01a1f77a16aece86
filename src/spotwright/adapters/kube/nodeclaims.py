"""NodeClaims persisted as ``spotwright.io/v1alpha1`` custom resources.

The controllers hand the Cluster port whole ``NodeClaim`` records after changing a field
or two in them, often a record they read a while ago. Writing the whole record back would
undo whatever another controller wrote in between (the interruption handler's deadline,
say, under the lifecycle controller's registration). So every record handed out is
remembered together with the status it was read with, and an update sends, as a merge
patch of the status subresource, only the fields the caller actually changed.

Deleting a claim is the API's own deletion: the object keeps the ``spotwright.io/
termination`` finalizer until the termination controller has terminated the instance and
calls ``remove``, which drops the finalizer with a patch conditioned on the object's
resourceVersion (never a blind overwrite of others' finalizers). A claim that outlives the
process, a restart or a leader change is therefore picked up where it was left.
"""

from __future__ import annotations

import asyncio
import secrets
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lightkube.types import PatchType
from pydantic import ValidationError

from spotwright.adapters.kube.client import NODECLAIMS, Api, status_code
from spotwright.adapters.kube.convert import (
    format_time,
    parse_time,
    taint_to_api,
)
from spotwright.adapters.kube.informer import Informer
from spotwright.model.nodeclaim import FINALIZER, NodeClaimResource, ResourceQuantities
from spotwright.model.objects import NodeClaim, NodeSelectorRequirement
from spotwright.model.resources import GPU, Resources
from spotwright.observability.logs import get_logger
from spotwright.ports.cluster import ClusterError, NotFound

__all__ = [
    "NodeClaimStorage",
    "StoredClaim",
    "claim_from_api",
    "claim_to_api",
    "format_cpu",
    "format_memory",
    "quantities",
    "status_to_api",
]

log = get_logger("kube.nodeclaims")

_HISTORY = 4
_NAME_ALPHABET = string.ascii_lowercase + string.digits


@dataclass(slots=True)
class StoredClaim:
    """A cached claim with what the adapter needs besides the record itself."""

    claim: NodeClaim
    #: The status the record was converted from, in ``status_to_api`` form.
    status: dict[str, Any]
    finalizers: tuple[str, ...]
    #: The API object has a deletionTimestamp.
    deleting: bool
    uid: str = ""


# ---------------------------------------------------------------------------------------
# Quantities


def format_cpu(millicores: int) -> str:
    return str(millicores // 1000) if millicores % 1000 == 0 else f"{millicores}m"


def format_memory(size: int) -> str:
    for unit, scale in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if size and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


def quantities(resources: Resources) -> dict[str, str]:
    """A ResourceList with the dimensions that are set."""
    out = {"cpu": format_cpu(resources.cpu), "memory": format_memory(resources.memory)}
    if resources.pods:
        out["pods"] = str(resources.pods)
    if resources.gpu:
        out[GPU] = str(resources.gpu)
    if resources.ephemeral:
        out["ephemeral-storage"] = format_memory(resources.ephemeral)
    return out


def _resources(values: ResourceQuantities | None) -> Resources:
    if values is None:
        return Resources()
    return Resources(
        cpu=values.cpu or 0,
        memory=values.memory or 0,
        gpu=values.nvidia_gpu or 0,
        pods=values.pods or 0,
        ephemeral=values.ephemeral_storage or 0,
    )


# ---------------------------------------------------------------------------------------
# Record <-> object


def _requirement(req: NodeSelectorRequirement) -> dict[str, Any]:
    out: dict[str, Any] = {"key": req.key, "operator": req.operator, "values": list(req.values)}
    if req.min_values is not None:
        out["minValues"] = req.min_values
    return out


def claim_to_api(claim: NodeClaim) -> dict[str, Any]:
    """The object to create: metadata and the immutable spec (status is a subresource)."""
    obj: dict[str, Any] = {
        "metadata": {
            "name": claim.name,
            "labels": dict(claim.labels),
            "finalizers": [FINALIZER],
        },
        "spec": {
            "nodePool": claim.nodepool,
            "requirements": [_requirement(r) for r in claim.requirements],
            "instanceTypes": list(claim.instance_types),
            "resources": {"requests": quantities(claim.requests)},
            "taints": [taint_to_api(t) for t in claim.taints],
            "startupTaints": [taint_to_api(t) for t in claim.startup_taints],
        },
    }
    if claim.node_class:
        obj["spec"]["nodeClassRef"] = {
            "group": "spotwright.io",
            "kind": "EC2NodeClass",
            "name": claim.node_class,
        }
    return obj


def _condition(kind: str, when: float | None, reason: str) -> dict[str, str] | None:
    if when is None:
        return None
    return {
        "type": kind,
        "status": "True",
        "lastTransitionTime": format_time(when),
        "reason": reason,
        "message": "",
    }


def status_to_api(claim: NodeClaim) -> dict[str, Any]:
    """The status the record describes; empty fields are left out."""
    conditions = [
        _condition("Launched", claim.launched_at, "Launched"),
        _condition("Registered", claim.registered_at, "Registered"),
        _condition("Initialized", claim.initialized_at, "Initialized"),
        _condition("Ready", claim.initialized_at, "Initialized"),
    ]
    status: dict[str, Any] = {
        "providerID": claim.provider_id,
        "instanceType": claim.instance_type,
        "zone": claim.zone,
        "capacityType": claim.capacity_type,
        "price": claim.price or None,
        "allocatable": quantities(claim.allocatable) if claim.allocatable else None,
        "nodeName": claim.node_name,
        "drainDeadline": (
            format_time(claim.drain_deadline) if claim.drain_deadline is not None else None
        ),
        "deletionReason": claim.deletion_reason,
        "conditions": [c for c in conditions if c is not None],
    }
    return {k: v for k, v in status.items() if v not in (None, "", [])}


def _condition_time(resource: NodeClaimResource, kind: str) -> float | None:
    for condition in resource.status.conditions:
        if condition.type == kind and condition.status == "True":
            return parse_time(condition.last_transition_time)
    return None


def claim_from_api(obj: Mapping[str, Any]) -> StoredClaim | None:
    """The cached form of a NodeClaim object, or None (logged) if it cannot be read."""
    meta = obj.get("metadata") or {}
    try:
        resource = NodeClaimResource.model_validate(obj)
    except ValidationError as exc:
        log.warning(
            "ignoring a NodeClaim that does not validate",
            nodeclaim=meta.get("name"),
            error=str(exc).splitlines()[0],
        )
        return None
    spec, status = resource.spec, resource.status
    claim = NodeClaim(
        name=resource.metadata.name,
        nodepool=spec.node_pool,
        requirements=tuple(r.to_requirement() for r in spec.requirements),
        instance_types=tuple(spec.instance_types),
        requests=_resources(spec.resources.requests),
        labels=dict(resource.metadata.labels),
        taints=tuple(t.to_taint() for t in spec.taints),
        startup_taints=tuple(t.to_taint() for t in spec.startup_taints),
        created_at=parse_time(meta.get("creationTimestamp")) or 0.0,
        node_class=spec.node_class_ref.name if spec.node_class_ref is not None else "",
        provider_id=status.provider_id,
        instance_type=status.instance_type,
        zone=status.zone,
        capacity_type=status.capacity_type,
        price=status.price or 0.0,
        allocatable=_resources(status.allocatable) if status.allocatable else None,
        node_name=status.node_name,
        launched_at=_condition_time(resource, "Launched"),
        registered_at=_condition_time(resource, "Registered"),
        initialized_at=_condition_time(resource, "Initialized"),
        deleting_since=parse_time(meta.get("deletionTimestamp")),
        drain_deadline=parse_time(status.drain_deadline),
        deletion_reason=status.deletion_reason,
    )
    return StoredClaim(
        claim=claim,
        status=status_to_api(claim),
        finalizers=tuple(meta.get("finalizers") or ()),
        deleting=meta.get("deletionTimestamp") is not None,
        uid=str(meta.get("uid") or ""),
    )


def _diff(base: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """A merge patch from ``base`` to ``new`` (top-level keys; None removes one)."""
    patch: dict[str, Any] = {k: v for k, v in new.items() if base.get(k) != v}
    patch.update({k: None for k in base if k not in new})
    return patch


# ---------------------------------------------------------------------------------------
# The port's claim writes


class NodeClaimStorage:
    """Creates, updates and removes NodeClaim objects; reads go through the informer."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.informer: Informer[StoredClaim] = Informer(api, NODECLAIMS, self._convert)
        #: Records recently handed out per claim, with the status each was read with.
        self._history: dict[str, list[tuple[NodeClaim, dict[str, Any]]]] = {}

    def _convert(self, obj: Mapping[str, Any]) -> StoredClaim | None:
        stored = claim_from_api(obj)
        if stored is not None:
            seen = self._history.setdefault(stored.claim.name, [])
            seen.append((stored.claim, stored.status))
            del seen[:-_HISTORY]
        return stored

    def forget_history(self, name: str) -> None:
        self._history.pop(name, None)

    def _base(self, claim: NodeClaim, stored: StoredClaim) -> dict[str, Any]:
        """The status ``claim`` was read with: what the caller's changes are relative to."""
        seen: list[tuple[NodeClaim, dict[str, Any]]] = self._history.get(claim.name) or []
        for record, base in seen[::-1]:
            if record is claim:
                return base
        # A record we did not hand out: change only what it sets, never remove anything.
        return {k: v for k, v in stored.status.items() if k in status_to_api(claim)}

    async def create(self, claim: NodeClaim) -> None:
        """Create the object; a name already taken (a previous process's) gets a new suffix."""
        for _ in range(5):
            try:
                created = await self.api.create(NODECLAIMS, claim_to_api(claim))
            except Exception as exc:
                if status_code(exc) != 409:
                    raise ClusterError(f"creating nodeclaim {claim.name}: {exc}") from exc
                suffix = "".join(secrets.choice(_NAME_ALPHABET) for _ in range(5))
                log.debug("nodeclaim name taken, renaming", nodeclaim=claim.name, suffix=suffix)
                claim.name = f"{claim.nodepool}-{suffix}"
                continue
            self.informer.apply(created)
            return
        raise ClusterError(f"could not find a free name for a nodeclaim of {claim.nodepool}")

    async def update(self, claim: NodeClaim) -> None:
        """Patch the changed status fields; delete the object if the claim is now deleting.

        The two requests are independent, so they go out together: an interruption's
        drain starts one round trip sooner.
        """
        stored = self.informer.items.get(claim.name)
        if stored is None:
            raise NotFound(f"nodeclaim {claim.name} not found")
        patch = _diff(self._base(claim, stored), status_to_api(claim))
        deleting = claim.deleting_since is not None and not stored.deleting
        results = await asyncio.gather(
            self._patch_status(claim.name, patch),
            self._delete(claim.name) if deleting else _nothing(),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        if deleting:
            current = self.informer.items.get(claim.name)
            if current is not None and not current.deleting:
                # Deleted, but the watch has not said so yet: show it now, as memory does.
                current.claim.deleting_since = claim.deleting_since
                current.deleting = True
                self.informer.touch(claim.name)

    async def _patch_status(self, name: str, patch: dict[str, Any]) -> None:
        if not patch:
            return
        try:
            response = await self.api.patch(
                NODECLAIMS, name, {"status": patch}, subresource="status"
            )
        except Exception as exc:
            raise _error(exc, name) from exc
        self.informer.apply(response)

    async def _delete(self, name: str) -> None:
        try:
            await self.api.delete(NODECLAIMS, name)
        except Exception as exc:
            if status_code(exc) != 404:
                raise _error(exc, name) from exc

    async def remove(self, name: str) -> None:
        """Delete the claim if needed and drop our finalizer; the object then disappears."""
        stored = self.informer.items.get(name)
        if stored is None:
            return
        if not stored.deleting:
            await self._delete(name)
        finalizers = stored.finalizers
        for _ in range(5):
            if FINALIZER not in finalizers:
                break
            version = self.informer.version_of(name)
            patch = {
                "metadata": {
                    "resourceVersion": version,
                    "finalizers": [f for f in finalizers if f != FINALIZER],
                }
            }
            try:
                await self.api.patch(NODECLAIMS, name, patch, patch_type=PatchType.MERGE)
                break
            except Exception as exc:
                code = status_code(exc)
                if code == 404:
                    break
                if code != 409:
                    raise _error(exc, name) from exc
                fresh = await self.api.get(NODECLAIMS, name)
                self.informer.apply(fresh)
                finalizers = tuple((fresh.get("metadata") or {}).get("finalizers") or ())
        if all(f == FINALIZER for f in finalizers):
            self.informer.forget(name)
            self.forget_history(name)


async def _nothing() -> None:
    return None


def _error(exc: Exception, name: str) -> ClusterError:
    if status_code(exc) == 404:
        return NotFound(f"nodeclaim {name} not found")
    return ClusterError(f"nodeclaim {name}: {exc}")
