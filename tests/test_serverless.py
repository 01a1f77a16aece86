"""Serverless mode: the Lambda handler, its EKS token, and its deployment template.

The handler is called as Lambda calls it, ``handler(event, context)``, with EventBridge
events (direct, or in an SQS batch) built by the simulated market's own event builders or
taken from ``tests/data/events``. Its Kubernetes side is the in-memory cluster (passed
through the ``runtime`` seam instead of an API server), its Auto Scaling side the
in-memory recorder, its EC2 side the simulated market; time is the wall clock, and pods
stop at once so that nothing waits. The EKS token is made with credentials from moto's
STS and its signature checked by an independent SigV4 computation, the way STS checks it
when EKS forwards the token. One test (real-cluster tier) runs the live Kubernetes side
against a real kube-apiserver, as a user holding only the RBAC the docs prescribe.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import random
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import pytest
import yaml

from spotwright import serverless
from spotwright.adapters import _market_signals as signals
from spotwright.adapters.memory_cluster import MemoryCluster
from spotwright.adapters.sim_autoscaling import SimAutoScaling
from spotwright.adapters.sim_market import SimulatedMarket
from spotwright.catalog import load_catalog
from spotwright.events import SUPPORTED, parse_eventbridge
from spotwright.events._statechange import ACTIONABLE_STATES
from spotwright.events.actions import ActionPolicy
from spotwright.model import labels as wk
from spotwright.model.objects import Deployment, Node, Pod, PodDisruptionBudget
from spotwright.model.resources import Resources
from spotwright.ports.clock import LoopClock
from spotwright.ports.cluster import ClusterError
from spotwright.testing.cluster import TestCluster, availability, ensure_binaries

ROOT = Path(__file__).resolve().parents[1]
EVENTS = ROOT / "tests" / "data" / "events"
TEMPLATE = ROOT / "deploy" / "serverless" / "template.yaml"
REGION = "us-east-1"
INSTANCE = "i-0d4c3b2a1f0e98765"  # the instance of asg_terminate_lifecycle.json
NODE = "ip-10-0-17-42.ec2.internal"
LB_LABEL = "node.kubernetes.io/exclude-from-external-load-balancers"


@dataclass
class FakeContext:
    """What the handler reads of Lambda's context object."""

    remaining_ms: int = 300_000
    function_name: str = "spotwright-drainer"

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


def sim_market(clock: LoopClock) -> SimulatedMarket:
    """The EC2 of the tests: it knows none of their instances (no private DNS lookups)."""
    return SimulatedMarket(
        load_catalog().types[:5],
        region=REGION,
        zones=(f"{REGION}a",),
        clock=clock,
        rng=random.Random(1),
        interruptions="none",
        on_running=lambda _i: None,
        on_terminated=lambda _i, _r: None,
        publish=lambda _e: None,
    )


@dataclass
class Seam:
    """A runtime factory over an in-memory cluster; keeps what it built for assertions."""

    autoscaling: SimAutoScaling | None = field(default_factory=SimAutoScaling)
    policy: ActionPolicy = field(default_factory=ActionPolicy)
    pdb: bool = False
    cluster: MemoryCluster | None = None
    closed: bool = False

    async def __call__(self) -> serverless.Runtime:
        clock = LoopClock()
        cluster = MemoryCluster(clock)
        size = Resources.from_k8s({"cpu": "4", "memory": "16Gi", "pods": 110})
        cluster.register_node(
            Node(
                name=NODE,
                provider_id=f"aws:///{REGION}a/{INSTANCE}",
                labels={wk.HOSTNAME: NODE},
                allocatable=size,
                ready=True,
            )
        )
        template = Pod(name="", labels={"app": "web"}, grace_seconds=0)
        cluster.apply_deployment(Deployment(name="web", replicas=2, template=template))
        if self.pdb:
            cluster.apply_pdb(
                PodDisruptionBudget(name="web", selector={"app": "web"}, min_available=2)
            )
        for _ in range(100):
            await asyncio.sleep(0)
            if sum(p.ready for p in cluster.pods_on(NODE)) == 2:
                break
        assert len(cluster.pods_on(NODE)) == 2
        cluster.register_node(Node(name="spare", allocatable=size, ready=True))
        self.cluster = cluster

        async def close() -> None:
            self.closed = True

        return serverless.Runtime(
            cluster=cluster,
            cloud=sim_market(clock),
            autoscaling=self.autoscaling,
            clock=clock,
            policy=self.policy,
            close=close,
        )

    @property
    def node(self) -> Node:
        assert self.cluster is not None
        node = self.cluster.node(NODE)
        assert node is not None
        return node


