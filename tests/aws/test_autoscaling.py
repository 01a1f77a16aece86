"""Auto Scaling lifecycle actions over real boto3 and HTTP, with moto's server.

moto 5.2.5 keeps Auto Scaling groups, their instances and their lifecycle hooks, but does
not implement ``RecordLifecycleActionHeartbeat`` or ``CompleteLifecycleAction``: it answers
both with an HTTP 500 "not implemented" page (``test_moto_does_not_implement_...`` below
pins that down). Everything else is moto's: the group, its instance, the hook, EC2's
DescribeInstances, SQS, and EventBridge delivering the lifecycle event into the queue. The
two missing answers are injected at the botocore layer (see conftest.py), after botocore has
serialized and signed the request, so the tests still see the exact request that would go
to Auto Scaling, parameters and all, and the adapter parses a real-format answer.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs
from xml.sax.saxutils import escape

import pytest
from awsfakes import REGION, Injector, http_response, run

from spotwright.adapters.aws import RetryPolicy, SqsQueue
from spotwright.adapters.aws.autoscaling import AwsAutoScaling
from spotwright.adapters.memory_cluster import MemoryCluster
from spotwright.controllers import Context, InterruptionHandler
from spotwright.events import LifecycleHook
from spotwright.model import labels as wk
from spotwright.model.objects import Deployment, Node, Pod
from spotwright.model.resources import Resources
from spotwright.observability.metrics import Metrics
from spotwright.ports.autoscaling import LifecycleActionGone
from spotwright.ports.clock import LoopClock
from spotwright.ports.cloud import CloudError
from spotwright.ports.cluster import ClusterError

_NS = "http://autoscaling.amazonaws.com/doc/2011-01-01/"
FAST = RetryPolicy(attempts=3, base_seconds=0.01, cap_seconds=0.02)


def asg_ok(operation: str) -> Any:
    """Auto Scaling's (query protocol) answer to a call that returns nothing."""
    return http_response(
        200,
        f'<{operation}Response xmlns="{_NS}"><{operation}Result/>'
        f"<ResponseMetadata><RequestId>injected</RequestId></ResponseMetadata>"
        f"</{operation}Response>",
    )


def asg_error(code: str, message: str, status: int = 400) -> Any:
    return http_response(
        status,
        f'<ErrorResponse xmlns="{_NS}"><Error><Type>Sender</Type>'
        f"<Code>{escape(code)}</Code><Message>{escape(message)}</Message></Error>"
        "<RequestId>injected</RequestId></ErrorResponse>",
    )


