"""The message-queue port that queue-mode interruption handling reads (SQS live)."""

from __future__ import annotations

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
