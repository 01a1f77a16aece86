"""EC2NodeClasses resolved into what a launch uses: subnets, security groups, AMIs, role.

A NodePool's ``nodeClassRef`` names a class; ``NodeClasses.launch_spec(name)`` looks the
class up (``lookup``: the controller's informer), resolves its selector terms through the
EC2, SSM and IAM APIs and caches the result for the network refresh interval, keyed by the
class's spec so an edit is resolved afresh at once. A NodePool without a class (name None)
gets the controller's defaults: the subnets and security groups tagged
``karpenter.sh/discovery: <cluster>`` (or the settings' selectors), ``--ami-id`` or the
EKS-optimized AMI, ``--instance-profile`` and ``--user-data``.

Resolving never raises: a class that is missing, or whose selectors match nothing, or whose
role cannot be given an instance profile, resolves to a ``LaunchSpec`` whose ``problem``
says so in the user's terms; the provisioner leaves its NodePools out and their pods stay
pending with that reason.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spotwright.adapters.aws._api import AwsCaller
from spotwright.adapters.aws.amis import alias_parameter, find_images, newest_by_arch
from spotwright.adapters.aws.bootstrap import user_data_problem
from spotwright.adapters.aws.discovery import (
    Discovery,
    SelectorTerm,
    Subnet,
    _Cached,
    find_security_groups,
    find_subnets,
)
from spotwright.adapters.aws.instance_profiles import InstanceProfiles
from spotwright.adapters.aws.launch_templates import TemplateSettings
from spotwright.catalog._types import InstanceType
from spotwright.model.nodeclass import (
    BlockDeviceMapping,
    EC2NodeClass,
    EC2NodeClassSpec,
    KubeletConfiguration,
)
from spotwright.observability.logs import get_logger
from spotwright.ports.clock import Clock
from spotwright.ports.cloud import CloudError, NodeClassState

__all__ = ["LaunchSpec", "NodeClassLookup", "NodeClasses", "block_device_mappings"]

log = get_logger("aws.nodeclasses")

#: The controller's view of the cluster's EC2NodeClasses, by name: the class, why it is
#: invalid (a text), or None if there is no such class.
NodeClassLookup = Callable[[str], EC2NodeClass | str | None]
_GIB = 1 << 30


@dataclass(frozen=True)
class LaunchSpec:
    """Everything a launch for one node class (None: the defaults) uses, resolved."""

    name: str | None
    subnets: Mapping[str, Subnet] = field(default_factory=dict)
    security_groups: tuple[str, ...] = ()
    #: Kubernetes architecture -> AMI, for classes selecting images; None: per variant
    #: from SSM (an alias, or the defaults).
    images: Mapping[str, str] | None = None
    alias: str | None = None
    #: Architectures an alias resolved for (None with ``images`` or for the defaults).
    alias_architectures: frozenset[str] | None = None
    template: TemplateSettings = field(default_factory=TemplateSettings)
    tags: Mapping[str, str] = field(default_factory=dict)
    #: How nodes bootstrap (the user data made per launch template, see ``bootstrap``).
    family: str = "Custom"
    kubelet: KubeletConfiguration | None = None
    problem: str = ""
    #: The error code a launch for a broken class fails with.
    code: str = ""

    def state(self) -> NodeClassState:
        if self.problem:
            return NodeClassState(self.name, problem=self.problem)
        architectures = (
            frozenset(self.images) if self.images is not None else self.alias_architectures
        )
        return NodeClassState(
            self.name, frozenset(self.subnets), architectures, kubelet=self.kubelet
        )


def block_device_mappings(mappings: Sequence[BlockDeviceMapping]) -> tuple[dict[str, Any], ...]:
    """A class's ``blockDeviceMappings`` as EC2 takes them (sizes in whole GiB, rounded up).

    A mapping without a device name is the root volume's: ``/dev/xvda`` on the EKS AMIs.
    """
    out: list[dict[str, Any]] = []
    for mapping in mappings:
        entry: dict[str, Any] = {"DeviceName": mapping.device_name or "/dev/xvda"}
        ebs = mapping.ebs
        if ebs is not None:
            volume: dict[str, Any] = {}
            for key, value in (
                ("VolumeSize", math.ceil(ebs.volume_size / _GIB) if ebs.volume_size else None),
                ("VolumeType", ebs.volume_type),
                ("Iops", ebs.iops),
                ("Throughput", ebs.throughput),
                ("Encrypted", ebs.encrypted),
                ("KmsKeyId", ebs.kms_key_id),
                ("DeleteOnTermination", ebs.delete_on_termination),
                ("SnapshotId", ebs.snapshot_id),
            ):
                if value is not None:
                    volume[key] = value
            entry["Ebs"] = volume
        out.append(entry)
    return tuple(out)


def _metadata_options(spec: EC2NodeClassSpec) -> dict[str, Any]:
    options = spec.metadata_options
    return {
        "HttpEndpoint": options.http_endpoint,
        "HttpProtocolIpv6": options.http_protocol_ipv6,
        "HttpPutResponseHopLimit": options.http_put_response_hop_limit,
        "HttpTokens": options.http_tokens,
    }


def _shown(terms: Sequence[Any]) -> str:
    """Terms as the user wrote them, compactly, for a problem message."""
    dumped = [t.model_dump(by_alias=True, exclude_defaults=True) for t in terms]
    return json.dumps(dumped, sort_keys=True, separators=(", ", ": "))


class NodeClasses:
    def __init__(
        self,
        *,
        ec2: AwsCaller,
        discovery: Discovery,
        profiles: InstanceProfiles,
        clock: Clock,
        lookup: NodeClassLookup | None,
        defaults: TemplateSettings,
        ttl: float,
        defaults_family: str = "Custom",
    ) -> None:
        self._ec2 = ec2
        self._discovery = discovery
        self._profiles = profiles
        self._clock = clock
        self.lookup = lookup
        self._defaults = defaults
        self._defaults_family = defaults_family
        self._ttl = ttl
        self._cache: dict[str, tuple[str, _Cached[LaunchSpec]]] = {}

    async def launch_spec(self, name: str | None) -> LaunchSpec:
        """The resolved class (cached); its ``problem`` says why it cannot launch."""
        if name is None:
            return await self._defaults_spec()
        found = self.lookup(name) if self.lookup is not None else None
        if found is None:
            return LaunchSpec(name, problem=f"EC2NodeClass {name} not found", code="NotFound")
        if isinstance(found, str):
            return LaunchSpec(name, problem=f"EC2NodeClass {name} is {found}", code="Invalid")
        digest = hashlib.sha256(found.spec.model_dump_json().encode()).hexdigest()
        entry = self._cache.get(name)
        if entry is None or entry[0] != digest:
            entry = (digest, _Cached(f"EC2NodeClass {name}", self._ttl, self._clock))
            self._cache[name] = entry
        spec = await entry[1].get(lambda: self._resolve(name, found.spec))
        if spec.subnets:
            self._discovery.add_zones(spec.subnets)
        return spec

    async def image(self, spec: LaunchSpec, instance_type: InstanceType) -> str | None:
        """The AMI ``instance_type`` boots under ``spec``, or None if it has none."""
        if spec.images is not None:
            return spec.images.get(instance_type.arch)
        if spec.alias is not None:
            name = alias_parameter(
                spec.alias,
                self._discovery.kubernetes_version,
                instance_type.arch,
                instance_type.allocatable.gpu > 0,
            )
            return await self._discovery.parameter(name) if name else None
        return await self._discovery.image(instance_type)

    async def _defaults_spec(self) -> LaunchSpec:
        subnets = await self._discovery.subnets()
        if not subnets:
            return LaunchSpec(
                None,
                problem="no available subnet matches the subnet selector (default: the tag "
                "karpenter.sh/discovery: <cluster name>); name an EC2NodeClass in the "
                "NodePool's nodeClassRef or tag the subnets",
                code="SubnetsNotFound",
            )
        groups = await self._discovery.security_groups()
        if not groups:
            return LaunchSpec(
                None,
                subnets=subnets,
                problem="no security group matches the security group selector",
                code="SecurityGroupsNotFound",
            )
        problem = user_data_problem(self._defaults_family, self._defaults.user_data)
        if problem:
            return LaunchSpec(
                None, subnets, groups, problem=f"--user-data: {problem}", code="UserDataInvalid"
            )
        return LaunchSpec(
            None, subnets, groups, template=self._defaults, family=self._defaults_family
        )

    async def _resolve(self, name: str, spec: EC2NodeClassSpec) -> LaunchSpec:
        """Never raises a CloudError: a failing call becomes the class's problem."""
        try:
            return await self._resolve_calls(name, spec)
        except CloudError as exc:
            log.warning("could not resolve EC2NodeClass", nodeclass=name, error=str(exc))
            return LaunchSpec(
                name, problem=f"EC2NodeClass {name}: {exc.code}: {exc.message}", code=exc.code
            )

    async def _resolve_calls(self, name: str, spec: EC2NodeClassSpec) -> LaunchSpec:
        def broken(code: str, problem: str) -> LaunchSpec:
            log.warning("EC2NodeClass cannot launch", nodeclass=name, reason=problem)
            return LaunchSpec(name, problem=f"EC2NodeClass {name}: {problem}", code=code)

        problem = user_data_problem(spec.family, spec.user_data)
        if problem:
            return broken("UserDataInvalid", f"{problem} (amiFamily {spec.family})")
        subnet_terms = [SelectorTerm(dict(t.tags), t.id) for t in spec.subnet_selector_terms]
        subnets = await find_subnets(self._ec2, subnet_terms)
        if not subnets:
            shown = _shown(spec.subnet_selector_terms)
            return broken("SubnetsNotFound", f"no available subnet matches {shown}")
        group_terms = [
            SelectorTerm(dict(t.tags), t.id, t.name) for t in spec.security_group_selector_terms
        ]
        groups = await find_security_groups(self._ec2, group_terms)
        if not groups:
            shown = _shown(spec.security_group_selector_terms)
            return broken("SecurityGroupsNotFound", f"no security group matches {shown}")
        images: dict[str, str] | None = None
        alias = next((t.alias for t in spec.ami_selector_terms if t.alias), None)
        alias_archs: frozenset[str] | None = None
        if alias is not None:
            alias_archs = await self._alias_architectures(alias)
            if not alias_archs:
                return broken("AMIsNotFound", f"no AMI published for alias {alias}")
        else:
            found = await find_images(self._ec2, spec.ami_selector_terms, self._parameter)
            images = {arch: image.id for arch, image in newest_by_arch(found).items()}
            if not images:
                shown = _shown(spec.ami_selector_terms)
                return broken("AMIsNotFound", f"no available image matches {shown}")
        profile = spec.instance_profile
        if profile is None and spec.role is not None:
            try:
                profile = await self._profiles.for_role(spec.role)
            except CloudError as exc:
                return broken(
                    "InstanceProfileNotReady",
                    f"no instance profile for role {spec.role}: {exc.code}: {exc.message}",
                )
        template = TemplateSettings(
            instance_profile=profile,
            user_data=spec.user_data,
            metadata_options=_metadata_options(spec),
            block_devices=block_device_mappings(spec.block_device_mappings),
            node_class=name,
        )
        log.info(
            "resolved EC2NodeClass",
            nodeclass=name,
            zones=", ".join(subnets),
            security_groups=", ".join(groups),
            amis=alias or ", ".join(f"{a}: {i}" for a, i in sorted((images or {}).items())),
        )
        return LaunchSpec(
            name,
            subnets,
            groups,
            images=images,
            alias=alias,
            alias_architectures=alias_archs,
            template=template,
            tags=dict(spec.tags),
            family=spec.family,
            kubelet=spec.kubelet,
        )

    async def _alias_architectures(self, alias: str) -> frozenset[str]:
        """The architectures whose standard variant of ``alias`` is published."""
        found: set[str] = set()
        for arch in ("amd64", "arm64"):
            name = alias_parameter(alias, self._discovery.kubernetes_version, arch, gpu=False)
            if name is None:
                continue
            try:
                await self._discovery.parameter(name)
            except CloudError as exc:
                if exc.code != "ParameterNotFound":
                    raise
                continue
            found.add(arch)
        return frozenset(found)

    def _parameter(self, name: str) -> Awaitable[str]:
        return self._discovery.parameter(name)