class Wire:
    """The form-encoded bodies of the requests one or more clients send, in order."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, str]]] = []

    def tap(self, client: Any, *operations: str) -> Wire:
        # Registered before any Injector answer, so it sees every request first.
        service = client.meta.service_model.service_name
        for operation in operations:
            client.meta.events.register(
                f"before-send.{service}.{operation}", self._recorder(operation)
            )
        return self

    def _recorder(self, operation: str) -> Callable[..., None]:
        def record(request: Any, **_kwargs: Any) -> None:
            body = request.body.decode() if isinstance(request.body, bytes) else request.body
            if body and "=" in body:
                fields = {k: v[0] for k, v in parse_qs(body).items()}
            else:  # the JSON protocol (SQS)
                fields = {k: str(v) for k, v in json.loads(body or "{}").items()}
            fields["Authorization"] = str(request.headers.get("Authorization", ""))
            self.sent.append((operation, fields))

        return record

    def of(self, operation: str) -> list[dict[str, str]]:
        return [fields for name, fields in self.sent if name == operation]


@pytest.fixture
def group(client: Callable[..., Any], cluster: str) -> dict[str, str]:
    """An Auto Scaling group of the cluster with one instance and a terminate hook."""
    ec2 = client("ec2")
    autoscaling = client("autoscaling")
    name = f"{cluster}-workers"
    template = ec2.create_launch_template(
        LaunchTemplateName=f"{cluster}-lt",
        LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "m5.large"},
    )["LaunchTemplate"]["LaunchTemplateId"]
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateId": template},
        MinSize=0,
        MaxSize=2,
        DesiredCapacity=1,
        AvailabilityZones=[f"{REGION}a"],
        Tags=[
            {
                "Key": f"kubernetes.io/cluster/{cluster}",
                "Value": "owned",
                "PropagateAtLaunch": True,
            }
        ],
    )
    autoscaling.put_lifecycle_hook(
        AutoScalingGroupName=name,
        LifecycleHookName="spotwright-drain",
        LifecycleTransition="autoscaling:EC2_INSTANCE_TERMINATING",
        HeartbeatTimeout=300,
        DefaultResult="ABANDON",
    )
    [instance] = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])[
        "AutoScalingGroups"
    ][0]["Instances"]
    described = ec2.describe_instances(InstanceIds=[instance["InstanceId"]])
    row = described["Reservations"][0]["Instances"][0]
    return {
        "name": name,
        "hook": "spotwright-drain",
        "instance_id": instance["InstanceId"],
        "private_dns": row["PrivateDnsName"],
        "zone": row["Placement"]["AvailabilityZone"],
    }


def hook_for(group: dict[str, str]) -> LifecycleHook:
    return LifecycleHook(
        asg_name=group["name"],
        hook_name=group["hook"],
        token=str(uuid.uuid4()),
        transition="autoscaling:EC2_INSTANCE_TERMINATING",
    )


def test_moto_does_not_implement_the_lifecycle_action_calls(
    client: Callable[..., Any], group: dict[str, str]
) -> None:
    """Why the answers are injected. Should moto implement them, drop the injection."""
    hooks = client("autoscaling").describe_lifecycle_hooks(AutoScalingGroupName=group["name"])
    assert [h["LifecycleHookName"] for h in hooks["LifecycleHooks"]] == ["spotwright-drain"]

    async def main() -> None:
        adapter = AwsAutoScaling(client=client("autoscaling"), retry=FAST)
        # An HTML error page, which botocore fails to parse (ResponseParserError).
        with pytest.raises(Exception, match="500 Internal Server Error"):
            await adapter.complete(hook_for(group), "CONTINUE")

    run(main())


def test_heartbeat_and_complete_send_the_hook_and_the_result(
    client: Callable[..., Any], group: dict[str, str]
) -> None:
    autoscaling = client("autoscaling")
    wire = Wire().tap(autoscaling, "RecordLifecycleActionHeartbeat", "CompleteLifecycleAction")
    Injector(autoscaling).answer(
        "RecordLifecycleActionHeartbeat", asg_ok("RecordLifecycleActionHeartbeat")
    ).answer("CompleteLifecycleAction", asg_ok("CompleteLifecycleAction"))
    hook = hook_for(group)

    async def main() -> None:
        adapter = AwsAutoScaling(client=autoscaling, retry=FAST)
        await adapter.heartbeat(hook)
        await adapter.complete(hook, "CONTINUE")
        with pytest.raises(ValueError, match="CONTINUE or ABANDON"):
            await adapter.complete(hook, "DEFAULT")  # type: ignore[arg-type]

    run(main())
    [beat] = wire.of("RecordLifecycleActionHeartbeat")
    [done] = wire.of("CompleteLifecycleAction")
    common = {
        "Version": "2011-01-01",
        "AutoScalingGroupName": group["name"],
        "LifecycleHookName": "spotwright-drain",
        "LifecycleActionToken": hook.token,
    }
    assert {k: beat[k] for k in (*common, "Action")} == {
        **common,
        "Action": "RecordLifecycleActionHeartbeat",
    }
    assert {k: done[k] for k in (*common, "Action", "LifecycleActionResult")} == {
        **common,
        "Action": "CompleteLifecycleAction",
        "LifecycleActionResult": "CONTINUE",
    }
    assert "InstanceId" not in done  # the token alone names the action
    # Signed for Auto Scaling in the region, like any boto3 call.
    assert f"/{REGION}/autoscaling/aws4_request" in done["Authorization"]


def test_answers_are_classified_and_throttling_is_retried(
    client: Callable[..., Any], group: dict[str, str]
) -> None:
    autoscaling = client("autoscaling")
    injector = Injector(autoscaling).answer(
        "CompleteLifecycleAction",
        asg_error("Throttling", "Rate exceeded"),
        asg_ok("CompleteLifecycleAction"),
        asg_error("ValidationError", "No active Lifecycle Action found with token 1234"),
        asg_error("ValidationError", "AutoScalingGroup name not found - no such group"),
    )
    injector.answer(
        "RecordLifecycleActionHeartbeat",
        asg_error("ValidationError", "No active Lifecycle Action found with token 1234"),
    )
    hook = hook_for(group)

    async def main() -> None:
        adapter = AwsAutoScaling(client=autoscaling, retry=FAST)
        await adapter.complete(hook, "ABANDON")  # throttled once, then accepted
        with pytest.raises(LifecycleActionGone) as gone:
            await adapter.complete(hook, "CONTINUE")
        assert gone.value.hook == hook and gone.value.code == "ValidationError"
        with pytest.raises(CloudError) as other:
            await adapter.complete(hook, "CONTINUE")
        assert not isinstance(other.value, LifecycleActionGone)
        with pytest.raises(LifecycleActionGone):
            await adapter.heartbeat(hook)

    run(main())
    assert injector.sent["CompleteLifecycleAction"] == 4
    assert injector.params["CompleteLifecycleAction"][0]["LifecycleActionResult"] == "ABANDON"


def test_the_adapter_needs_a_region_or_a_client(aws_env: None) -> None:
    with pytest.raises(ValueError, match="region"):
        AwsAutoScaling()
    adapter = AwsAutoScaling(region="eu-west-1")
    assert adapter._asg.client.meta.region_name == "eu-west-1"


# --- queue mode, end to end ----------------------------------------------------------------


def _lifecycle_detail(group: dict[str, str], token: str) -> dict[str, str]:
    return {
        "LifecycleActionToken": token,
        "AutoScalingGroupName": group["name"],
        "LifecycleHookName": group["hook"],
        "EC2InstanceId": group["instance_id"],
        "LifecycleTransition": "autoscaling:EC2_INSTANCE_TERMINATING",
        "Origin": "AutoScalingGroup",
        "Destination": "EC2",
    }


@pytest.fixture
def interruption_queue(client: Callable[..., Any], cluster: str) -> str:
    """A queue that an EventBridge rule feeds with the group's terminate lifecycle events."""
    sqs = client("sqs")
    url = str(sqs.create_queue(QueueName=f"{cluster}-interruptions")["QueueUrl"])
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    events = client("events")
    events.put_rule(
        Name=f"{cluster}-asg-terminate",
        EventPattern=json.dumps(
            {
                "source": ["aws.autoscaling"],
                "detail-type": ["EC2 Instance-terminate Lifecycle Action"],
            }
        ),
    )
    events.put_targets(Rule=f"{cluster}-asg-terminate", Targets=[{"Id": "queue", "Arn": arn}])
    return url


