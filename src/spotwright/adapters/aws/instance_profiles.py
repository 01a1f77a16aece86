"""Instance profiles for EC2NodeClasses that name a ``role``.

A launch template names an instance profile, not a role. A class with ``instanceProfile``
names one the user made; a class with ``role`` gets one made by spotwright, as Karpenter
does: under the path ``/spotwright/`` (which the IAM policy scopes its grants to), tagged
as the cluster's, with the role added. Its name is derived from the cluster, the region
and the role, so every replica and every restart finds the same profile, and a changed
role gets a new one.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Final

from spotwright.adapters.aws._api import AwsCaller
from spotwright.adapters.aws.fleet import cluster_tag
from spotwright.observability.logs import get_logger
from spotwright.ports.cloud import CloudError

__all__ = ["PROFILE_PATH", "InstanceProfiles", "profile_name"]

log = get_logger("aws.instanceprofiles")

PROFILE_PATH: Final = "/spotwright/"


def profile_name(cluster_name: str, region: str, role: str) -> str:
    digest = hashlib.sha256(f"{region}/{role}".encode()).hexdigest()[:16]
    return f"{cluster_name[:100]}_{digest}"


def role_name(role: str) -> str:
    """The role's name, also when given as an ARN (``arn:aws:iam::1:role/path/Name``)."""
    return role.rsplit("/", 1)[-1] if role.startswith("arn:") else role


class InstanceProfiles:
    def __init__(self, iam: AwsCaller, *, cluster_name: str, region: str) -> None:
        self._iam = iam
        self._cluster = cluster_name
        self._region = region
        self._ready: dict[str, str] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def for_role(self, role: str) -> str:
        """The name of the instance profile holding ``role``, made if there is none.

        Raises CloudError (e.g. ``NoSuchEntity`` for a role that does not exist).
        """
        role = role_name(role)
        name = profile_name(self._cluster, self._region, role)
        if name in self._ready:
            return name
        async with self._locks.setdefault(name, asyncio.Lock()):
            if name in self._ready:
                return name
            roles = await self._roles(name)
            if roles is None:
                await self._create(name, role)
                roles = []
            if role not in roles:
                await self._iam.call(
                    "AddRoleToInstanceProfile", InstanceProfileName=name, RoleName=role
                )
            self._ready[name] = role
            return name

    async def _roles(self, name: str) -> list[str] | None:
        """The roles in profile ``name``, or None if there is no such profile."""
        try:
            found = await self._iam.call("GetInstanceProfile", InstanceProfileName=name)
        except CloudError as exc:
            if exc.code == "NoSuchEntity":
                return None
            raise
        return [str(r["RoleName"]) for r in found["InstanceProfile"].get("Roles") or ()]

    async def _create(self, name: str, role: str) -> None:
        try:
            await self._iam.call(
                "CreateInstanceProfile",
                InstanceProfileName=name,
                Path=PROFILE_PATH,
                Tags=[{"Key": cluster_tag(self._cluster), "Value": "owned"}],
            )
        except CloudError as exc:
            if exc.code != "EntityAlreadyExists":  # another replica made it first
                raise
        log.info("created instance profile", name=name, role=role)
