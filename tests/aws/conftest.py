"""AWS adapter tests: real boto3 over HTTP against a moto server on 127.0.0.1.

Nothing here can reach AWS. The session starts one ``ThreadedMotoServer`` on a free local
port; the environment gets dummy credentials (and no profile or config file), and every
client is made with ``endpoint_url`` of that server.

Injection point. moto never runs out of capacity, never throttles and has no quotas, so
those answers are injected at the botocore layer: ``Injector`` registers a handler for
``before-send.<service>.<Operation>`` on one client. botocore emits that event with the
signed HTTP request just before sending it; a handler that returns an ``AWSResponse`` is
used instead of the network answer, and botocore parses it exactly as it would parse
EC2's. Returning None lets the request go through to moto. The canned bodies (awsfakes.py)
are the EC2 query protocol's XML, so the code under test sees what boto3 would give it live.
"""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from awsfakes import (
    AMIS,
    CLUSTER_CA,
    CLUSTER_ENDPOINT,
    K8S_VERSION,
    REGION,
    TEST_TYPES,
    ZONES,
    Injector,
)


@pytest.fixture(scope="session")
def aws_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Dummy credentials and no shared config: a stray call could never authenticate."""
    empty = tmp_path_factory.mktemp("aws") / "none"
    patch = pytest.MonkeyPatch()
    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        patch.delenv(var, raising=False)
    patch.setenv("AWS_ACCESS_KEY_ID", "testing")
    patch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    patch.setenv("AWS_DEFAULT_REGION", REGION)
    patch.setenv("AWS_CONFIG_FILE", str(empty))
    patch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    patch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    yield
    patch.undo()


@pytest.fixture(scope="session")
def moto_endpoint(aws_env: None) -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture(scope="session")
def boto_session(aws_env: None) -> Any:
    """One boto3 session for every test client: loading a service model takes a second."""
    import boto3

    return boto3.session.Session(region_name=REGION)


@pytest.fixture
def client(moto_endpoint: str, boto_session: Any) -> Callable[..., Any]:
    """``client("ec2")``: a fresh boto3 client on the moto server (handlers don't leak)."""
    from spotwright.adapters.aws import make_client

    def make(service: str, region: str = REGION) -> Any:
        return make_client(service, region=region, endpoint_url=moto_endpoint, session=boto_session)

    return make


@pytest.fixture(scope="session")
def eks_amis(moto_endpoint: str) -> dict[tuple[str, str], str]:
    """Seed the EKS-optimized AMI parameters, which moto does not ship.

    ``/aws/...`` names are reserved (PutParameter refuses them, as AWS does), so they are
    added to moto's in-process SSM backend, which its server shares with this process.
    """
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ssm.models import Parameter, ssm_backends

    from spotwright.adapters.aws.discovery import DEFAULT_AMI_PARAMETER

    backend = ssm_backends[DEFAULT_ACCOUNT_ID][REGION]
    for (arch, flavor), ami in AMIS.items():
        name = DEFAULT_AMI_PARAMETER.format(version=K8S_VERSION, arch=arch, flavor=flavor)
        backend._parameters[name].append(
            Parameter(
                account_id=DEFAULT_ACCOUNT_ID,
                name=name,
                value=ami,
                parameter_type="String",
                description=None,
                allowed_pattern=None,
                keyid=None,
                last_modified_date=datetime.now(tz=UTC),
                version=1,
                data_type="aws:ec2:image",
            )
        )
    return dict(AMIS)


@pytest.fixture
def cluster() -> str:
    """A cluster name of its own per test: moto's state is shared by the whole session."""
    return f"test-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def network(client: Callable[..., Any], cluster: str) -> dict[str, Any]:
    """Tag the default subnets of ZONES and the default security group for ``cluster``."""
    ec2 = client("ec2")
    subnets = {
        s["AvailabilityZone"]: s["SubnetId"]
        for s in ec2.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])[
            "Subnets"
        ]
        if s["AvailabilityZone"] in ZONES
    }
    group = ec2.describe_security_groups(Filters=[{"Name": "group-name", "Values": ["default"]}])[
        "SecurityGroups"
    ][0]["GroupId"]
    ec2.create_tags(
        Resources=[*subnets.values(), group],
        Tags=[{"Key": "karpenter.sh/discovery", "Value": cluster}],
    )
    return {"subnets": subnets, "security_group": group}


@pytest.fixture
def make_cloud(
    client: Callable[..., Any], cluster: str, network: dict[str, Any], eks_amis: Any
) -> Callable[..., Any]:
    """``make_cloud(**settings)`` -> (EC2Cloud, Injector on its EC2 client).

    ``node_classes`` is the cloud's EC2NodeClass lookup (name -> class or None).

    Must be called inside the test's event loop. Retries wait milliseconds, not seconds.
    """
    from spotwright.adapters.aws import EC2Cloud, EC2Settings, RetryPolicy
    from spotwright.ports.clock import LoopClock

    def make(clock: Any = None, node_classes: Any = None, **overrides: Any) -> tuple[Any, Injector]:
        settings: dict[str, Any] = {
            "cluster_name": cluster,
            "kubernetes_version": K8S_VERSION,
            "instance_type_patterns": TEST_TYPES,
            "retry": RetryPolicy(attempts=4, base_seconds=0.01, cap_seconds=0.05),
            # what nodes join with (tests of EKS DescribeCluster set these to None)
            "cluster_endpoint": CLUSTER_ENDPOINT,
            "cluster_ca_bundle": CLUSTER_CA,
            "service_cidr": "10.100.0.0/16",
        }
        settings.update(overrides)
        ec2 = client("ec2")
        cloud = EC2Cloud(
            EC2Settings(**settings),
            region=REGION,
            clock=clock or LoopClock(),
            ec2_client=ec2,
            ssm_client=client("ssm"),
            iam_client=client("iam"),
            eks_client=client("eks"),
            node_classes=node_classes,
        )
        return cloud, Injector(ec2)

    return make