def spot_warning(instance: str = INSTANCE) -> dict[str, Any]:
    return signals.spot_interruption_warning(
        random.Random(3), now=time.time(), region=REGION, instance_id=instance
    )


def terminate_hook(instance: str = INSTANCE) -> dict[str, Any]:
    event: dict[str, Any] = json.loads((EVENTS / "asg_terminate_lifecycle.json").read_text())
    event["detail"]["EC2InstanceId"] = instance
    return event


def sqs_batch(*bodies: str | dict[str, Any]) -> dict[str, Any]:
    return {
        "Records": [
            {
                "messageId": f"m-{n}",
                "receiptHandle": f"r-{n}",
                "body": body if isinstance(body, str) else json.dumps(body),
                "eventSource": "aws:sqs",
                "eventSourceARN": f"arn:aws:sqs:{REGION}:123456789012:interruptions",
                "awsRegion": REGION,
            }
            for n, body in enumerate(bodies)
        ]
    }


# --- the handler --------------------------------------------------------------------------


def test_a_spot_interruption_event_drains_the_node_and_returns_a_summary() -> None:
    seam = Seam()
    event = spot_warning()
    summary = serverless.handler(event, FakeContext(), runtime=seam)

    [result] = summary["results"]
    assert result["kind"] == "spot_interruption" and result["instance_id"] == INSTANCE
    assert result["action"] == "cordon-and-drain"
    assert (result["node"], result["outcome"]) == (NODE, "drained")
    assert summary["failed"] == 0 and summary["pods_evicted"] == 2
    assert summary["pods_deleted_at_deadline"] == 0
    assert "batchItemFailures" not in summary
    json.dumps(summary)  # what Lambda returns must serialize
    node = seam.node
    assert node.unschedulable and node.labels[LB_LABEL] == "spotwright"
    assert any(t.key == wk.DISRUPTED_TAINT_KEY for t in node.taints)
    assert seam.cluster is not None and seam.cluster.pods_on(NODE) == []
    assert any(e.reason == "InstanceInterrupted" for e in seam.cluster.events)
    assert seam.closed


def test_a_terminate_hook_is_drained_then_completed() -> None:
    seam = Seam()
    summary = serverless.handler(terminate_hook(), FakeContext(), runtime=seam)
    [result] = summary["results"]
    assert result["outcome"] == "drained" and result["lifecycle_result"] == "CONTINUE"
    assert seam.autoscaling is not None
    [completion] = seam.autoscaling.completions
    assert completion.hook.hook_name == "spotwright-drain" and completion.result == "CONTINUE"


def test_a_hook_whose_drain_outlasts_the_function_is_abandoned() -> None:
    # A budget that never allows an eviction, and half a second left to the function.
    seam = Seam(pdb=True)
    context = FakeContext(remaining_ms=int(serverless.RESERVE_SECONDS * 1000) + 500)
    summary = serverless.handler(terminate_hook(), context, runtime=seam)
    [result] = summary["results"]
    assert (result["outcome"], result["lifecycle_result"]) == ("abandoned", "ABANDON")
    assert "DrainTimedOut" in result["error"]
    assert seam.autoscaling is not None
    assert [c.result for c in seam.autoscaling.completions] == ["ABANDON"]


def test_an_sqs_batch_reports_only_the_failed_records(monkeypatch: pytest.MonkeyPatch) -> None:
    original = MemoryCluster.patch_node

    async def patch_node(self: MemoryCluster, name: str, **kwargs: Any) -> None:
        if kwargs.get("unschedulable") is True:  # the cordon: the API server is unwell
            raise ClusterError("the API server answered 503")
        await original(self, name, **kwargs)

    monkeypatch.setattr(MemoryCluster, "patch_node", patch_node)
    summary = serverless.handler(
        sqs_batch(
            "not json at all",
            (EVENTS / "asg_test_notification.json").read_text(),
            spot_warning(),
        ),
        FakeContext(),
        runtime=Seam(),
    )
    outcomes = [r["outcome"] for r in summary["results"]]
    assert outcomes == ["unparseable", "ignored", "failed"]
    assert summary["batchItemFailures"] == [{"itemIdentifier": "m-2"}]
    assert summary["failed"] == 1


