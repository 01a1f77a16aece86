"""The EC2NodeClass: how spotwright launches an EC2 instance for a NodePool.

Where a NodePool says *which* instances pods may get, the node class says *how* they are
launched: subnets, security groups, AMI, IAM role, user data, tags, kubelet settings,
block devices and instance metadata options. The model follows Karpenter's
``karpenter.k8s.aws/v1`` EC2NodeClass field for field (and its CEL rules), under
spotwright's own ``spotwright.io/v1alpha1`` group as well, so a class written for
Karpenter is read unchanged. ``spotwright import karpenter`` converts one; the fields of
Karpenter's class this model does not carry are listed in ``UNSUPPORTED`` with the reason,
so the importer can say what it drops. On EC2 a class is resolved for launching by
``adapters.aws.nodeclasses``.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from spotwright.model.errors import Problem, ScenarioError, problems_from_validation, show
from spotwright.model.fields import ConfigModel, Memory, ObjectMeta, StrictInt, Whole
from spotwright.model.kubelet import KubeletConfiguration

__all__ = [
    "AMI_FAMILIES",
    "UNSUPPORTED",
    "AmiSelectorTerm",
    "BlockDeviceMapping",
    "EC2NodeClass",
    "EC2NodeClassSpec",
    "KubeletConfiguration",
    "MetadataOptions",
    "SecurityGroupSelectorTerm",
    "SubnetSelectorTerm",
    "parse_nodeclass",
]

AmiFamily = Literal[
    "AL2", "AL2023", "Bottlerocket", "Custom", "Windows2019", "Windows2022", "Windows2025"
]

#: The AMI family each ``alias`` prefix stands for.
AMI_FAMILIES: dict[str, AmiFamily] = {
    "al2": "AL2",
    "al2023": "AL2023",
    "bottlerocket": "Bottlerocket",
    "windows2019": "Windows2019",
    "windows2022": "Windows2022",
    "windows2025": "Windows2025",
}

#: Fields of Karpenter's EC2NodeClass spec that spotwright does not model, and why.
UNSUPPORTED: dict[str, str] = {
    "instanceStorePolicy": "instance-store RAID0 is not modelled",
    "capacityReservationSelectorTerms": "capacity reservations are not modelled",
    "placementGroupSelector": "placement groups are not modelled",
    "associatePublicIPAddress": "network interfaces are not modelled",
    "ipPrefixCount": "network interfaces are not modelled",
    "networkInterfaces": "network interfaces are not modelled",
    "detailedMonitoring": "CloudWatch detailed monitoring is not modelled",
    "context": "CreateFleet context is not modelled",
    "cpuOptions": "CPU options are not modelled",
}

_RESTRICTED_TAGS = ("eks:eks-cluster-name", "karpenter.sh/nodepool", "karpenter.sh/nodeclaim")
_RESTRICTED_TAG_PREFIX = "kubernetes.io/cluster/"
_NODECLASS_TAG = "karpenter.k8s.aws/ec2nodeclass"
_ALIAS = re.compile(
    r"^(?P<family>[a-z0-9]+)@(?P<version>latest|v[0-9A-Za-z._-]+|[0-9][0-9A-Za-z._-]*)$"
)


def _one_of(term: ConfigModel, names: tuple[str, ...], what: str) -> None:
    if not any(getattr(term, n) for n in names):
        listed = ", ".join(_camel(n) for n in names)
        raise ValueError(f"expected a {what} selector term with at least one of {listed}, got none")


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def _exclusive_id(term: ConfigModel, others: tuple[str, ...]) -> None:
    if getattr(term, "id", None) and any(getattr(term, n) for n in others):
        raise ValueError("expected id on its own in its term (it selects exactly one), got more")


class SubnetSelectorTerm(ConfigModel):
    """Subnets with all these tags (``'*'`` matches any value), or one subnet by id."""

    tags: dict[str, str] = Field(default_factory=dict)
    id: str | None = Field(default=None, pattern=r"^subnet-[0-9a-z]+$")

    @model_validator(mode="after")
    def _shape(self) -> SubnetSelectorTerm:
        _one_of(self, ("tags", "id"), "subnet")
        _exclusive_id(self, ("tags",))
        return self


class SecurityGroupSelectorTerm(ConfigModel):
    tags: dict[str, str] = Field(default_factory=dict)
    id: str | None = Field(default=None, pattern=r"^sg-[0-9a-z]+$")
    name: str | None = None

    @model_validator(mode="after")
    def _shape(self) -> SecurityGroupSelectorTerm:
        _one_of(self, ("tags", "id", "name"), "security group")
        _exclusive_id(self, ("tags", "name"))
        return self


class AmiSelectorTerm(ConfigModel):
    """An AMI by alias (``al2023@latest``, ``bottlerocket@v1.20.0``), or by id/name/tags."""

    alias: str | None = None
    tags: dict[str, str] = Field(default_factory=dict)
    id: str | None = Field(default=None, pattern=r"^ami-[0-9a-z]+$")
    name: str | None = None
    owner: str | None = None
    ssm_parameter: str | None = None

    @field_validator("alias")
    @classmethod
    def _alias(cls, value: str | None) -> str | None:
        if value is None:
            return value
        match = _ALIAS.match(value)
        if not match or match["family"] not in AMI_FAMILIES:
            families = ", ".join(AMI_FAMILIES)
            raise ValueError(
                f"expected an alias family@version (family one of {families}; version "
                f"latest or a release like v20240807), got {show(value)}"
            )
        return value

    @model_validator(mode="after")
    def _shape(self) -> AmiSelectorTerm:
        _one_of(self, ("alias", "tags", "id", "name", "ssm_parameter"), "AMI")
        if self.alias and any((self.tags, self.id, self.name, self.owner, self.ssm_parameter)):
            raise ValueError("expected alias on its own in its term, got other fields with it")
        _exclusive_id(self, ("tags", "name", "owner", "ssm_parameter"))
        return self

    @property
    def family(self) -> AmiFamily | None:
        return AMI_FAMILIES[self.alias.partition("@")[0]] if self.alias else None


class EbsVolume(ConfigModel):
    volume_size: Memory | None = None
    volume_type: Literal["standard", "io1", "io2", "gp2", "sc1", "st1", "gp3"] | None = None
    iops: Whole | None = None
    throughput: Whole | None = None
    encrypted: bool | None = None
    kms_key_id: str | None = Field(default=None, alias="kmsKeyID")
    delete_on_termination: bool | None = None
    snapshot_id: str | None = Field(default=None, alias="snapshotID")


class BlockDeviceMapping(ConfigModel):
    device_name: str | None = None
    ebs: EbsVolume | None = None
    root_volume: bool = False


class MetadataOptions(ConfigModel):
    """Instance metadata service settings; the defaults are Karpenter's (IMDSv2 only)."""

    http_endpoint: Literal["enabled", "disabled"] = "enabled"
    http_protocol_ipv6: Literal["enabled", "disabled"] = Field(
        default="disabled", alias="httpProtocolIPv6"
    )
    http_put_response_hop_limit: StrictInt = Field(default=1, ge=1, le=64)
    http_tokens: Literal["required", "optional"] = "required"


