"""AWS behind the ports: EC2 as the Cloud, SQS as the MessageQueue (boto3).

``EC2Cloud`` is the live counterpart of the simulated market and ``SqsQueue`` of the
in-memory queue; controllers cannot tell them apart. See docs/aws.md.
"""

from spotwright.adapters.aws._api import RetryPolicy, make_client
from spotwright.adapters.aws.discovery import RefreshIntervals, SelectorTerm
from spotwright.adapters.aws.ec2 import EC2Cloud, EC2Settings
from spotwright.adapters.aws.sqs import SqsQueue

__all__ = [
    "EC2Cloud",
    "EC2Settings",
    "RefreshIntervals",
    "RetryPolicy",
    "SelectorTerm",
    "SqsQueue",
    "make_client",
]