def test_a_failure_of_a_direct_invocation_raises_so_that_lambda_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def broken(*_args: Any, **_kwargs: Any) -> None:
        raise ClusterError("forbidden: the role is not mapped in the cluster")

    monkeypatch.setattr(MemoryCluster, "patch_node", broken)
    with pytest.raises(RuntimeError, match="1 interruption"):
        serverless.handler(spot_warning(), FakeContext(), runtime=Seam())


def test_instances_of_other_clusters_are_left_alone() -> None:
    seam = Seam()
    summary = serverless.handler(
        sqs_batch(terminate_hook("i-0123456789abcdef0"), spot_warning("i-0fedcba9876543210")),
        FakeContext(),
        runtime=seam,
    )
    assert [r["outcome"] for r in summary["results"]] == ["not-found", "not-found"]
    assert summary["batchItemFailures"] == []
    assert seam.autoscaling is not None and seam.autoscaling.completions == []
    assert not seam.node.unschedulable


def test_a_rebalance_recommendation_only_cordons() -> None:
    seam = Seam()
    event = signals.rebalance_recommendation(
        random.Random(4), now=time.time(), region=REGION, instance_id=INSTANCE
    )
    [result] = serverless.handler(event, FakeContext(), runtime=seam)["results"]
    assert result["outcome"] == "cordoned"
    assert seam.node.unschedulable
    assert seam.cluster is not None and len(seam.cluster.pods_on(NODE)) == 2


def test_the_same_event_twice_in_a_batch_is_handled_once() -> None:
    seam = Seam()
    event = spot_warning()
    summary = serverless.handler(sqs_batch(event, event), FakeContext(), runtime=seam)
    assert summary["records"] == 2 and summary["events"] == 1


# --- the EKS token ------------------------------------------------------------------------


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def sigv4_presigned_signature(url: str, headers: dict[str, str], secret: str) -> str:
    """The signature a presigned GET ``url`` must carry, computed as STS verifies it."""
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    query.pop("X-Amz-Signature")
    canonical_query = "&".join(
        f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(query.items())
    )
    all_headers = {"host": parts.netloc, **{k.lower(): v for k, v in headers.items()}}
    signed = query["X-Amz-SignedHeaders"].split(";")
    canonical_headers = "".join(f"{name}:{all_headers[name].strip()}\n" for name in signed)
    canonical_request = "\n".join(
        [
            "GET",
            parts.path or "/",
            canonical_query,
            canonical_headers,
            ";".join(signed),
            hashlib.sha256(b"").hexdigest(),
        ]
    )
    _, date, region, service, terminator = query["X-Amz-Credential"].split("/")
    to_sign = "\n".join(
        [
            "AWS4-HMAC-SHA256",
            query["X-Amz-Date"],
            f"{date}/{region}/{service}/{terminator}",
            hashlib.sha256(canonical_request.encode()).hexdigest(),
        ]
    )
    key = _hmac(("AWS4" + secret).encode(), date)
    for part in (region, service, terminator):
        key = _hmac(key, part)
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


