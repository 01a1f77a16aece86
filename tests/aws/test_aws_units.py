"""The AWS adapters' pure parts: error classification, batching, rate limiting, prices."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest
from awsfakes import run

from spotwright.adapters.aws._api import RetryPolicy, TokenBucket
from spotwright.adapters.aws._batch import Batcher
from spotwright.adapters.aws.errors import classify_call_error, classify_fleet_errors
from spotwright.adapters.aws.fleet import (
    FleetPlan,
    Override,
    fleet_request,
    launched_instances,
    merge_key,
    request_tags,
    shared_tags,
)
from spotwright.adapters.aws.pricing import latest_spot_prices, parse_price_list
from spotwright.ports.cloud import (
    CloudError,
    InsufficientCapacityError,
    LaunchRequest,
    Offering,
    QuotaExceededError,
)

A = Offering("m5.large", "z-a", "spot", 0.03)
B = Offering("m5.large", "z-b", "spot", 0.03)
C = Offering("c5.large", "z-a", "spot", 0.02)
SUBNETS = {"subnet-a": "z-a", "subnet-b": "z-b"}


def fleet_error(
    code: str, itype: str | None = None, subnet: str | None = None
) -> dict[str, object]:
    item: dict[str, object] = {"ErrorCode": code, "ErrorMessage": f"{code}!"}
    if itype:
        overrides = {"InstanceType": itype}
        if subnet:
            overrides["SubnetId"] = subnet
        item["LaunchTemplateAndOverrides"] = {"Overrides": overrides}
    return item


def classify(*items: dict[str, object], capacity_type: str = "spot") -> CloudError:
    return classify_fleet_errors(
        items, capacity_type=capacity_type, offerings=(A, B, C), zone_of_subnet=SUBNETS
    )


class TestClassification:
    def test_offering_codes_name_their_override(self) -> None:
        error = classify(
            fleet_error("InsufficientInstanceCapacity", "m5.large", "subnet-b"),
            fleet_error("Unsupported", "c5.large", "subnet-a"),
        )
        assert isinstance(error, InsufficientCapacityError)
        assert {(e.offering, e.code) for e in error.errors} == {
            (B, "InsufficientInstanceCapacity"),
            (C, "Unsupported"),
        }

    def test_an_error_without_a_subnet_covers_the_type_and_without_a_type_everything(
        self,
    ) -> None:
        error = classify(fleet_error("InsufficientInstanceCapacity", "m5.large"))
        assert isinstance(error, InsufficientCapacityError)
        assert {e.offering for e in error.errors} == {A, B}
        error = classify(fleet_error("UnfulfillableCapacity"))
        assert {e.offering for e in error.errors} == {A, B, C}  # type: ignore[attr-defined]

    def test_no_errors_and_no_instances_is_unfulfillable_everywhere(self) -> None:
        error = classify()
        assert isinstance(error, InsufficientCapacityError)
        assert {e.code for e in error.errors} == {"UnfulfillableCapacity"}
        assert len(error.errors) == 3

    def test_a_quota_code_wins_and_closes_its_capacity_type(self) -> None:
        error = classify(
            fleet_error("InsufficientInstanceCapacity", "m5.large", "subnet-a"),
            fleet_error("MaxSpotInstanceCountExceeded", "c5.large", "subnet-a"),
        )
        assert isinstance(error, QuotaExceededError)
        assert (error.code, error.capacity_type) == ("MaxSpotInstanceCountExceeded", "spot")
        error = classify(fleet_error("VcpuLimitExceeded"), capacity_type="on-demand")
        assert isinstance(error, QuotaExceededError) and error.capacity_type == "on-demand"
        error = classify(fleet_error("AuthFailure.ServiceLinkedRoleCreationNotPermitted"))
        assert isinstance(error, QuotaExceededError) and error.capacity_type == "spot"

    def test_any_other_code_is_a_plain_cloud_error(self) -> None:
        error = classify(
            fleet_error("InsufficientInstanceCapacity", "m5.large", "subnet-a"),
            fleet_error("InvalidLaunchTemplateId.NotFound"),
        )
        assert type(error) is CloudError
        assert error.code == "InvalidLaunchTemplateId.NotFound"

    def test_call_errors(self) -> None:
        quota = classify_call_error(
            CloudError("VcpuLimitExceeded", "x"), capacity_type="on-demand", offerings=(A,)
        )
        assert isinstance(quota, QuotaExceededError) and quota.capacity_type == "on-demand"
        ice = classify_call_error(
            CloudError("InsufficientInstanceCapacity", "x"), capacity_type="spot", offerings=(A, B)
        )
        assert isinstance(ice, InsufficientCapacityError) and len(ice.errors) == 2
        other = CloudError("UnauthorizedOperation", "x")
        same = classify_call_error(other, capacity_type="spot", offerings=(A,))
        assert type(same) is CloudError and same is not other
        assert (same.code, same.message) == ("UnauthorizedOperation", "x")


class TestFleet:
    def request(self, claim: str, nodepool: str = "default") -> LaunchRequest:
        return LaunchRequest(
            claim,
            nodepool,
            "spot",
            (A, C),
            (("karpenter.sh/nodeclaim", claim), ("team", "x")),
        )

    def test_merge_key_ignores_only_the_node_claim(self) -> None:
        assert merge_key(self.request("a")) == merge_key(self.request("b"))
        assert merge_key(self.request("a")) != merge_key(self.request("a", "gpu"))
        assert shared_tags([self.request("a"), self.request("b")]) == {
            "team": "x",
            "karpenter.sh/nodepool": "default",
        }
        assert shared_tags([self.request("a")])["karpenter.sh/nodeclaim"] == "a"
        # The claim and NodePool are tagged even when the request's tags omit them.
        bare = LaunchRequest("claim-9", "pool", "spot", (A,))
        assert request_tags(bare) == {
            "karpenter.sh/nodepool": "pool",
            "karpenter.sh/nodeclaim": "claim-9",
        }

    def test_request_and_answer(self) -> None:
        plan = FleetPlan(
            "spot",
            (("lt-1", (Override("m5.large", "subnet-a", "z-a"),)),),
        )
        params = fleet_request(plan, count=3, tags={"k": "v"}, client_token="tok")
        assert params["TargetCapacitySpecification"]["TotalTargetCapacity"] == 3
        assert {t["ResourceType"] for t in params["TagSpecifications"]} == {
            "instance",
            "volume",
            "fleet",
        }
        with pytest.raises(ValueError):
            fleet_request(plan, count=0, tags={}, client_token="t")
        answer = {
            "Instances": [
                {
                    "LaunchTemplateAndOverrides": {
                        "Overrides": {"InstanceType": "m5.large", "SubnetId": "subnet-b"}
                    },
                    "Lifecycle": "spot",
                    "InstanceIds": ["i-1", "i-2"],
                    "InstanceType": "m5.large",
                }
            ]
        }
        got = launched_instances(answer, capacity_type="spot", zone_of_subnet=SUBNETS)
        assert [(i.instance_id, i.zone, i.capacity_type) for i in got] == [
            ("i-1", "z-b", "spot"),
            ("i-2", "z-b", "spot"),
        ]


class FakeClock:
    """Virtual time: sleeping advances it; tasks still interleave on the real loop."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(0)
        self.t += max(0.0, seconds)
        await asyncio.sleep(0)