class EC2NodeClassSpec(ConfigModel):
    subnet_selector_terms: list[SubnetSelectorTerm] = Field(min_length=1, max_length=30)
    security_group_selector_terms: list[SecurityGroupSelectorTerm] = Field(
        min_length=1, max_length=30
    )
    ami_selector_terms: list[AmiSelectorTerm] = Field(min_length=1, max_length=30)
    ami_family: AmiFamily | None = None
    role: str | None = None
    instance_profile: str | None = None
    user_data: str | None = None
    tags: dict[str, str] = Field(default_factory=dict)
    kubelet: KubeletConfiguration | None = None
    block_device_mappings: list[BlockDeviceMapping] = Field(default_factory=list, max_length=50)
    metadata_options: MetadataOptions = Field(default_factory=MetadataOptions)

    @field_validator("tags")
    @classmethod
    def _tags(cls, tags: dict[str, str]) -> dict[str, str]:
        for key in tags:
            if (
                key in _RESTRICTED_TAGS
                or key == _NODECLASS_TAG
                or key.startswith(_RESTRICTED_TAG_PREFIX)
            ):
                raise ValueError(
                    f"expected a tag key spotwright does not set itself, got {show(key)} "
                    f"(restricted: {_RESTRICTED_TAG_PREFIX}*, {', '.join(_RESTRICTED_TAGS)}, "
                    f"{_NODECLASS_TAG})"
                )
        return tags

    @field_validator("block_device_mappings")
    @classmethod
    def _one_root(cls, mappings: list[BlockDeviceMapping]) -> list[BlockDeviceMapping]:
        roots = sum(1 for m in mappings if m.root_volume)
        if roots > 1:
            raise ValueError(f"expected at most one mapping with rootVolume: true, got {roots}")
        return mappings

    @model_validator(mode="after")
    def _rules(self) -> EC2NodeClassSpec:
        if (self.role is None) == (self.instance_profile is None):
            got = "both" if self.role is not None else "neither"
            raise ValueError(f"expected exactly one of role and instanceProfile, got {got}")
        aliases = [t for t in self.ami_selector_terms if t.alias]
        if aliases and len(self.ami_selector_terms) > 1:
            raise ValueError("expected an alias to be the only amiSelectorTerm, got more terms")
        if aliases:
            family = aliases[0].family
            if self.ami_family is not None and self.ami_family != family:
                raise ValueError(
                    f"expected amiFamily {family} (from alias {aliases[0].alias}) or none, "
                    f"got {self.ami_family}"
                )
        elif self.ami_family is None:
            raise ValueError(
                "expected amiFamily when amiSelectorTerms has no alias (it says how to "
                "bootstrap the AMI), got none"
            )
        return self

    @property
    def family(self) -> AmiFamily:
        """The AMI family, given or implied by the alias."""
        for term in self.ami_selector_terms:
            if term.family is not None:
                return term.family
        assert self.ami_family is not None  # enforced by _rules
        return self.ami_family


class EC2NodeClass(ConfigModel):
    api_version: Literal["karpenter.k8s.aws/v1", "spotwright.io/v1alpha1"] = (
        "spotwright.io/v1alpha1"
    )
    kind: Literal["EC2NodeClass"] = "EC2NodeClass"
    metadata: ObjectMeta
    spec: EC2NodeClassSpec
    #: Present in ``kubectl get -o yaml`` output; ignored.
    status: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.metadata.name


def parse_nodeclass(data: Any, *, source: str) -> EC2NodeClass:
    """Validate one EC2NodeClass document; raises ``ScenarioError`` listing every problem."""
    if not isinstance(data, dict):
        message = f"expected an EC2NodeClass mapping, got {show(data)}"
        raise ScenarioError(source, [Problem("", message)])
    try:
        return EC2NodeClass.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(source, problems_from_validation(exc, data, EC2NodeClass)) from None
