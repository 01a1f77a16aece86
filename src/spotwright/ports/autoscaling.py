"""The Auto Scaling port: keeping a lifecycle hook open, and letting the group go on.

An Auto Scaling group with a terminate lifecycle hook waits for someone to say "done"
before it terminates an instance. The interruption handler (queue mode) and the serverless
drainer are that someone: they drain the node, keep the hook alive with heartbeats while
they do, and complete the lifecycle action with ``CONTINUE`` (drained) or ``ABANDON``
(the drain failed). Those two calls are all they need from Auto Scaling, so that is all
this port offers; live it is ``RecordLifecycleActionHeartbeat`` and
``CompleteLifecycleAction`` (``adapters.aws.autoscaling``), in simulation and unit tests an
in-memory recorder (``adapters.sim_autoscaling``).

A lifecycle action that is no longer pending (completed already, by us before a restart or
by someone else, or timed out to its default result) cannot be heartbeated or completed
again; both adapters raise ``LifecycleActionGone`` for it, so callers can tell "nothing left
to do" from a failure worth retrying.
"""

from __future__ import annotations

from typing import Final, Literal, Protocol

from spotwright.events.model import LifecycleHook
from spotwright.ports.cloud import CloudError

__all__ = [
    "LIFECYCLE_RESULTS",
    "AutoScaling",
    "LifecycleActionGone",
    "LifecycleResult",
]

#: What a lifecycle action is completed with.
LifecycleResult = Literal["CONTINUE", "ABANDON"]
LIFECYCLE_RESULTS: Final = ("CONTINUE", "ABANDON")


class LifecycleActionGone(CloudError):
    """The lifecycle action is not pending any more: completed already, or timed out."""

    def __init__(self, hook: LifecycleHook, message: str = "") -> None:
        super().__init__(
            "ValidationError",
            message
            or f"No active Lifecycle Action found with token {hook.token} "
            f"(group {hook.asg_name}, hook {hook.hook_name})",
        )
        self.hook = hook


class AutoScaling(Protocol):
    async def heartbeat(self, hook: LifecycleHook) -> None:
        """Restart the hook's heartbeat timeout (RecordLifecycleActionHeartbeat).

        Raises ``LifecycleActionGone`` when the action is no longer pending, ``CloudError``
        for anything else.
        """
        ...

    async def complete(self, hook: LifecycleHook, result: LifecycleResult) -> None:
        """Let the group proceed (CompleteLifecycleAction with ``result``).

        Raises ``LifecycleActionGone`` when the action is no longer pending, ``CloudError``
        for anything else.
        """
        ...