def test_token_bucket_spaces_calls_at_its_rate() -> None:
    async def main() -> None:
        clock = FakeClock()
        bucket = TokenBucket(clock, rate=2.0, burst=2)
        for _ in range(6):
            await bucket.acquire()
        # Two at once, then one every half second.
        assert clock.t == pytest.approx(2.0)

    run(main())
    with pytest.raises(ValueError):
        TokenBucket(FakeClock(), rate=0, burst=1)


def test_retry_delays_are_capped_and_jittered() -> None:
    policy = RetryPolicy(attempts=5, base_seconds=1.0, cap_seconds=3.0)
    rng = random.Random(1)
    delays = [policy.delay(n, rng) for n in range(1, 10)]
    assert all(0.0 <= d <= 3.0 for d in delays)
    assert len(set(delays)) == len(delays)


def test_batcher_merges_by_key_and_splits_results() -> None:
    async def main() -> None:
        batches: list[tuple[str, list[int]]] = []

        async def execute(key: str, items: Sequence[int]) -> list[int | BaseException]:
            batches.append((key, list(items)))
            return [ValueError(i) if i < 0 else i * 10 for i in items]

        batcher: Batcher[str, int, int] = Batcher(
            execute, clock=FakeClock(), idle=0.035, max_wait=1.0, max_items=3
        )
        results = await asyncio.gather(
            *(batcher.submit(key, i) for key, i in [("a", 1), ("a", 2), ("b", 3), ("a", -4)]),
            return_exceptions=True,
        )
        assert results[:3] == [10, 20, 30]
        assert isinstance(results[3], ValueError)
        assert sorted(batches) == [("a", [1, 2, -4]), ("b", [3])]
        # A full window (max_items) is sent without waiting for more.
        assert batcher.batches == 2

    run(main())


def test_batcher_spreads_a_failing_batch_to_every_caller() -> None:
    async def main() -> None:
        async def execute(key: str, items: Sequence[int]) -> list[int | BaseException]:
            raise CloudError("Boom", "down")

        batcher: Batcher[str, int, int] = Batcher(
            execute, clock=FakeClock(), idle=0.01, max_wait=0.1, max_items=10
        )
        results = await asyncio.gather(
            batcher.submit("k", 1), batcher.submit("k", 2), return_exceptions=True
        )
        assert all(isinstance(r, CloudError) for r in results)

    run(main())


def test_latest_spot_price_per_pool() -> None:
    old = datetime(2026, 1, 1, tzinfo=UTC)
    new = datetime(2026, 1, 2, tzinfo=UTC)
    rows = [
        {
            "InstanceType": "m5.large",
            "AvailabilityZone": "z-a",
            "SpotPrice": "0.05",
            "Timestamp": old,
        },
        {
            "InstanceType": "m5.large",
            "AvailabilityZone": "z-a",
            "SpotPrice": "0.04",
            "Timestamp": new,
        },
        {
            "InstanceType": "m5.large",
            "AvailabilityZone": "z-b",
            "SpotPrice": "0.06",
            "Timestamp": old,
        },
        {"InstanceType": "m5.large", "AvailabilityZone": "z-c", "SpotPrice": "bad"},
    ]
    assert latest_spot_prices(rows) == {("m5.large", "z-a"): 0.04, ("m5.large", "z-b"): 0.06}


def test_price_list_parsing() -> None:
    def product(name: str, usd: str, unit: str = "Hrs") -> str:
        return json.dumps(
            {
                "product": {"attributes": {"instanceType": name}},
                "terms": {
                    "OnDemand": {
                        "t": {
                            "priceDimensions": {"d": {"unit": unit, "pricePerUnit": {"USD": usd}}}
                        }
                    }
                },
            }
        )

    documents = [
        product("m5.large", "0.096"),
        product("m5.large", "0.0"),
        product("c5.large", "0.085"),
        product("c5.large", "12", unit="Quantity"),
        "not json",
    ]
    assert parse_price_list(documents) == {"m5.large": 0.096, "c5.large": 0.085}
