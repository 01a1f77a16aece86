"""What one invocation of the serverless drainer works with, live or in a test.

``Runtime`` holds the ports: the Kubernetes cluster, EC2 (only to find a node by the
instance's private DNS name), Auto Scaling (to heartbeat and complete lifecycle hooks), a
clock and the action policy. ``live_runtime`` builds them from the function's environment,
inside the invocation's event loop; tests hand the handler a factory of their own.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import boto3  # type: ignore[import-untyped]

from spotwright.adapters.aws._api import AwsCaller, make_client
from spotwright.adapters.aws.autoscaling import AwsAutoScaling
from spotwright.catalog._types import InstanceType
from spotwright.events.actions import ActionPolicy
from spotwright.ports.autoscaling import AutoScaling
from spotwright.ports.clock import Clock, LoopClock
from spotwright.ports.cloud import Cloud, CloudError, Instance, LaunchRequest, Offering
from spotwright.ports.cluster import Cluster
from spotwright.serverless.eks import connect_cluster, disconnect_cluster, eks_token

__all__ = ["Runtime", "RuntimeFactory", "live_runtime"]


@dataclass
class Runtime:
    """The ports one invocation uses, and how to let go of them afterwards."""

    cluster: Cluster
    #: Only ``describe`` is used: the private DNS name of an instance whose node has no
    #: providerID.
    cloud: Cloud
    autoscaling: AutoScaling | None = None
    clock: Clock = field(default_factory=LoopClock)
    policy: ActionPolicy = field(default_factory=ActionPolicy)
    close: Callable[[], Awaitable[None]] | None = None


#: Builds the runtime inside the invocation's event loop.
RuntimeFactory = Callable[[], Awaitable[Runtime]]


class _InstanceLookup:
    """The Cloud port reduced to DescribeInstances: the drainer launches nothing."""

    def __init__(self, ec2: AwsCaller, region: str) -> None:
        self._ec2 = ec2
        self.region = region

    def instance_types(self) -> Sequence[InstanceType]:
        return ()

    def offerings(self) -> Sequence[Offering]:
        return ()

    async def launch(self, request: LaunchRequest) -> Instance:
        raise CloudError("UnsupportedOperation", "the serverless drainer launches nothing")

    async def terminate(self, instance_id: str) -> None:
        raise CloudError("UnsupportedOperation", "the serverless drainer terminates nothing")

    async def list_owned(self) -> list[Instance]:
        return []

    async def describe(self, instance_ids: Sequence[str]) -> list[Instance]:
        if not instance_ids:
            return []
        reservations = await self._ec2.collect(
            "DescribeInstances",
            "Reservations",
            Filters=[{"Name": "instance-id", "Values": list(instance_ids)}],
        )
        found: list[Instance] = []
        for reservation in reservations:
            for row in reservation.get("Instances") or ():
                launched = row.get("LaunchTime")
                found.append(
                    Instance(
                        id=str(row["InstanceId"]),
                        instance_type=str(row.get("InstanceType", "")),
                        zone=str((row.get("Placement") or {}).get("AvailabilityZone", "")),
                        capacity_type=str(row.get("InstanceLifecycle") or "on-demand"),
                        price=0.0,
                        launched_at=launched.timestamp() if launched is not None else 0.0,
                        private_dns=str(row.get("PrivateDnsName") or ""),
                        state=str((row.get("State") or {}).get("Name", "")),
                    )
                )
        return found


async def live_runtime(environ: Mapping[str, str] | None = None) -> Runtime:
    """The runtime of a real invocation, configured by environment variables.

    ``SPOTWRIGHT_CLUSTER_NAME``, ``SPOTWRIGHT_CLUSTER_ENDPOINT`` and
    ``SPOTWRIGHT_CLUSTER_CA`` (base64, as ``aws eks describe-cluster`` prints it) are
    required; ``SPOTWRIGHT_POLICY`` optionally holds the action policy as JSON; the region
    is Lambda's ``AWS_REGION``.
    """
    env = os.environ if environ is None else environ
    missing = [
        name
        for name in (
            "SPOTWRIGHT_CLUSTER_NAME",
            "SPOTWRIGHT_CLUSTER_ENDPOINT",
            "SPOTWRIGHT_CLUSTER_CA",
        )
        if not env.get(name)
    ]
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or ""
    if not region:
        missing.append("AWS_REGION")
    if missing:
        raise ValueError(f"serverless mode needs the environment variables {', '.join(missing)}")
    policy = (
        ActionPolicy.model_validate_json(env["SPOTWRIGHT_POLICY"])
        if env.get("SPOTWRIGHT_POLICY")
        else ActionPolicy()
    )
    clock = LoopClock()
    session = boto3.session.Session(region_name=region)
    token = eks_token(env["SPOTWRIGHT_CLUSTER_NAME"], region=region, session=session)
    cluster = await connect_cluster(
        env["SPOTWRIGHT_CLUSTER_ENDPOINT"], env["SPOTWRIGHT_CLUSTER_CA"], token.value
    )
    ec2 = AwsCaller(make_client("ec2", region=region, session=session), clock=clock)
    autoscaling = AwsAutoScaling(
        client=make_client("autoscaling", region=region, session=session), clock=clock
    )

    async def close() -> None:
        await disconnect_cluster(cluster)

    return Runtime(
        cluster=cluster,
        cloud=_InstanceLookup(ec2, region),
        autoscaling=autoscaling,
        clock=clock,
        policy=policy,
        close=close,
    )
