"""Which AMI an EC2NodeClass boots, per instance architecture.

An ``amiSelectorTerms`` list is either one alias (``al2023@latest``, ``bottlerocket@v1.20.0``)
or terms that select images (by id, name and owner, tags, or an SSM parameter holding an
id), OR-ed together. An alias stands for the AWS-published SSM parameters of that family,
one per architecture and GPU flavour, read when a launch needs that variant. Selecting
terms are resolved once (DescribeImages) into the images they match; each architecture
boots the newest of its images, and an architecture without an image is one the class
cannot launch (its types are left out through ``NodeClassState.architectures``).

The parameter names are those AWS publishes for EKS nodes: the EKS-optimized Amazon Linux
ones under ``/aws/service/eks/optimized-ami``, Bottlerocket's under
``/aws/service/bottlerocket`` and Windows' under ``/aws/service/ami-windows-latest``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from spotwright.adapters.aws._api import AwsCaller
from spotwright.model.nodeclass import AmiSelectorTerm

__all__ = ["ARCHITECTURES", "Image", "alias_parameter", "find_images", "newest_by_arch"]

#: EC2's architecture names -> Kubernetes' (``kubernetes.io/arch``).
ARCHITECTURES: Final = {"x86_64": "amd64", "arm64": "arm64"}
_EKS: Final = "/aws/service/eks/optimized-ami"
_WINDOWS: Final = {
    "windows2019": "Windows_Server-2019-English-Core-EKS_Optimized",
    "windows2022": "Windows_Server-2022-English-Core-EKS_Optimized",
    "windows2025": "Windows_Server-2025-English-Core-EKS_Optimized",
}
#: Images per DescribeImages call when terms name ids.
_ID_CHUNK: Final = 100


@dataclass(frozen=True, slots=True, order=True)
class Image:
    #: Sort key first: the newest image of an architecture wins (ties: the higher id).
    created: str
    id: str
    #: Kubernetes' name for the architecture: amd64 or arm64.
    arch: str


def alias_parameter(alias: str, kubernetes_version: str, arch: str, gpu: bool) -> str | None:
    """The SSM parameter holding the AMI of ``alias`` for one variant, or None if the
    family publishes none for it (Windows on arm64 or with GPUs).

    ``arch`` is Kubernetes' (amd64, arm64); ``version`` is ``latest`` or a release such as
    ``v20240807`` (AL2, AL2023) or ``v1.20.0`` (Bottlerocket).
    """
    family, _, version = alias.partition("@")
    k8s = kubernetes_version
    ec2_arch = "arm64" if arch == "arm64" else "x86_64"
    if family == "al2023":
        flavor = "nvidia" if gpu else "standard"
        leaf = (
            "recommended"
            if version == "latest"
            else f"amazon-eks-node-al2023-{ec2_arch}-{flavor}-{k8s}-{version}"
        )
        return f"{_EKS}/{k8s}/amazon-linux-2023/{ec2_arch}/{flavor}/{leaf}/image_id"
    if family == "al2":
        suffix = "-gpu" if gpu else ("-arm64" if arch == "arm64" else "")
        node = (
            "amazon-eks-gpu-node"
            if gpu
            else ("amazon-eks-arm64-node" if arch == "arm64" else "amazon-eks-node")
        )
        leaf = "recommended" if version == "latest" else f"{node}-{k8s}-{version}"
        return f"{_EKS}/{k8s}/amazon-linux-2{suffix}/{leaf}/image_id"
    if family == "bottlerocket":
        variant = f"aws-k8s-{k8s}-nvidia" if gpu else f"aws-k8s-{k8s}"
        release = "latest" if version == "latest" else version.removeprefix("v")
        return f"/aws/service/bottlerocket/{variant}/{ec2_arch}/{release}/image_id"
    if family in _WINDOWS:
        if arch == "arm64" or gpu:
            return None
        return f"/aws/service/ami-windows-latest/{_WINDOWS[family]}-{k8s}/image_id"
    return None


def _term_calls(term: AmiSelectorTerm, image_id: str | None) -> dict[str, Any]:
    """DescribeImages parameters for one selecting term (``image_id``: from its parameter)."""
    if term.id or image_id:
        return {"ImageIds": [term.id or image_id]}
    filters: list[dict[str, Any]] = [{"Name": "state", "Values": ["available"]}]
    if term.name:
        filters.append({"Name": "name", "Values": [term.name]})
    for key, value in sorted(term.tags.items()):
        if value == "*":
            filters.append({"Name": "tag-key", "Values": [key]})
        else:
            filters.append({"Name": f"tag:{key}", "Values": [value]})
    params: dict[str, Any] = {"Filters": filters}
    if term.owner:
        params["Owners"] = [term.owner]
    elif term.name:
        # A name alone could match anyone's public image: only ours and Amazon's count.
        params["Owners"] = ["self", "amazon"]
    return params


async def find_images(
    ec2: AwsCaller,
    terms: Sequence[AmiSelectorTerm],
    parameter: Callable[[str], Awaitable[str]],
) -> list[Image]:
    """Every available image the (non-alias) terms select, each once."""
    found: dict[str, Image] = {}
    for term in terms:
        image_id = await parameter(term.ssm_parameter) if term.ssm_parameter else None
        rows = await ec2.collect("DescribeImages", "Images", **_term_calls(term, image_id))
        for row in rows:
            image = _image(row)
            if image is not None:
                found[image.id] = image
    return sorted(found.values())


def _image(row: Mapping[str, Any]) -> Image | None:
    arch = ARCHITECTURES.get(str(row.get("Architecture", "")))
    if arch is None or row.get("State", "available") != "available":
        return None
    return Image(str(row.get("CreationDate") or ""), str(row["ImageId"]), arch)


def newest_by_arch(images: Sequence[Image]) -> dict[str, Image]:
    """Kubernetes architecture -> the newest image for it."""
    out: dict[str, Image] = {}
    for image in sorted(images):
        out[image.arch] = image
    return out
