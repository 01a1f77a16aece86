"""The message-queue port that queue-mode interruption handling reads (SQS live)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Message", "MessageQueue"]


@dataclass(frozen=True, slots=True)
class Message:
    id: str
    body: str
    receipt: str


class MessageQueue(Protocol):
    async def receive(self, max_messages: int = 10, wait_seconds: float = 20.0) -> list[Message]:
        """Long-poll: return at once when messages are there, else after ``wait_seconds``."""
        ...

    async def delete(self, message: Message) -> None:
        """Acknowledge: the message's action succeeded (or it can never be parsed)."""
        ...

    async def release(self, message: Message) -> None:
        """Make the message visible again now, for another consumer (not ours to handle)."""
        ...

    async def extend(self, messages: Sequence[Message], seconds: float) -> list[Message]:
        """Keep these messages in flight (invisible) for ``seconds`` more, from now.

        A message stays in flight while its action runs, so that it is delivered again if
        this process dies before the action is over. Returns the messages that could not
        be kept: their receipt is no longer valid (the visibility ran out and the message
        went back to the queue, or it was deleted).
        """
        ...