@pytest.fixture
def assumed_role(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Temporary credentials of a role, from STS AssumeRole on a moto server.

    The environment is emptied of real credentials and configuration first, as in
    tests/aws/conftest.py, so nothing here could reach AWS.
    """
    import socket

    import boto3  # type: ignore[import-untyped]
    from moto.server import ThreadedMotoServer

    patch = pytest.MonkeyPatch()
    empty = tmp_path_factory.mktemp("aws") / "none"
    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN"):
        patch.delenv(var, raising=False)
    patch.setenv("AWS_ACCESS_KEY_ID", "testing")
    patch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    patch.setenv("AWS_CONFIG_FILE", str(empty))
    patch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    patch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        sts = boto3.session.Session(region_name=REGION).client("sts", endpoint_url=endpoint)
        credentials = sts.assume_role(
            RoleArn="arn:aws:iam::123456789012:role/spotwright-drainer",
            RoleSessionName="drainer",
        )["Credentials"]
        yield {
            "endpoint": endpoint,
            "access_key": credentials["AccessKeyId"],
            "secret_key": credentials["SecretAccessKey"],
            "session_token": credentials["SessionToken"],
        }
    finally:
        server.stop()
        patch.undo()


def test_the_eks_token_is_a_presigned_get_caller_identity_for_the_cluster(
    assumed_role: dict[str, str],
) -> None:
    import boto3  # type: ignore[import-untyped]

    session = boto3.session.Session(
        aws_access_key_id=assumed_role["access_key"],
        aws_secret_access_key=assumed_role["secret_key"],
        aws_session_token=assumed_role["session_token"],
        region_name=REGION,
    )
    # The credentials are the role's, as STS (moto's) sees them.
    identity = session.client("sts", endpoint_url=assumed_role["endpoint"]).get_caller_identity()
    assert ":assumed-role/spotwright-drainer/drainer" in identity["Arn"]

    before = time.time()
    token = serverless.eks_token("prod", region=REGION, session=session)
    assert token.value.startswith("k8s-aws-v1.")
    encoded = token.value.removeprefix("k8s-aws-v1.")
    assert "=" not in encoded and set(encoded) <= set(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    )
    url = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    assert url == token.url
    parts = urlsplit(url)
    assert (parts.scheme, parts.netloc, parts.path) == ("https", f"sts.{REGION}.amazonaws.com", "/")
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    assert query["Action"] == "GetCallerIdentity" and query["Version"] == "2011-06-15"
    assert query["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256"
    key_id, _date, region, service, _end = query["X-Amz-Credential"].split("/")
    assert (key_id, region, service) == (assumed_role["access_key"], REGION, "sts")
    assert query["X-Amz-Security-Token"] == assumed_role["session_token"]
    # The cluster name header is signed, and the expiry is the one EKS expects.
    assert query["X-Amz-SignedHeaders"] == "host;x-k8s-aws-id"
    assert query["X-Amz-Expires"] == "60"
    signed_at = time.mktime(time.strptime(query["X-Amz-Date"], "%Y%m%dT%H%M%SZ")) - time.timezone
    assert before - 2 <= signed_at <= time.time() + 1
    assert token.expires_at == pytest.approx(signed_at + 14 * 60)
    # STS accepts the signature only with the header naming this cluster.
    secret = assumed_role["secret_key"]
    assert query["X-Amz-Signature"] == sigv4_presigned_signature(
        url, {"x-k8s-aws-id": "prod"}, secret
    )
    assert query["X-Amz-Signature"] != sigv4_presigned_signature(
        url, {"x-k8s-aws-id": "staging"}, secret
    )
    # Another STS endpoint can be named (a VPC endpoint, or here moto's).
    elsewhere = serverless.eks_token(
        "prod", region=REGION, session=session, sts_endpoint=assumed_role["endpoint"]
    )
    assert elsewhere.url.startswith(assumed_role["endpoint"] + "/?Action=GetCallerIdentity")
    with pytest.raises(ValueError, match="cluster name"):
        serverless.eks_token("", region=REGION, session=session)


def test_the_kubeconfig_carries_endpoint_ca_and_token() -> None:
    ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----\n...\n").decode()
    config = serverless.kube_config("https://ABCD.gr7.us-east-1.eks.amazonaws.com", ca, "tok")
    single = config.get()
    assert single is not None and single.user is not None
    assert single.cluster.server == "https://ABCD.gr7.us-east-1.eks.amazonaws.com"
    assert single.cluster.certificate_auth_data == ca
    assert single.user.token == "tok"
    with pytest.raises(ValueError, match="https"):
        serverless.kube_config("http://10.0.0.1", ca, "tok")


def test_the_live_runtime_names_the_settings_it_misses() -> None:
    with pytest.raises(ValueError, match="SPOTWRIGHT_CLUSTER_ENDPOINT") as missing:
        asyncio.run(serverless.live_runtime({"SPOTWRIGHT_CLUSTER_NAME": "prod"}))
    assert "SPOTWRIGHT_CLUSTER_CA" in str(missing.value) and "AWS_REGION" in str(missing.value)


# --- against a real API server ------------------------------------------------------------


class _ClusterWithLambdaRole(TestCluster):
    """The test control plane, plus a user in the group the access entry maps the role to."""

    __test__ = False
    USERS: Mapping[str, tuple[str, ...]] = {
        **TestCluster.USERS,
        "lambda-role": ("spotwright-drainer",),
    }


@pytest.fixture(scope="module")
def api_server() -> Iterator[TestCluster]:
    reason = availability()
    if reason is not None:
        pytest.skip(reason)
    with pytest.MonkeyPatch.context() as patch:
        for name in ("NO_PROXY", "no_proxy"):
            existing = os.environ.get(name, "")
            patch.setenv(name, ",".join(filter(None, [existing, "127.0.0.1", "localhost"])))
        cluster = _ClusterWithLambdaRole(ensure_binaries())
        cluster.start()
        try:
            yield cluster
        finally:
            cluster.stop()


def _documented_rbac() -> list[dict[str, Any]]:
    """The ClusterRole and binding docs/serverless.md tells users to apply."""
    text = (ROOT / "docs" / "serverless.md").read_text(encoding="utf-8")
    blocks = [b.split("```", 1)[0] for b in text.split("```yaml\n")[1:]]
    [rbac] = [b for b in blocks if "kind: ClusterRole\n" in b]
    return [d for d in yaml.safe_load_all(rbac) if d]


@pytest.mark.cluster
def test_the_live_runtime_drains_through_a_real_api_server_with_the_documented_rbac(
    api_server: TestCluster,
) -> None:
    """The Kubernetes side of ``live_runtime``: ``connect_cluster`` from an endpoint, a
    base64 CA and a bearer token whose user is only in the documented group."""

    def admin(method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        status, answer = api_server.request(method, path, body)
        assert status in (200, 201), (method, path, status, answer)
        return answer

    for document in _documented_rbac():
        plural = {"ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings"}
        admin("POST", f"/apis/rbac.authorization.k8s.io/v1/{plural[document['kind']]}", document)
    capacity = {"cpu": "4", "memory": "16Gi", "pods": "110"}
    for name, provider_id in ((NODE, f"aws:///{REGION}a/{INSTANCE}"), ("spare", "")):
        admin(
            "POST",
            "/api/v1/nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {"kwok.x-k8s.io/node": "fake"},
                    "labels": {wk.HOSTNAME: name},
                },
                "spec": {"providerID": provider_id} if provider_id else {},
                "status": {"allocatable": capacity, "capacity": capacity},
            },
        )
    api_server.create_namespace("shop", wait_for_service_account=False)
    for n in range(2):
        admin(
            "POST",
            "/api/v1/namespaces/shop/pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"web-{n}", "labels": {"app": "web"}},
                "spec": {
                    "nodeName": NODE,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "web", "image": "registry.invalid/web"}],
                },
            },
        )
    assert api_server.credentials is not None
    token = api_server.credentials.tokens["lambda-role"]
    ca = base64.b64encode(api_server.ca_file.read_bytes()).decode()

    async def runtime() -> serverless.Runtime:
        clock = LoopClock()
        cluster = await serverless.connect_cluster(api_server.server, ca, token)

        async def close() -> None:
            await serverless.disconnect_cluster(cluster)

        return serverless.Runtime(
            cluster=cluster, cloud=sim_market(clock), clock=clock, close=close
        )

    summary = serverless.handler(spot_warning(), FakeContext(), runtime=runtime)
    [result] = summary["results"]
    assert (result["node"], result["outcome"]) == (NODE, "drained"), summary
    assert summary["pods_evicted"] == 2
    node = admin("GET", f"/api/v1/nodes/{NODE}")
    assert node["spec"]["unschedulable"] is True
    assert {"key": wk.DISRUPTED_TAINT_KEY, "effect": "NoSchedule"} in node["spec"]["taints"]
    assert node["metadata"]["labels"][LB_LABEL] == "spotwright"
    assert admin("GET", "/api/v1/namespaces/shop/pods")["items"] == []
    events = admin("GET", "/apis/events.k8s.io/v1/events")["items"]
    reasons = {e["reason"] for e in events if e.get("reportingInstance") == "spotwright-serverless"}
    assert {"InstanceInterrupted", "Cordoned", "Evicted", "Drained"} <= reasons


# --- the deployment template --------------------------------------------------------------


def _template() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(TEMPLATE.read_text(encoding="utf-8"))
    return loaded


def _sub(value: Any) -> str:
    """A plain string, or the text of an ``Fn::Sub``."""
    if isinstance(value, dict):
        text = value["Fn::Sub"]
        return str(text if isinstance(text, str) else text[0])
    return str(value)


def test_the_template_deploys_this_handler_for_every_event_it_handles() -> None:
    template = _template()
    assert template["Transform"] == "AWS::Serverless-2016-10-31"
    resources = template["Resources"]
    [function] = [r for r in resources.values() if r["Type"] == "AWS::Serverless::Function"]
    props = function["Properties"]
    module, _, name = props["Handler"].rpartition(".")
    assert (module, name) == ("spotwright.serverless", "handler")
    assert callable(getattr(serverless, name))
    assert props["Runtime"] == "python3.11"
    env = props["Environment"]["Variables"]
    assert {
        "SPOTWRIGHT_CLUSTER_NAME",
        "SPOTWRIGHT_CLUSTER_ENDPOINT",
        "SPOTWRIGHT_CLUSTER_CA",
    } <= set(env)
    # The rules send every (source, detail-type) the parsers understand, but launch hooks,
    # and only the states and Health events the parsers act on.
    rules = [e["Properties"] for e in props["Events"].values() if e["Type"] == "EventBridgeRule"]
    pairs = {
        (source, detail)
        for rule in rules
        for source in rule["Pattern"]["source"]
        for detail in rule["Pattern"]["detail-type"]
    }
    assert pairs == {pair for pair in SUPPORTED if "launch" not in pair[1]}
    details = {rule["Pattern"]["detail-type"][0]: rule["Pattern"].get("detail") for rule in rules}
    assert details["EC2 Instance State-change Notification"] == {"state": list(ACTIONABLE_STATES)}
    assert details["AWS Health Event"] == {
        "service": ["EC2"],
        "eventTypeCategory": ["scheduledChange"],
    }
    # What cannot be delivered, or keeps failing, ends up in one queue that lets them in.
    queue_arn = {"Fn::GetAtt": ["FailedInvocations", "Arn"]}
    assert all(rule["DeadLetterConfig"] == {"Arn": queue_arn} for rule in rules)
    assert props["DeadLetterQueue"]["TargetArn"] == queue_arn
    [queue_policy] = [
        r for r in template["Resources"].values() if r["Type"] == "AWS::SQS::QueuePolicy"
    ]
    [allow] = queue_policy["Properties"]["PolicyDocument"]["Statement"]
    source_arn = _sub(allow["Condition"]["ArnLike"]["aws:SourceArn"])
    for rule in rules:
        name = _sub(rule["RuleName"])
        assert source_arn.endswith(":rule/${AWS::StackName}-*") and name.startswith(
            "${AWS::StackName}-"
        )
    # And the sample of each parses to events the handler acts on.
    for sample in ("spot_interruption.json", "asg_terminate_lifecycle.json"):
        assert parse_eventbridge((EVENTS / sample).read_text(), source="lambda")


def _policy_statements(role: dict[str, Any]) -> list[dict[str, Any]]:
    """The statements of a role's inline policies, written as ``Fn::Sub`` of JSON text (the
    cluster tag key holds ``${ClusterName}``, and a key cannot be an intrinsic function)."""
    statements: list[dict[str, Any]] = []
    for policy in role["Properties"]["Policies"]:
        document = json.loads(_sub(policy["PolicyDocument"]))
        statements.extend(document["Statement"])
    return statements


def test_the_template_role_grants_only_what_the_handler_calls() -> None:
    from spotwright.adapters.aws._operations import OPERATIONS

    template = _template()
    [role] = [r for r in template["Resources"].values() if r["Type"] == "AWS::IAM::Role"]
    assert "ManagedPolicyArns" not in role["Properties"]
    statements = _policy_statements(role)
    actions = {a for s in statements for a in s["Action"]}
    assert actions == {
        "autoscaling:CompleteLifecycleAction",
        "autoscaling:RecordLifecycleActionHeartbeat",
        "ec2:DescribeInstances",
        "logs:CreateLogStream",
        "logs:PutLogEvents",
        "sqs:SendMessage",
    }
    for statement in statements:
        assert statement["Effect"] == "Allow"
        if statement["Action"] == ["ec2:DescribeInstances"]:
            assert statement["Condition"] == {
                "StringEquals": {"aws:RequestedRegion": "${AWS::Region}"}
            }
        else:
            assert statement["Resource"] != "*"
    # The lifecycle grant is the controller's (deploy/iam-policy.json): same resources,
    # same tag condition, for both calls.
    [lifecycle] = [s for s in statements if "autoscaling:CompleteLifecycleAction" in s["Action"]]
    for operation in ("CompleteLifecycleAction", "RecordLifecycleActionHeartbeat"):
        [grant] = OPERATIONS[("autoscaling", operation)]
        assert f"autoscaling:{operation}" in lifecycle["Action"]
        assert _as_list(lifecycle["Resource"]) == list(grant.resources)
        assert lifecycle["Condition"] == grant.condition


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]
