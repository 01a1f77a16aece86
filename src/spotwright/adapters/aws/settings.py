"""How the EC2 provider launches when a NodePool names no EC2NodeClass, and how it calls.

Kept apart from ``ec2`` so the provider's module stays about launching. The network and AMI
fields are the defaults a class replaces (see ``nodeclasses``); the rest (request rates,
merge windows, refresh intervals) apply to every launch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spotwright.adapters.aws._api import RetryPolicy
from spotwright.adapters.aws.bootstrap import family_of_parameter
from spotwright.adapters.aws.discovery import DEFAULT_AMI_PARAMETER, RefreshIntervals, SelectorTerm
from spotwright.adapters.aws.fleet import MAX_OVERRIDES

__all__ = ["EC2Settings"]


@dataclass(frozen=True)
class EC2Settings:
    """How the provider launches; everything but the cluster and Kubernetes version has a
    default. Selectors default to the tag ``karpenter.sh/discovery: <cluster name>``."""

    cluster_name: str
    #: The version whose AMIs the defaults and EC2NodeClass aliases boot.
    kubernetes_version: str
    subnet_selector: tuple[SelectorTerm, ...] = ()
    security_group_selector: tuple[SelectorTerm, ...] = ()
    #: Pin one AMI for every type instead of the EKS-optimized SSM parameters.
    ami_id: str | None = None
    ami_parameter: str = DEFAULT_AMI_PARAMETER
    instance_profile: str | None = None
    user_data: str | None = None
    #: How nodes of the defaults bootstrap (None: from ``ami_parameter``; Custom with
    #: ``ami_id``, whose user data is then passed verbatim).
    ami_family: str | None = None
    #: What nodes need to join: given, or else read with EKS DescribeCluster.
    cluster_endpoint: str | None = None
    #: The cluster's CA bundle, base64-encoded PEM (as EKS DescribeCluster returns it).
    cluster_ca_bundle: str | None = None
    #: The service CIDR (the cluster DNS address is its tenth address).
    service_cidr: str | None = None
    #: Restrict discovery to these types (EC2 filter wildcards allowed, e.g. ``m5.*``).
    instance_type_patterns: tuple[str, ...] = ()
    #: On-demand prices from the Pricing API (else from the catalog).
    use_pricing_api: bool = False
    api_rate: float = 10.0
    api_burst: int = 20
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    fleet_idle_seconds: float = 0.035
    fleet_max_seconds: float = 1.0
    fleet_max_items: int = 1000
    terminate_idle_seconds: float = 0.1
    terminate_max_seconds: float = 1.0
    terminate_max_items: int = 500
    max_overrides: int = MAX_OVERRIDES
    intervals: RefreshIntervals = field(default_factory=RefreshIntervals)

    def defaults_family(self) -> str:
        """The AMI family of the defaults' images: it says how their user data is made."""
        if self.ami_family:
            return self.ami_family
        return "Custom" if self.ami_id else family_of_parameter(self.ami_parameter)

    def selectors(self) -> tuple[tuple[SelectorTerm, ...], tuple[SelectorTerm, ...]]:
        default = (SelectorTerm(tags={"karpenter.sh/discovery": self.cluster_name}),)
        return (self.subnet_selector or default, self.security_group_selector or default)
