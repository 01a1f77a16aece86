"""Helpers for the AWS tests: constants, and answers injected at the botocore layer.

See conftest.py for the injection point. Named apart from conftest so test modules can
import it (``from awsfakes import ...``).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter, deque
from collections.abc import Coroutine, Iterator, Sequence
from typing import Any, TypeVar
from xml.sax.saxutils import escape

T = TypeVar("T")

REGION = "us-east-1"
#: Zones whose default subnets the tests select (moto's us-east-1 has a-f).
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")
K8S_VERSION = "1.33"
#: The AMIs seeded into moto's SSM parameters, per (architecture, flavour).
AMIS = {
    ("x86_64", "standard"): "ami-0aaaaaaaaaaaaaaa1",
    ("arm64", "standard"): "ami-0aaaaaaaaaaaaaaa2",
    ("x86_64", "nvidia"): "ami-0aaaaaaaaaaaaaaa3",
}
#: Discovery in tests is restricted to these types: moto serializes all 1,395 slowly.
TEST_TYPES = ("m5.large", "m5.xlarge", "c5.large", "m6g.large", "g4dn.xlarge")

#: What the tests' nodes join: an endpoint and a (fake) base64 CA bundle.
CLUSTER_ENDPOINT = "https://ABCDEF0123456789.gr7.us-east-1.eks.amazonaws.com"
CLUSTER_CA = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run one test's coroutine on a fresh event loop."""
    return asyncio.run(coro)


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_kwargs: Any) -> Iterator[bytes]:
        yield self._body


def http_response(status: int, body: str, content_type: str = "text/xml") -> Any:
    from botocore.awsrequest import AWSResponse

    return AWSResponse(
        "https://injected.invalid/",
        status,
        {"Content-Type": content_type, "x-amzn-RequestId": "injected"},
        _Raw(body.encode()),
    )


def ec2_error(code: str, message: str = "injected", status: int = 400) -> Any:
    """An EC2 (query protocol) error answer, as for a throttled or refused call."""
    return http_response(
        status,
        "<Response><Errors><Error>"
        f"<Code>{escape(code)}</Code><Message>{escape(message)}</Message>"
        "</Error></Errors><RequestID>injected</RequestID></Response>",
    )


def fleet_errors(errors: Sequence[tuple[str, str, str, str]], lifecycle: str = "spot") -> Any:
    """A successful CreateFleet answer that launched nothing.

    ``errors`` are (instance type, subnet id, error code, message), one per failed override.
    """
    items = "".join(
        "<item><launchTemplateAndOverrides>"
        "<launchTemplateSpecification><launchTemplateId>lt-injected</launchTemplateId>"
        "<version>1</version></launchTemplateSpecification>"
        f"<overrides><instanceType>{escape(itype)}</instanceType>"
        f"<subnetId>{escape(subnet)}</subnetId></overrides>"
        f"</launchTemplateAndOverrides><lifecycle>{lifecycle}</lifecycle>"
        f"<errorCode>{escape(code)}</errorCode><errorMessage>{escape(message)}</errorMessage>"
        "</item>"
        for itype, subnet, code, message in errors
    )
    return http_response(
        200,
        '<CreateFleetResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
        "<requestId>injected</requestId><fleetId>fleet-injected</fleetId>"
        f"<errorSet>{items}</errorSet><fleetInstanceSet/></CreateFleetResponse>",
    )


def json_response(payload: dict[str, Any]) -> Any:
    return http_response(200, json.dumps(payload), "application/x-amz-json-1.1")


class Injector:
    """Counts and answers the calls one boto3 client sends (see the module docstring)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.sent: Counter[str] = Counter()
        self.params: dict[str, list[dict[str, Any]]] = {}
        self._answers: dict[str, deque[Any]] = {}
        self._service = client.meta.service_model.service_name
        self._watched: set[str] = set()

    def watch(self, operation: str) -> Injector:
        """Count every HTTP attempt of ``operation`` and keep each call's parameters."""
        if operation in self._watched:
            return self
        self._watched.add(operation)

        def before_send(request: Any, **_kwargs: Any) -> Any:
            self.sent[operation] += 1
            queue = self._answers.get(operation)
            return queue.popleft() if queue else None

        def before_build(params: dict[str, Any], **_kwargs: Any) -> None:
            self.params.setdefault(operation, []).append(
                json.loads(json.dumps(params, default=str))
            )

        events = self.client.meta.events
        events.register(f"before-send.{self._service}.{operation}", before_send)
        events.register(f"before-parameter-build.{self._service}.{operation}", before_build)
        return self

    def answer(self, operation: str, *responses: Any) -> Injector:
        """The next sends of ``operation`` get these answers in turn (None: real moto)."""
        self.watch(operation)
        self._answers.setdefault(operation, deque()).extend(responses)
        return self
