"""EC2Cloud against moto in server mode: discovery, launch, errors, terminate, describe, GC."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from awsfakes import AMIS, REGION, TEST_TYPES, ZONES, ec2_error, fleet_errors, run

from spotwright.catalog import load_catalog
from spotwright.ports.cloud import (
    CloudError,
    Instance,
    InsufficientCapacityError,
    LaunchRequest,
    Offering,
    QuotaExceededError,
)

MakeCloud = Callable[..., Any]


def request(
    cloud: Any,
    *,
    claim: str = "claim-1",
    nodepool: str = "default",
    capacity_type: str = "spot",
    types: tuple[str, ...] = ("m5.large", "c5.large"),
    zones: tuple[str, ...] = ZONES,
) -> LaunchRequest:
    offerings = tuple(
        o
        for o in cloud.offerings()
        if o.capacity_type == capacity_type and o.instance_type in types and o.zone in zones
    )
    assert offerings, "the test asks for offerings discovery should have"
    return LaunchRequest(
        node_claim=claim,
        nodepool=nodepool,
        capacity_type=capacity_type,
        offerings=offerings,
        tags=(("karpenter.sh/nodeclaim", claim), ("karpenter.sh/nodepool", nodepool)),
    )


def describe_raw(client: Callable[..., Any], instance_id: str) -> dict[str, Any]:
    found = client("ec2").describe_instances(InstanceIds=[instance_id])
    return dict(found["Reservations"][0]["Instances"][0])


# --- discovery -------------------------------------------------------------------------------


def test_discovery_offers_moto_types_in_subnet_zones_with_prices(make_cloud: MakeCloud) -> None:
    async def main() -> None:
        cloud, _ = make_cloud()
        await cloud.refresh()
        names = {it.name for it in cloud.instance_types()}
        assert names == set(TEST_TYPES)
        bundled = load_catalog()
        m5 = next(it for it in cloud.instance_types() if it.name == "m5.large")
        assert m5.allocatable == bundled.get("m5.large").allocatable
        assert m5.od_price == bundled.get("m5.large").od_price
        offerings = cloud.offerings()
        # Only zones with a selected subnet, both capacity types, every test type.
        assert {o.zone for o in offerings} == set(ZONES)
        assert {o.capacity_type for o in offerings} == {"spot", "on-demand"}
        pools = {(o.instance_type, o.zone, o.capacity_type): o for o in offerings}
        for zone in ZONES:
            spot = pools[("m5.large", zone, "spot")]
            assert spot.price == pytest.approx(0.00001)  # moto's constant spot price
            assert pools[("m5.large", zone, "on-demand")].price == m5.od_price
        assert all(o.available for o in offerings)

    run(main())


def test_discovery_is_cached_until_its_interval_passes(make_cloud: MakeCloud) -> None:
    class Clock:
        def __init__(self) -> None:
            self.t = 1_800_000_000.0

        def now(self) -> float:
            return self.t

        async def sleep(self, seconds: float) -> None:
            self.t += max(0.0, seconds)
            await asyncio.sleep(0)

    async def main() -> None:
        clock = Clock()
        cloud, calls = make_cloud(clock=clock)
        for op in ("DescribeInstanceTypes", "DescribeSpotPriceHistory", "DescribeSubnets"):
            calls.watch(op)
        await cloud.refresh()
        await cloud.refresh()
        assert calls.sent == {
            "DescribeInstanceTypes": 1,
            "DescribeSpotPriceHistory": 1,
            "DescribeSubnets": 1,
        }
        clock.t += 61  # subnets and security groups: 1 min
        await cloud.refresh()
        assert calls.sent["DescribeSubnets"] == 2
        assert calls.sent["DescribeInstanceTypes"] == 1
        clock.t += 300  # instance types and offerings: 5 min
        await cloud.refresh()
        assert calls.sent["DescribeInstanceTypes"] == 2
        assert calls.sent["DescribeSpotPriceHistory"] == 1  # prices: 12 h
        clock.t += 12 * 3600
        await cloud.refresh()
        assert calls.sent["DescribeSpotPriceHistory"] == 2

    run(main())


def test_a_failed_refresh_keeps_serving_the_last_data(make_cloud: MakeCloud) -> None:
    async def main() -> None:
        cloud, calls = make_cloud()
        await cloud.refresh()
        before = cloud.offerings()
        calls.answer("DescribeInstanceTypeOfferings", *[ec2_error("UnauthorizedOperation")] * 2)
        await cloud.refresh(force=True)
        assert cloud.offerings() == before

    run(main())


def test_ports_before_the_first_refresh_say_so(make_cloud: MakeCloud) -> None:
    async def main() -> None:
        cloud, _ = make_cloud()
        with pytest.raises(RuntimeError, match="refresh"):
            cloud.offerings()

    run(main())


# --- launch ----------------------------------------------------------------------------------


def test_launch_creates_a_tagged_instance_from_a_launch_template(
    make_cloud: MakeCloud, client: Callable[..., Any], cluster: str
) -> None:
    async def main() -> Instance:
        cloud, calls = make_cloud()
        calls.watch("CreateFleet")
        await cloud.refresh()
        instance = await cloud.launch(request(cloud))
        again = await cloud.launch(request(cloud, claim="claim-2"))
        assert cloud.launch_templates.created == 1  # reused for the same NodePool and AMI
        assert again.id != instance.id
        sent = calls.params["CreateFleet"][0]
        assert sent["Type"] == "instant"
        assert sent["SpotOptions"] == {"AllocationStrategy": "price-capacity-optimized"}
        assert sent["TargetCapacitySpecification"] == {
            "TotalTargetCapacity": 1,
            "DefaultTargetCapacityType": "spot",
        }
        overrides = sent["LaunchTemplateConfigs"][0]["Overrides"]
        assert len(overrides) == 6  # 2 types x one subnet in each of 3 zones
        return instance

    instance = run(main())
    assert instance.capacity_type == "spot"
    assert instance.instance_type in {"m5.large", "c5.large"}
    assert instance.zone in ZONES
    assert instance.provider_id == f"aws:///{instance.zone}/{instance.id}"
    assert instance.private_dns.endswith(".internal")
    assert instance.price == pytest.approx(0.00001)
    raw = describe_raw(client, instance.id)
    tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
    assert tags[f"kubernetes.io/cluster/{cluster}"] == "owned"
    assert tags["karpenter.sh/nodepool"] == "default"
    assert tags["karpenter.sh/nodeclaim"] == "claim-1"
    assert instance.tags == tags
    assert raw["InstanceLifecycle"] == "spot"
    assert raw["ImageId"] == AMIS[("x86_64", "standard")]
    templates = client("ec2").describe_launch_templates(
        Filters=[{"Name": f"tag:kubernetes.io/cluster/{cluster}", "Values": ["owned"]}]
    )["LaunchTemplates"]
    assert len(templates) == 1


def test_on_demand_launch_uses_lowest_price(make_cloud: MakeCloud, client: Any) -> None:
    async def main() -> Instance:
        cloud, calls = make_cloud()
        calls.watch("CreateFleet")
        await cloud.refresh()
        instance = await cloud.launch(request(cloud, capacity_type="on-demand"))
        sent = calls.params["CreateFleet"][0]
        assert sent["OnDemandOptions"] == {"AllocationStrategy": "lowest-price"}
        assert "SpotOptions" not in sent
        return instance

    instance = run(main())
    assert instance.capacity_type == "on-demand"
    assert instance.price == load_catalog().get(instance.instance_type).od_price
    assert "InstanceLifecycle" not in describe_raw(client, instance.id)


def test_types_needing_other_amis_get_their_own_launch_template(make_cloud: MakeCloud) -> None:
    async def main() -> None:
        cloud, calls = make_cloud()
        calls.watch("CreateFleet")
        await cloud.refresh()
        types = ("m5.large", "m6g.large", "g4dn.xlarge")
        await cloud.launch(request(cloud, capacity_type="on-demand", types=types))
        configs = calls.params["CreateFleet"][0]["LaunchTemplateConfigs"]
        assert len(configs) == 3
        by_type = {
            config["Overrides"][0]["InstanceType"]: {o["InstanceType"] for o in config["Overrides"]}
            for config in configs
        }
        assert by_type == {t: {t} for t in types}
        assert cloud.launch_templates.created == 3

    run(main())


def test_overrides_are_capped(make_cloud: MakeCloud) -> None:
    async def main() -> None:
        cloud, calls = make_cloud(max_overrides=4)
        calls.watch("CreateFleet")
        await cloud.refresh()
        req = request(cloud, types=("m5.large", "c5.large", "m5.xlarge"))
        assert len(req.offerings) == 9
        await cloud.launch(req)
        overrides = calls.params["CreateFleet"][0]["LaunchTemplateConfigs"][0]["Overrides"]
        expected = [(o.instance_type, o.zone) for o in req.offerings[:4]]
        subnets = {o["SubnetId"] for o in overrides}
        assert len(overrides) == 4 and len(subnets) <= 3
        assert [o["InstanceType"] for o in overrides] == [t for t, _ in expected]

    run(main())


def test_invalid_requests_are_refused_like_the_simulated_market(make_cloud: MakeCloud) -> None:
    async def main() -> None:
        cloud, _ = make_cloud()
        await cloud.refresh()
        with pytest.raises(ValueError, match="no offerings"):
            await cloud.launch(LaunchRequest("c", "default", "spot", ()))
        mixed = (Offering("m5.large", ZONES[0], "on-demand", 0.096),)
        with pytest.raises(ValueError, match="lists a on-demand offering"):
            await cloud.launch(LaunchRequest("c", "default", "spot", mixed))

    run(main())


# --- errors ----------------------------------------------------------------------------------


def test_capacity_errors_for_overrides_list_each_failed_offering(
    make_cloud: MakeCloud, network: dict[str, Any]
) -> None:
    subnets = network["subnets"]

    async def main() -> InsufficientCapacityError:
        cloud, calls = make_cloud()
        await cloud.refresh()
        req = request(cloud, types=("m5.large", "c5.large"), zones=ZONES[:2])
        calls.answer(
            "CreateFleet",
            fleet_errors(
                [
                    ("m5.large", subnets[ZONES[0]], "InsufficientInstanceCapacity", "no m5"),
                    ("m5.large", subnets[ZONES[1]], "UnfulfillableCapacity", "no"),
                    ("c5.large", subnets[ZONES[0]], "InsufficientFreeAddressesInSubnet", "ips"),
                    ("c5.large", subnets[ZONES[1]], "Unsupported", "not here"),
                ]
            ),
        )
        with pytest.raises(InsufficientCapacityError) as caught:
            await cloud.launch(req)
        return caught.value

    error = run(main())
    failed = {(e.offering.instance_type, e.offering.zone): e.code for e in error.errors}
    assert failed == {
        ("m5.large", ZONES[0]): "InsufficientInstanceCapacity",
        ("m5.large", ZONES[1]): "UnfulfillableCapacity",
        ("c5.large", ZONES[0]): "InsufficientFreeAddressesInSubnet",
        ("c5.large", ZONES[1]): "Unsupported",
    }
    assert all(e.offering.capacity_type == "spot" for e in error.errors)


@pytest.mark.parametrize(
    ("code", "capacity_type", "closed"),
    [
        ("MaxSpotInstanceCountExceeded", "spot", "spot"),
        ("VcpuLimitExceeded", "on-demand", "on-demand"),
        ("VcpuLimitExceeded", "spot", "spot"),
        ("AuthFailure.ServiceLinkedRoleCreationNotPermitted", "spot", "spot"),
    ],
)
def test_quota_errors_close_the_capacity_type(
    make_cloud: MakeCloud, network: dict[str, Any], code: str, capacity_type: str, closed: str
) -> None:
    subnet = network["subnets"][ZONES[0]]

    async def main() -> None:
        cloud, calls = make_cloud()
        await cloud.refresh()
        req = request(cloud, capacity_type=capacity_type)
        # In the fleet's error list, mixed with an ordinary capacity error...
        calls.answer(
            "CreateFleet",
            fleet_errors(
                [
                    ("m5.large", subnet, "InsufficientInstanceCapacity", "no"),
                    ("c5.large", subnet, code, "limit"),
                ],
                lifecycle=capacity_type,
            ),
        )
        with pytest.raises(QuotaExceededError) as caught:
            await cloud.launch(req)
        assert (caught.value.code, caught.value.capacity_type) == (code, closed)
        # ...and as the call's own error.
        calls.answer("CreateFleet", ec2_error(code, "limit"))
        with pytest.raises(QuotaExceededError) as caught:
            await cloud.launch(req)
        assert (caught.value.code, caught.value.capacity_type) == (code, closed)

    run(main())


def test_other_errors_are_plain_cloud_errors(make_cloud: MakeCloud) -> None:
    async def main() -> None:
        cloud, calls = make_cloud()
        await cloud.refresh()
        calls.answer("CreateFleet", ec2_error("InvalidParameterValue", "bad"))
        with pytest.raises(CloudError) as caught:
            await cloud.launch(request(cloud))
        assert type(caught.value) is CloudError
        assert caught.value.code == "InvalidParameterValue"
        assert calls.sent["CreateFleet"] == 1  # not retried

    run(main())


def test_throttling_and_5xx_are_retried_until_the_launch_succeeds(make_cloud: MakeCloud) -> None:
    async def main() -> Instance:
        cloud, calls = make_cloud()
        await cloud.refresh()
        calls.answer(
            "CreateFleet",
            ec2_error("RequestLimitExceeded", "Request limit exceeded.", status=503),
            ec2_error("InternalError", "oops", status=500),
            ec2_error("Throttling", "Rate exceeded", status=400),
            None,  # then moto answers
        )
        instance = await cloud.launch(request(cloud))
        assert calls.sent["CreateFleet"] == 4
        tokens = {p["ClientToken"] for p in calls.params["CreateFleet"]}
        assert len(tokens) == 1  # the retries are the same idempotent request
        return instance

    assert run(main()).id.startswith("i-")


def test_throttling_that_never_ends_fails_with_its_code(make_cloud: MakeCloud) -> None:
    async def main() -> None:
        cloud, calls = make_cloud()
        await cloud.refresh()
        calls.answer("CreateFleet", *[ec2_error("RequestLimitExceeded", status=503)] * 4)
        with pytest.raises(CloudError) as caught:
            await cloud.launch(request(cloud))
        assert caught.value.code == "RequestLimitExceeded"
        assert calls.sent["CreateFleet"] == 4

    run(main())


# --- merging ---------------------------------------------------------------------------------


def test_identical_concurrent_launches_share_one_create_fleet(
    make_cloud: MakeCloud, client: Callable[..., Any]
) -> None:
    async def main() -> list[Instance]:
        cloud, calls = make_cloud()
        calls.watch("CreateFleet")
        await cloud.refresh()
        same = [request(cloud, claim=f"claim-{i}") for i in range(4)]
        other = request(cloud, claim="claim-x", nodepool="other")
        instances = await asyncio.gather(*(cloud.launch(r) for r in [*same, other]))
        assert calls.sent["CreateFleet"] == 2
        capacities = sorted(
            p["TargetCapacitySpecification"]["TotalTargetCapacity"]
            for p in calls.params["CreateFleet"]
        )
        assert capacities == [1, 4]
        return list(instances)

    instances = run(main())
    assert len({i.id for i in instances}) == 5
    for index, instance in enumerate(instances[:4]):
        tags = {t["Key"]: t["Value"] for t in describe_raw(client, instance.id)["Tags"]}
        assert tags["karpenter.sh/nodeclaim"] == f"claim-{index}"
        assert instance.tags["karpenter.sh/nodeclaim"] == f"claim-{index}"
    assert instances[4].tags["karpenter.sh/nodepool"] == "other"


def test_a_merged_launch_that_fails_fails_every_request(
    make_cloud: MakeCloud, network: dict[str, Any]
) -> None:
    subnet = network["subnets"][ZONES[0]]

    async def main() -> None:
        cloud, calls = make_cloud()
        await cloud.refresh()
        calls.answer(
            "CreateFleet",
            fleet_errors([("m5.large", subnet, "InsufficientInstanceCapacity", "none")]),
        )
        results = await asyncio.gather(
            *(cloud.launch(request(cloud, claim=f"c{i}", types=("m5.large",))) for i in range(3)),
            return_exceptions=True,
        )
        assert calls.sent["CreateFleet"] == 1
        assert all(isinstance(r, InsufficientCapacityError) for r in results)
        assert len({id(r) for r in results}) == 3  # one exception object per caller

    run(main())


# --- terminate, describe, list ------------------------------------------------------------------


def test_terminate_and_describe(make_cloud: MakeCloud) -> None:
    async def main() -> None:
        cloud, calls = make_cloud()
        calls.watch("TerminateInstances")
        await cloud.refresh()
        a, b, c = await asyncio.gather(
            *(
                cloud.launch(request(cloud, claim=f"t{i}", capacity_type="on-demand"))
                for i in range(3)
            )
        )
        described = await cloud.describe([b.id, "i-0123456789abcdef0", a.id])
        assert [i.id for i in described] == [b.id, a.id]
        assert {i.state for i in described} <= {"pending", "running"}
        assert described[1].private_dns == a.private_dns
        assert described[1].provider_id == a.provider_id
        assert described[1].capacity_type == "on-demand"
        # Concurrent terminations are merged; an unknown id fails alone.
        results = await asyncio.gather(
            cloud.terminate(a.id),
            cloud.terminate(b.id),
            cloud.terminate("i-0123456789abcdef0"),
            return_exceptions=True,
        )
        assert results[:2] == [None, None]
        assert isinstance(results[2], CloudError)
        assert results[2].code == "InvalidInstanceID.NotFound"
        states = {i.id: i.state for i in await cloud.describe([a.id, b.id, c.id])}
        assert states[a.id] in {"shutting-down", "terminated"}
        assert states[b.id] in {"shutting-down", "terminated"}
        assert states[c.id] in {"pending", "running"}
        await cloud.terminate(a.id)  # idempotent
        assert await cloud.describe([]) == []

    run(main())


def test_list_owned_finds_only_this_clusters_tagged_instances(
    make_cloud: MakeCloud, client: Callable[..., Any], cluster: str
) -> None:
    ec2 = client("ec2")
    image = AMIS[("x86_64", "standard")]
    stranger = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, InstanceType="m5.large")
    other_cluster = ec2.run_instances(
        ImageId=image,
        MinCount=1,
        MaxCount=1,
        InstanceType="m5.large",
        TagSpecifications=[
            {
                "ResourceType": "instance",
                "Tags": [
                    {"Key": "kubernetes.io/cluster/someone-else", "Value": "owned"},
                    {"Key": "karpenter.sh/nodepool", "Value": "default"},
                ],
            }
        ],
    )
    foreign = {
        stranger["Instances"][0]["InstanceId"],
        other_cluster["Instances"][0]["InstanceId"],
    }

    async def main() -> None:
        cloud, _ = make_cloud()
        await cloud.refresh()
        mine = await asyncio.gather(
            *(
                cloud.launch(request(cloud, claim=f"o{i}", capacity_type="on-demand"))
                for i in range(2)
            )
        )
        owned = await cloud.list_owned()
        assert {i.id for i in owned} == {i.id for i in mine}
        assert not foreign & {i.id for i in owned}
        assert all(i.launched_at > 1_600_000_000 for i in owned)
        await cloud.terminate(mine[0].id)
        assert [i.id for i in await cloud.list_owned()] == [mine[1].id]

    run(main())


def test_a_missing_network_is_a_clear_cloud_error(
    make_cloud: MakeCloud,
) -> None:
    from spotwright.adapters.aws import SelectorTerm

    async def main() -> None:
        cloud, _ = make_cloud(
            security_group_selector=(SelectorTerm(tags={"no-such-tag": "x"}),),
        )
        await cloud.refresh()
        with pytest.raises(CloudError) as caught:
            await cloud.launch(request(cloud))
        assert caught.value.code == "SecurityGroupsNotFound"

    run(main())


def test_region_is_the_clients(make_cloud: MakeCloud) -> None:
    async def main() -> None:
        cloud, _ = make_cloud()
        assert cloud.region == REGION

    run(main())
