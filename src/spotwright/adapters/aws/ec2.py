"""EC2 behind the Cloud port: the live counterpart of the simulated market.

``EC2Cloud`` discovers what it can launch (``discovery``), resolves each NodePool's
EC2NodeClass into subnets, security groups, AMIs and an instance profile (``nodeclasses``),
launches with instant-type CreateFleet calls (``fleet``, merged when identical, through a
launch template per NodePool, class, AMI and node user data, ``bootstrap``, with the
cluster's coordinates from ``cluster_info``), classifies what goes wrong (``errors``),
and terminates, describes and lists the cluster's instances. Its semantics match
``adapters.sim_market.SimulatedMarket``: the same validation of requests, the same error
types and codes, ``offerings()`` flagging everything available (EC2 does not reveal
capacity), and ``provider_id`` of the form ``aws:///<zone>/<instance id>``.

Start it with ``await cloud.refresh()`` (the first discovery; ``instance_types()`` and
``offerings()`` are served from its caches) and keep ``cloud.run()`` running as a task so
stale parts are refreshed. Every AWS call goes through ``_api.AwsCaller``: a thread per call,
a client-side token bucket, and retries of throttling and 5xx answers.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Final

import boto3  # type: ignore[import-untyped]

from spotwright.adapters.aws import errors as classify
from spotwright.adapters.aws._api import AwsCaller, TokenBucket, make_client
from spotwright.adapters.aws._batch import Batcher
from spotwright.adapters.aws.bootstrap import (
    ClusterInfo,
)
from spotwright.adapters.aws.cluster_info import ClusterSource
from spotwright.adapters.aws.discovery import Discovery
from spotwright.adapters.aws.fleet import (
    NODECLASS_TAG,
    NODEPOOL_TAG,
    FleetPlan,
    Launched,
    MergeKey,
    Override,
    cluster_tag,
    fleet_request,
    launched_instances,
    merge_key,
    request_tags,
    shared_tags,
)
from spotwright.adapters.aws.instance_profiles import InstanceProfiles
from spotwright.adapters.aws.launch_templates import LaunchTemplates, TemplateSettings
from spotwright.adapters.aws.nodeclasses import LaunchSpec, NodeClasses, NodeClassLookup
from spotwright.adapters.aws.pricing import PRICING_API_REGION
from spotwright.adapters.aws.settings import EC2Settings
from spotwright.catalog import Catalog, load_catalog
from spotwright.catalog._types import InstanceType
from spotwright.model import labels as wk
from spotwright.observability.logs import get_logger
from spotwright.ports.clock import Clock
from spotwright.ports.cloud import CloudError, Instance, LaunchRequest, NodeClassState, Offering

__all__ = ["EC2Cloud", "EC2Settings"]

log = get_logger("aws.ec2")

#: Instance states list_owned reports (what still costs money or may come back).
OWNED_STATES: Final = ("pending", "running", "stopping", "stopped")
#: EC2 filter values per filter are limited; describe asks in chunks of this many ids.
DESCRIBE_CHUNK: Final = 200


class EC2Cloud:
    """The Cloud port on EC2 in one region (see the module docstring)."""

    def __init__(
        self,
        settings: EC2Settings,
        *,
        region: str,
        clock: Clock,
        ec2_client: Any = None,
        ssm_client: Any = None,
        pricing_client: Any = None,
        iam_client: Any = None,
        eks_client: Any = None,
        node_classes: NodeClassLookup | None = None,
        catalog: Catalog | None = None,
        endpoint_url: str | None = None,
        profile: str | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if not settings.cluster_name:
            raise ValueError("EC2Settings.cluster_name must not be empty")
        self.region = region
        self.settings = settings
        self._clock = clock
        rng = rng or random.Random()

        shared: list[Any] = []  # one boto3 session for the clients made here

        def client(service: str, given: Any, where: str = region) -> Any:
            if given is not None:
                return given
            if not shared:
                shared.append(boto3.session.Session(profile_name=profile, region_name=region))
            return make_client(service, region=where, endpoint_url=endpoint_url, session=shared[0])

        limiter = TokenBucket(clock, rate=settings.api_rate, burst=settings.api_burst)
        self._ec2 = AwsCaller(
            client("ec2", ec2_client), clock=clock, limiter=limiter, retry=settings.retry, rng=rng
        )
        ssm = AwsCaller(client("ssm", ssm_client), clock=clock, retry=settings.retry, rng=rng)
        pricing = None
        if settings.use_pricing_api or pricing_client is not None:
            pricing = AwsCaller(
                client("pricing", pricing_client, PRICING_API_REGION),
                clock=clock,
                retry=settings.retry,
                rng=rng,
            )
        subnets, groups = settings.selectors()
        self.discovery = Discovery(
            region=region,
            ec2=self._ec2,
            ssm=ssm,
            pricing=pricing,
            clock=clock,
            catalog=catalog if catalog is not None else load_catalog(),
            subnet_selector=subnets,
            security_group_selector=groups,
            kubernetes_version=settings.kubernetes_version,
            ami_parameter=settings.ami_parameter,
            ami_id=settings.ami_id,
            instance_type_patterns=settings.instance_type_patterns,
            intervals=settings.intervals,
        )
        self.launch_templates = LaunchTemplates(self._ec2, cluster_name=settings.cluster_name)
        iam = AwsCaller(client("iam", iam_client), clock=clock, retry=settings.retry, rng=rng)

        def eks() -> AwsCaller:  # made only if DescribeCluster is needed
            return AwsCaller(client("eks", eks_client), clock=clock, retry=settings.retry, rng=rng)

        self._cluster = ClusterSource(settings, eks)
        self.node_classes = NodeClasses(
            ec2=self._ec2,
            discovery=self.discovery,
            profiles=InstanceProfiles(iam, cluster_name=settings.cluster_name, region=region),
            clock=clock,
            lookup=node_classes,
            defaults=TemplateSettings(settings.instance_profile, settings.user_data),
            ttl=settings.intervals.network,
            defaults_family=settings.defaults_family(),
        )
        self._fleets: Batcher[MergeKey, LaunchRequest, Instance] = Batcher(
            self._launch_batch,
            clock=clock,
            idle=settings.fleet_idle_seconds,
            max_wait=settings.fleet_max_seconds,
            max_items=settings.fleet_max_items,
        )
        self._terminations: Batcher[None, str, None] = Batcher(
            self._terminate_batch,
            clock=clock,
            idle=settings.terminate_idle_seconds,
            max_wait=settings.terminate_max_seconds,
            max_items=settings.terminate_max_items,
        )

    @property
    def ec2_client(self) -> Any:
        """The boto3 EC2 client (tests register botocore event handlers on it)."""
        return self._ec2.client

    @property
    def fleet_calls(self) -> int:
        """How many merged CreateFleet batches were sent."""
        return self._fleets.batches

    # --- discovery --------------------------------------------------------------------

    async def refresh(self, *, force: bool = False) -> None:
        """Fetch stale discovery data; the first call must succeed before the port is used."""
        await self.discovery.refresh(force=force)

    async def run(self) -> None:
        """Keep discovery fresh until cancelled; failures are logged, never raised."""
        interval = min(
            self.settings.intervals.network,
            self.settings.intervals.instance_types,
            self.settings.intervals.prices,
        )
        while True:
            await self._clock.sleep(interval)
            try:
                await self.discovery.refresh()
            except Exception as exc:
                log.warning("discovery refresh failed", error=str(exc))

    def instance_types(self) -> Sequence[InstanceType]:
        return self.discovery.instance_types()

    def offerings(self) -> Sequence[Offering]:
        """Every offering with its current price, all available: EC2 hides capacity."""
        return self.discovery.offerings()

    # --- launch -----------------------------------------------------------------------

    async def launch(self, request: LaunchRequest) -> Instance:
        """One instance for one node claim, by CreateFleet (merged with identical requests).

        Raises InsufficientCapacityError (each failed offering listed), QuotaExceededError
        (a whole capacity type closed) or CloudError, as the simulated market does.
        """
        if not request.offerings:
            raise ValueError(f"launch request {request.node_claim!r} has no offerings")
        for offering in request.offerings:
            if offering.capacity_type != request.capacity_type:
                raise ValueError(
                    f"launch request {request.node_claim!r} is for {request.capacity_type} but "
                    f"lists a {offering.capacity_type} offering ({offering.instance_type})"
                )
        return await self._fleets.submit(merge_key(request), request)

    async def node_class(self, name: str | None) -> NodeClassState:
        """The zones and architectures a class (None: the defaults) can launch, or why not."""
        return (await self.node_classes.launch_spec(name)).state()

    async def cluster_info(self) -> ClusterInfo:
        """The cluster's endpoint, CA and service CIDR for the nodes' user data."""
        return await self._cluster.get()

    async def _plan(self, request: LaunchRequest) -> tuple[FleetPlan, LaunchSpec]:
        spec = await self.node_classes.launch_spec(request.node_class)
        if spec.problem:
            raise CloudError(spec.code or "NodeClassNotReady", spec.problem)
        types = {it.name: it for it in self.discovery.instance_types()}
        configs: dict[str, list[Override]] = {}
        count = 0
        for offering in request.offerings:
            subnet = spec.subnets.get(offering.zone)
            itype = types.get(offering.instance_type)
            if subnet is None or itype is None:
                continue
            image = await self.node_classes.image(spec, itype)
            if image is None:
                continue
            settings = await self._cluster.node_template(spec, request, itype)
            template = await self.launch_templates.ensure(
                request.nodepool, image, spec.security_groups, settings
            )
            configs.setdefault(template, []).append(
                Override(offering.instance_type, subnet.id, offering.zone)
            )
            count += 1
            if count >= self.settings.max_overrides:
                break
        if not configs:
            raise CloudError(
                "NoLaunchableOffering",
                "no offering of the request is a known type with an AMI in a zone with a "
                "selected subnet",
            )
        plan = FleetPlan(
            request.capacity_type,
            tuple((template, tuple(overrides)) for template, overrides in configs.items()),
        )
        return plan, spec

    async def _launch_batch(
        self, _key: MergeKey, requests: Sequence[LaunchRequest]
    ) -> list[Instance | BaseException]:
        first = requests[0]
        capacity_type = first.capacity_type
        try:
            plan, spec = await self._plan(first)
        except CloudError as exc:
            return [CloudError(exc.code, exc.message) for _ in requests]
        # The class's tags first: spotwright's ownership tags win over them.
        tags = {**spec.tags, **shared_tags(requests)}
        if spec.name:
            tags[NODECLASS_TAG] = spec.name
        tags[cluster_tag(self.settings.cluster_name)] = "owned"
        params = fleet_request(plan, count=len(requests), tags=tags, client_token=str(uuid.uuid4()))
        try:
            response = await self._ec2.call("CreateFleet", **params)
        except CloudError as exc:
            if exc.code.startswith("InvalidLaunchTemplate"):
                for template, _ in plan.configs:
                    self.launch_templates.forget(template)
            log.warning("CreateFleet failed", error=str(exc), requests=len(requests))
            return [
                classify.classify_call_error(
                    exc, capacity_type=capacity_type, offerings=r.offerings
                )
                for r in requests
            ]
        zone_of_subnet = plan.zone_of_subnet
        launched = launched_instances(
            response, capacity_type=capacity_type, zone_of_subnet=zone_of_subnet
        )
        fleet_errors = list(response.get("Errors") or ())
        for item in fleet_errors:
            override = (item.get("LaunchTemplateAndOverrides") or {}).get("Overrides") or {}
            log.debug(
                "CreateFleet override failed",
                code=item.get("ErrorCode"),
                instance_type=override.get("InstanceType"),
                subnet=override.get("SubnetId"),
            )
        if len(launched) > len(requests):
            log.warning(
                "CreateFleet returned more instances than asked; garbage collection will reap",
                asked=len(requests),
                got=len(launched),
            )
        instances = await self._complete(launched[: len(requests)], requests, tags)
        results: list[Instance | BaseException] = list(instances)
        for request in requests[len(instances) :]:
            results.append(
                classify.classify_fleet_errors(
                    fleet_errors,
                    capacity_type=capacity_type,
                    offerings=request.offerings,
                    zone_of_subnet=zone_of_subnet,
                )
            )
        return results

    async def _complete(
        self,
        launched: Sequence[Launched],
        requests: Sequence[LaunchRequest],
        fleet_tags: Mapping[str, str],
    ) -> list[Instance]:
        """Instances for what a fleet launched: described, and tagged per request if merged."""
        described: dict[str, Instance] = {}
        if launched:
            try:
                found = await self._describe_filtered([item.instance_id for item in launched])
                described = {i.id: i for i in found}
            except CloudError as exc:  # the launch worked; the details are a nicety
                log.warning("could not describe new instances", error=str(exc))
        now = self._clock.now()
        out: list[Instance] = []
        tagging: list[Awaitable[None]] = []
        for item, request in zip(launched, requests, strict=False):
            own = request_tags(request)
            extra = {k: v for k, v in own.items() if fleet_tags.get(k) != v}
            if extra:
                tagging.append(self._tag(item.instance_id, extra))
            price = next(
                (
                    o.price
                    for o in request.offerings
                    if (o.instance_type, o.zone) == (item.instance_type, item.zone)
                ),
                None,
            )
            instance = described.get(item.instance_id)
            if instance is None:
                instance = Instance(
                    id=item.instance_id,
                    instance_type=item.instance_type,
                    zone=item.zone,
                    capacity_type=item.capacity_type,
                    price=0.0,
                    launched_at=now,
                )
            instance.tags = {**instance.tags, **fleet_tags, **own}
            if price is not None:
                instance.price = price
            out.append(instance)
        if tagging:
            await asyncio.gather(*tagging)
        return out

    async def _tag(self, instance_id: str, tags: Mapping[str, str]) -> None:
        try:
            await self._ec2.call(
                "CreateTags",
                Resources=[instance_id],
                Tags=[{"Key": k, "Value": v} for k, v in sorted(tags.items())],
            )
        except CloudError as exc:
            log.warning("could not tag new instance", instance_id=instance_id, error=str(exc))

    # --- terminate, describe, list -------------------------------------------------------

    async def terminate(self, instance_id: str) -> None:
        """TerminateInstances, merged with other terminations of the next 100 ms.

        Idempotent for instances already shutting down; an unknown id fails with
        ``CloudError('InvalidInstanceID.NotFound')``, as the simulated market does.
        """
        await self._terminations.submit(None, instance_id)

    async def _terminate_batch(self, _key: None, ids: Sequence[str]) -> list[BaseException | None]:
        unique = list(dict.fromkeys(ids))
        try:
            await self._ec2.call("TerminateInstances", InstanceIds=unique)
            return [None] * len(ids)
        except CloudError as exc:
            if len(unique) == 1:
                return [CloudError(exc.code, exc.message) for _ in ids]
        # One bad id fails the whole call: find out which, one by one.
        outcomes: dict[str, BaseException | None] = {}

        async def one(instance_id: str) -> None:
            try:
                await self._ec2.call("TerminateInstances", InstanceIds=[instance_id])
                outcomes[instance_id] = None
            except CloudError as exc:
                outcomes[instance_id] = exc

        await asyncio.gather(*(one(i) for i in unique))
        return [outcomes[i] for i in ids]

    async def describe(self, instance_ids: Sequence[str]) -> list[Instance]:
        """The known instances among ``instance_ids`` (terminated ones included), in order."""
        if not instance_ids:
            return []
        found = {i.id: i for i in await self._describe_filtered(list(instance_ids))}
        return [found[i] for i in instance_ids if i in found]

    async def _describe_filtered(self, ids: Sequence[str]) -> list[Instance]:
        # A filter, unlike InstanceIds, does not fail the whole call for an unknown id.
        out: list[Instance] = []
        for start in range(0, len(ids), DESCRIBE_CHUNK):
            chunk = list(ids[start : start + DESCRIBE_CHUNK])
            reservations = await self._ec2.collect(
                "DescribeInstances",
                "Reservations",
                Filters=[{"Name": "instance-id", "Values": chunk}],
            )
            out.extend(self._instances(reservations))
        return out

    async def list_owned(self) -> list[Instance]:
        """Every live instance this cluster launched (cluster tag ``owned`` and a NodePool
        tag), for garbage collection of instances no node claim knows about."""
        reservations = await self._ec2.collect(
            "DescribeInstances",
            "Reservations",
            Filters=[
                {"Name": f"tag:{cluster_tag(self.settings.cluster_name)}", "Values": ["owned"]},
                {"Name": "tag-key", "Values": [NODEPOOL_TAG]},
                {"Name": "instance-state-name", "Values": list(OWNED_STATES)},
            ],
        )
        return sorted(self._instances(reservations), key=lambda i: (i.launched_at, i.id))

    def _instances(self, reservations: Sequence[Mapping[str, Any]]) -> list[Instance]:
        out: list[Instance] = []
        for reservation in reservations:
            for row in reservation.get("Instances") or ():
                out.append(self._instance(row))
        return out

    def _instance(self, row: Mapping[str, Any]) -> Instance:
        capacity_type = wk.SPOT if row.get("InstanceLifecycle") == "spot" else wk.ON_DEMAND
        instance_type = str(row.get("InstanceType", ""))
        zone = str((row.get("Placement") or {}).get("AvailabilityZone", ""))
        launch_time = row.get("LaunchTime")
        launched_at = launch_time.timestamp() if launch_time is not None else self._clock.now()
        price = self.discovery.price(capacity_type, instance_type, zone)
        return Instance(
            id=str(row["InstanceId"]),
            instance_type=instance_type,
            zone=zone,
            capacity_type=capacity_type,
            price=price if price is not None else 0.0,
            launched_at=launched_at,
            private_dns=str(row.get("PrivateDnsName") or ""),
            state=str((row.get("State") or {}).get("Name", "pending")),
            tags={str(t["Key"]): str(t["Value"]) for t in row.get("Tags") or ()},
        )

    async def close(self) -> None:
        """Let launches and terminations in flight finish."""
        await self._fleets.close()
        await self._terminations.close()
