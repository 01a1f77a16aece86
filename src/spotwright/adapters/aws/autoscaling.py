"""Auto Scaling behind the AutoScaling port: heartbeat and complete lifecycle actions (boto3).

Both calls go through the adapters' single call path (``_api.AwsCaller``): a thread per
call, retries of throttling and 5xx answers with jittered backoff, and errors raised as the
port's ``CloudError``. A retried ``CompleteLifecycleAction`` whose first attempt did reach
Auto Scaling answers "no active lifecycle action", which is mapped, like every answer of
that kind, to ``LifecycleActionGone``: the caller then knows the group is already on its
way and deletes its message instead of retrying forever.

The token alone identifies the action, so the instance id is not sent. Permissions: both
operations on Auto Scaling groups tagged ``kubernetes.io/cluster/<cluster>: owned`` (see
``_operations``; EKS managed node groups and eksctl carry that tag).
"""

from __future__ import annotations

from typing import Any, Final

from spotwright.adapters.aws._api import AwsCaller, RetryPolicy, make_client
from spotwright.events.model import LifecycleHook
from spotwright.ports.autoscaling import LIFECYCLE_RESULTS, LifecycleActionGone, LifecycleResult
from spotwright.ports.clock import Clock, LoopClock
from spotwright.ports.cloud import CloudError

__all__ = ["AwsAutoScaling"]

#: How Auto Scaling words a token that names no pending action (completed or timed out).
_GONE_MARKER: Final = "no active lifecycle action"


class AwsAutoScaling:
    """The AutoScaling port on one region's Auto Scaling API."""

    def __init__(
        self,
        *,
        client: Any = None,
        region: str | None = None,
        endpoint_url: str | None = None,
        profile: str | None = None,
        clock: Clock | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        if client is None:
            if not region:
                raise ValueError("AwsAutoScaling needs a region (or a client)")
            client = make_client(
                "autoscaling", region=region, endpoint_url=endpoint_url, profile=profile
            )
        self._asg = AwsCaller(client, clock=clock or LoopClock(), retry=retry)

    async def heartbeat(self, hook: LifecycleHook) -> None:
        try:
            await self._asg.call(
                "RecordLifecycleActionHeartbeat",
                AutoScalingGroupName=hook.asg_name,
                LifecycleHookName=hook.hook_name,
                LifecycleActionToken=hook.token,
            )
        except CloudError as exc:
            raise _classify(exc, hook) from exc

    async def complete(self, hook: LifecycleHook, result: LifecycleResult) -> None:
        if result not in LIFECYCLE_RESULTS:
            raise ValueError(f"a lifecycle action result is CONTINUE or ABANDON, not {result!r}")
        try:
            await self._asg.call(
                "CompleteLifecycleAction",
                AutoScalingGroupName=hook.asg_name,
                LifecycleHookName=hook.hook_name,
                LifecycleActionToken=hook.token,
                LifecycleActionResult=result,
            )
        except CloudError as exc:
            raise _classify(exc, hook) from exc


def _classify(exc: CloudError, hook: LifecycleHook) -> CloudError:
    if exc.code == "ValidationError" and _GONE_MARKER in exc.message.lower():
        return LifecycleActionGone(hook, exc.message)
    return exc
