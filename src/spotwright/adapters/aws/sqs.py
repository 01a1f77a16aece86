"""An SQS queue behind the MessageQueue port, for queue-mode interruption handling.

EventBridge rules put EC2 and AWS Health events into the queue; the interruption controller
long-polls it (up to 20 s, up to 10 messages), keeps a message in flight while its action
runs (ChangeMessageVisibilityBatch, ten at a time), deletes it once the action is over,
and releases messages that are not its own. Releasing makes the message visible again
after ``release_delay`` seconds (ChangeMessageVisibility) rather than deleting it, so on a
queue shared by several consumers nothing is lost; the queue's redrive policy, if it has
one, moves a message nobody handles to its dead-letter queue, as ``MemoryQueue`` does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final

from spotwright.adapters.aws._api import AwsCaller, RetryPolicy, make_client
from spotwright.observability.logs import get_logger
from spotwright.ports.clock import Clock, LoopClock
from spotwright.ports.cloud import CloudError
from spotwright.ports.queue import Message

__all__ = ["SqsQueue"]

log = get_logger("aws.sqs")

#: SQS limits: a long poll waits at most 20 s and returns at most 10 messages.
MAX_WAIT_SECONDS: Final = 20
MAX_MESSAGES: Final = 10
#: A message can be kept in flight at most 12 hours after its receipt.
MAX_VISIBILITY_SECONDS: Final = 43200
#: A receipt that is no longer valid (the message was redelivered or already deleted).
_STALE_RECEIPT_CODES: Final = frozenset(
    {"ReceiptHandleIsInvalid", "InvalidParameterValue", "MessageNotInflight"}
)


def _region_of(queue_url: str) -> str | None:
    # https://sqs.<region>.amazonaws.com/<account>/<name>
    host = queue_url.split("://", 1)[-1].split("/", 1)[0]
    parts = host.split(".")
    return parts[1] if len(parts) > 3 and parts[0] == "sqs" else None


class SqsQueue:
    def __init__(
        self,
        queue_url: str,
        *,
        client: Any = None,
        region: str | None = None,
        release_delay: float = 30.0,
        endpoint_url: str | None = None,
        profile: str | None = None,
        clock: Clock | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        if not queue_url:
            raise ValueError("an SQS queue URL is required")
        if not 0 <= release_delay <= 43200:
            raise ValueError("release_delay must be between 0 and 43200 seconds")
        self.queue_url = queue_url
        self.release_delay = release_delay
        if client is None:
            where = region or _region_of(queue_url)
            if where is None:
                raise ValueError(f"cannot tell the region of {queue_url!r}; pass region=")
            client = make_client("sqs", region=where, endpoint_url=endpoint_url, profile=profile)
        self._sqs = AwsCaller(client, clock=clock or LoopClock(), retry=retry)

    async def receive(self, max_messages: int = 10, wait_seconds: float = 20.0) -> list[Message]:
        """Long-poll: at once when messages are there, else after ``wait_seconds`` (<= 20)."""
        answer = await self._sqs.call(
            "ReceiveMessage",
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=max(1, min(MAX_MESSAGES, max_messages)),
            WaitTimeSeconds=max(0, min(MAX_WAIT_SECONDS, math.ceil(wait_seconds))),
            MessageSystemAttributeNames=["SentTimestamp", "ApproximateReceiveCount"],
        )
        return [
            Message(
                id=str(m["MessageId"]), body=str(m.get("Body", "")), receipt=str(m["ReceiptHandle"])
            )
            for m in answer.get("Messages") or ()
        ]

    async def delete(self, message: Message) -> None:
        """Acknowledge. A receipt that went stale (redelivered meanwhile) is not an error."""
        try:
            await self._sqs.call(
                "DeleteMessage", QueueUrl=self.queue_url, ReceiptHandle=message.receipt
            )
        except CloudError as exc:
            if exc.code not in _STALE_RECEIPT_CODES:
                raise
            log.debug("message receipt no longer valid", message_id=message.id, code=exc.code)

    async def release(self, message: Message) -> None:
        """Visible again after ``release_delay`` seconds, for whichever consumer owns it."""
        try:
            await self._sqs.call(
                "ChangeMessageVisibility",
                QueueUrl=self.queue_url,
                ReceiptHandle=message.receipt,
                VisibilityTimeout=int(self.release_delay),
            )
        except CloudError as exc:
            if exc.code not in _STALE_RECEIPT_CODES:
                raise
            log.debug("message receipt no longer valid", message_id=message.id, code=exc.code)

    async def extend(self, messages: Sequence[Message], seconds: float) -> list[Message]:
        """Keep in flight ``seconds`` more; returns those whose receipt went stale."""
        timeout = max(0, min(MAX_VISIBILITY_SECONDS, math.ceil(seconds)))
        lost: list[Message] = []
        for start in range(0, len(messages), MAX_MESSAGES):
            chunk = {str(n): m for n, m in enumerate(messages[start : start + MAX_MESSAGES])}
            answer = await self._sqs.call(
                "ChangeMessageVisibilityBatch",
                QueueUrl=self.queue_url,
                Entries=[
                    {"Id": key, "ReceiptHandle": m.receipt, "VisibilityTimeout": timeout}
                    for key, m in chunk.items()
                ],
            )
            for failure in answer.get("Failed") or ():
                message = chunk[str(failure.get("Id"))]
                code = str(failure.get("Code", ""))
                if code not in _STALE_RECEIPT_CODES:
                    # Over the 12-hour limit, or SQS itself failing: the message returns
                    # to the queue when its visibility ends, and is handled again then.
                    log.warning(
                        "could not keep message in flight",
                        message_id=message.id,
                        code=code,
                        error=str(failure.get("Message", "")),
                    )
                lost.append(message)
        return lost