async def _cluster_with_asg_node(group: dict[str, str]) -> tuple[MemoryCluster, LoopClock]:
    """The group's instance as a node named by its private DNS name, without providerID,
    running two pods; and a second node for them to move to."""
    clock = LoopClock()
    cluster = MemoryCluster(clock)
    size = Resources.from_k8s({"cpu": "2", "memory": "8Gi", "pods": 110})
    name = group["private_dns"]
    cluster.register_node(Node(name=name, labels={wk.HOSTNAME: name}, allocatable=size, ready=True))
    template = Pod(name="", labels={"app": "web"}, grace_seconds=0)
    cluster.apply_deployment(Deployment(name="web", replicas=2, template=template))
    for _ in range(50):
        await asyncio.sleep(0.01)
        if len([p for p in cluster.pods_on(name) if p.ready]) == 2:
            break
    assert len(cluster.pods_on(name)) == 2
    cluster.register_node(Node(name="spare", allocatable=size, ready=True))
    return cluster, clock


def test_queue_mode_drains_the_node_then_completes_the_hook_then_deletes_the_message(
    client: Callable[..., Any],
    make_cloud: Callable[..., Any],
    group: dict[str, str],
    interruption_queue: str,
) -> None:
    token = str(uuid.uuid4())
    answer = client("events").put_events(
        Entries=[
            {
                "Source": "aws.autoscaling",
                "DetailType": "EC2 Instance-terminate Lifecycle Action",
                "Detail": json.dumps(_lifecycle_detail(group, token)),
                "Resources": [f"arn:aws:autoscaling:{REGION}:123456789012:autoScalingGroup"],
                "Time": datetime.now(tz=UTC),
            }
        ]
    )
    assert answer["FailedEntryCount"] == 0
    # And the group's own test message, sent to the queue when a hook is pointed at it.
    client("sqs").send_message(
        QueueUrl=interruption_queue,
        MessageBody=json.dumps(
            {
                "AccountId": "123456789012",
                "RequestId": str(uuid.uuid4()),
                "AutoScalingGroupName": group["name"],
                "Service": "AWS Auto Scaling",
                "Event": "autoscaling:TEST_NOTIFICATION",
                "Time": datetime.now(tz=UTC).isoformat().replace("+00:00", "Z"),
            }
        ),
    )
    sqs = client("sqs")
    autoscaling = client("autoscaling")
    wire = Wire()
    wire.tap(autoscaling, "RecordLifecycleActionHeartbeat", "CompleteLifecycleAction")
    wire.tap(sqs, "DeleteMessage", "ChangeMessageVisibility")
    Injector(autoscaling).answer("CompleteLifecycleAction", asg_ok("CompleteLifecycleAction"))

    async def main() -> tuple[MemoryCluster, str]:
        cluster, clock = await _cluster_with_asg_node(group)
        cloud, _ = make_cloud(clock=clock)
        ctx = Context(
            cluster=cluster,
            cloud=cloud,
            clock=clock,
            metrics=Metrics(),
            nodepools=[],
            instance_types={},
        )
        queue = SqsQueue(interruption_queue, client=sqs, retry=FAST)
        handler = InterruptionHandler(ctx, queue, AwsAutoScaling(client=autoscaling, retry=FAST))
        handled: list[str] = []
        receipt = ""
        for _ in range(5):
            for message in await queue.receive(wait_seconds=1):
                if token in message.body:
                    receipt = message.receipt
                await handler.handle(message)
                handled.append(message.id)
            if len(handled) == 2:
                break
        assert len(handled) == 2 and receipt
        assert await queue.receive(wait_seconds=0) == []
        return cluster, receipt

    cluster, receipt = run(main())
    # Found by its private DNS name (the node has no providerID): DescribeInstances on moto.
    node = cluster.node(group["private_dns"])
    assert node is not None and node.unschedulable
    assert any(t.key == wk.DISRUPTED_TAINT_KEY for t in node.taints)
    assert cluster.pods_on(node.name) == []
    [done] = wire.of("CompleteLifecycleAction")
    assert done["LifecycleActionToken"] == token
    assert done["AutoScalingGroupName"] == group["name"]
    assert done["LifecycleHookName"] == group["hook"]
    assert done["LifecycleActionResult"] == "CONTINUE"
    # Both messages deleted, none released; the hook's only after its completion.
    order = [(name, fields.get("ReceiptHandle") == receipt) for name, fields in wire.sent]
    assert [name for name, _ in order].count("DeleteMessage") == 2
    assert all(name != "ChangeMessageVisibility" for name, _ in order)
    assert order.index(("CompleteLifecycleAction", False)) < order.index(("DeleteMessage", True))


