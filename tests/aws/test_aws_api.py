"""``AwsCaller`` and answers that arrive broken, over HTTP against the moto server.

A 200 whose body is not the protocol's XML (a proxy's HTML page, a body cut short) makes
botocore raise ``ResponseParserError``, which is not one of botocore's own exceptions; a
truncated or corrupted stream raises ``IncompleteReadError`` or ``ChecksumError``. Each is
a failure on the way rather than an answer from AWS: the call is tried again, and when
every attempt fails it ends as a ``CloudError`` naming the failure, never as a botocore
exception escaping into a controller. The broken answers are injected at botocore's
``before-send`` (the body) and ``after-call`` (an exception after the answer) events.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import botocore.exceptions
import pytest
from awsfakes import Injector, http_response, run

from spotwright.adapters.aws import RetryPolicy
from spotwright.adapters.aws._api import AwsCaller
from spotwright.ports.clock import LoopClock
from spotwright.ports.cloud import CloudError

OPERATION = "DescribeSubnets"
ATTEMPTS = 3
HTML = "<html><body><h1>502 Bad Gateway</h1></body></html"
CUT_SHORT = (
    '<DescribeSubnetsResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
    "<requestId>injected</requestId><subnetSet><item><subnetId>subnet-0"
)


def caller(ec2: Any) -> AwsCaller:
    fast = RetryPolicy(attempts=ATTEMPTS, base_seconds=0.01, cap_seconds=0.02)
    return AwsCaller(ec2, clock=LoopClock(), retry=fast)


@pytest.mark.parametrize("body", [HTML, CUT_SHORT], ids=["html-page", "cut-short"])
def test_an_unparseable_answer_is_retried_and_the_next_one_used(
    client: Callable[..., Any], body: str
) -> None:
    ec2 = client("ec2")
    calls = Injector(ec2).answer(OPERATION, http_response(200, body), None)
    answer = run(caller(ec2).call(OPERATION))
    assert calls.sent[OPERATION] == 2
    assert answer["Subnets"]  # moto's answer to the second attempt


def test_answers_that_never_parse_end_as_a_cloud_error(client: Callable[..., Any]) -> None:
    ec2 = client("ec2")
    calls = Injector(ec2).answer(OPERATION, *[http_response(200, HTML)] * ATTEMPTS)
    with pytest.raises(CloudError) as caught:
        run(caller(ec2).call(OPERATION))
    assert caught.value.code == "ResponseParserError"
    assert calls.sent[OPERATION] == ATTEMPTS


@pytest.mark.parametrize(
    "failure",
    [
        botocore.exceptions.IncompleteReadError(actual_bytes=10, expected_bytes=20),
        botocore.exceptions.ChecksumError(
            checksum_type="crc32", expected_checksum="1", actual_checksum="2"
        ),
    ],
    ids=["incomplete-read", "checksum"],
)
def test_a_stream_cut_short_or_corrupted_is_retried(
    client: Callable[..., Any], failure: Exception
) -> None:
    ec2 = client("ec2")
    raised: list[Exception] = []

    def once(**_kwargs: Any) -> None:
        if not raised:
            raised.append(failure)
            raise failure

    ec2.meta.events.register(f"after-call.ec2.{OPERATION}", once)
    answer = run(caller(ec2).call(OPERATION))
    assert raised == [failure] and answer["Subnets"]


def test_a_request_botocore_refuses_is_not_retried(client: Callable[..., Any]) -> None:
    """Not every error is transient: a bad parameter fails at once, as a CloudError."""
    ec2 = client("ec2")
    calls = Injector(ec2).watch(OPERATION)
    with pytest.raises(CloudError) as caught:
        run(caller(ec2).call(OPERATION, SubnetIds="not-a-list"))
    assert caught.value.code == "ParamValidationError"
    assert calls.sent[OPERATION] == 0
