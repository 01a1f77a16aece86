"""Launch templates: one per NodePool, AMI and node settings, created once, reused.

The node settings are those of the NodePool's EC2NodeClass (``TemplateSettings``: its
instance profile, user data, block device mappings and instance metadata options), or the
controller's defaults for a NodePool without one. The user data is the node's own
(``bootstrap``: the claim's labels and taints, max pods of the instance type), so claims
and types share a template exactly when their nodes would boot the same way.

The name is derived from everything the template holds, so a new AMI or a changed security
group yields a new template while unchanged settings find the existing one, even after a
restart (it is looked up by name before being created). Templates carry the cluster tag,
which is also what the IAM policy requires before CreateFleet may use one.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from spotwright.adapters.aws._api import AwsCaller
from spotwright.adapters.aws.fleet import NODECLASS_TAG, NODEPOOL_TAG, cluster_tag
from spotwright.observability.logs import get_logger
from spotwright.ports.cloud import CloudError

__all__ = ["METADATA_OPTIONS", "LaunchTemplates", "TemplateSettings", "template_name"]

log = get_logger("aws.launchtemplates")

#: IMDSv2 only, reachable from the node but not from pods in their own network namespace.
METADATA_OPTIONS: Final = {
    "HttpEndpoint": "enabled",
    "HttpTokens": "required",
    "HttpPutResponseHopLimit": 1,
}


@dataclass(frozen=True)
class TemplateSettings:
    """What a launch template holds besides the AMI and the security groups."""

    instance_profile: str | None = None
    user_data: str | None = None
    metadata_options: Mapping[str, Any] = field(default_factory=lambda: dict(METADATA_OPTIONS))
    #: ``BlockDeviceMappings`` entries, as EC2 takes them.
    block_devices: tuple[Mapping[str, Any], ...] = ()
    #: The EC2NodeClass these come from (tagged on the template), if any.
    node_class: str | None = None


def template_name(cluster_name: str, settings: Mapping[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:20]
    return f"spotwright/{cluster_name}/{digest}"


class LaunchTemplates:
    def __init__(self, ec2: AwsCaller, *, cluster_name: str) -> None:
        self._ec2 = ec2
        self._cluster = cluster_name
        self._ids: dict[str, str] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        #: How many templates this process created (for tests and logs).
        self.created = 0

    @staticmethod
    def _data(
        image_id: str, security_groups: Sequence[str], settings: TemplateSettings
    ) -> dict[str, Any]:
        data: dict[str, Any] = {
            "ImageId": image_id,
            "SecurityGroupIds": list(security_groups),
            "MetadataOptions": dict(settings.metadata_options),
        }
        if settings.instance_profile:
            data["IamInstanceProfile"] = {"Name": settings.instance_profile}
        if settings.user_data:
            data["UserData"] = base64.b64encode(settings.user_data.encode()).decode()
        if settings.block_devices:
            data["BlockDeviceMappings"] = [dict(m) for m in settings.block_devices]
        return data

    async def ensure(
        self,
        nodepool: str,
        image_id: str,
        security_groups: Sequence[str],
        settings: TemplateSettings | None = None,
    ) -> str:
        """The id of the template for these settings, creating it if there is none."""
        settings = settings or TemplateSettings()
        data = self._data(image_id, sorted(security_groups), settings)
        identity: dict[str, Any] = {"nodepool": nodepool, "data": data}
        if settings.node_class:
            identity["nodeclass"] = settings.node_class
        name = template_name(self._cluster, identity)
        known = self._ids.get(name)
        if known:
            return known
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            known = self._ids.get(name)
            if known:
                return known
            template_id = await self._find(name)
            if template_id is None:
                template_id = await self._create(name, nodepool, data, settings.node_class)
            self._ids[name] = template_id
            return template_id

    def forget(self, template_id: str) -> None:
        """Drop a template from the cache (EC2 said it no longer exists)."""
        for name, known in list(self._ids.items()):
            if known == template_id:
                del self._ids[name]

    async def _find(self, name: str) -> str | None:
        found = await self._ec2.call(
            "DescribeLaunchTemplates",
            Filters=[{"Name": "launch-template-name", "Values": [name]}],
        )
        for template in found.get("LaunchTemplates") or ():
            if template.get("LaunchTemplateName") == name:
                return str(template["LaunchTemplateId"])
        return None

    async def _create(
        self, name: str, nodepool: str, data: Mapping[str, Any], node_class: str | None
    ) -> str:
        tags = [
            {"Key": cluster_tag(self._cluster), "Value": "owned"},
            {"Key": NODEPOOL_TAG, "Value": nodepool},
        ]
        if node_class:
            tags.append({"Key": NODECLASS_TAG, "Value": node_class})
        try:
            created = await self._ec2.call(
                "CreateLaunchTemplate",
                LaunchTemplateName=name,
                LaunchTemplateData=dict(data),
                TagSpecifications=[{"ResourceType": "launch-template", "Tags": tags}],
            )
        except CloudError as exc:
            if "AlreadyExists" not in exc.code:
                raise
            found = await self._find(name)  # another controller replica won the race
            if found is None:
                raise
            return found
        self.created += 1
        template_id = str(created["LaunchTemplate"]["LaunchTemplateId"])
        log.info("created launch template", name=name, id=template_id, nodepool=nodepool)
        return template_id