def test_queue_mode_abandons_the_hook_when_the_drain_fails(
    client: Callable[..., Any],
    make_cloud: Callable[..., Any],
    group: dict[str, str],
    interruption_queue: str,
) -> None:
    token = str(uuid.uuid4())
    client("sqs").send_message(  # as the group sends it to its notification target
        QueueUrl=interruption_queue,
        MessageBody=json.dumps(
            {
                **_lifecycle_detail(group, token),
                "AccountId": "123456789012",
                "RequestId": str(uuid.uuid4()),
                "Service": "AWS Auto Scaling",
                "Time": datetime.now(tz=UTC).isoformat().replace("+00:00", "Z"),
            }
        ),
    )
    autoscaling = client("autoscaling")
    wire = Wire().tap(autoscaling, "CompleteLifecycleAction")
    Injector(autoscaling).answer("CompleteLifecycleAction", asg_ok("CompleteLifecycleAction"))

    async def main() -> None:
        cluster, clock = await _cluster_with_asg_node(group)

        async def refused(*_args: Any, **_kwargs: Any) -> None:
            raise ClusterError("eviction refused by an admission webhook")

        cluster.evict = refused  # type: ignore[method-assign]
        cloud, _ = make_cloud(clock=clock)
        ctx = Context(cluster, cloud, clock, Metrics(), [], {})
        queue = SqsQueue(interruption_queue, client=client("sqs"), retry=FAST)
        handler = InterruptionHandler(ctx, queue, AwsAutoScaling(client=autoscaling, retry=FAST))
        [message] = await queue.receive(wait_seconds=1)
        await handler.handle(message)
        assert await queue.receive(wait_seconds=0) == []

    run(main())
    [done] = wire.of("CompleteLifecycleAction")
    assert (done["LifecycleActionToken"], done["LifecycleActionResult"]) == (token, "ABANDON")
