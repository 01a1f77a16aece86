"""An in-memory stand-in for Auto Scaling lifecycle actions, recording every call.

The simulator and the unit tests give it to the interruption handler (or the serverless
drainer) where live runs give ``adapters.aws.autoscaling.AwsAutoScaling``. It keeps what
was sent, and when (``heartbeats``, ``completions``), and it follows Auto Scaling's rules
for the actions it was told about with ``begin``: an action is pending until it is
completed, or until its heartbeat timeout passes without a heartbeat (or its global
timeout passes), when it ends with its default result; a call about an action that ended
raises ``LifecycleActionGone``, as Auto Scaling answers "no active lifecycle action".
Tokens it was never told about are accepted, unless ``strict``.

``fail_next`` makes the next calls of one operation fail with a given error, for tests of
what the caller does then.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal

from spotwright.events.model import LifecycleHook
from spotwright.ports.autoscaling import LIFECYCLE_RESULTS, LifecycleActionGone, LifecycleResult
from spotwright.ports.clock import Clock
from spotwright.ports.cloud import CloudError

__all__ = ["Completion", "Heartbeat", "SimAutoScaling"]

Operation = Literal["heartbeat", "complete"]
#: Auto Scaling's bound on how long any lifecycle action may stay pending.
MAX_GLOBAL_TIMEOUT = 172_800.0


@dataclass(frozen=True, slots=True)
class Heartbeat:
    at: float
    hook: LifecycleHook


@dataclass(frozen=True, slots=True)
class Completion:
    at: float
    hook: LifecycleHook
    result: LifecycleResult


@dataclass(slots=True)
class _Pending:
    hook: LifecycleHook
    started: float
    last_beat: float
    heartbeat_timeout: float
    default_result: LifecycleResult


class SimAutoScaling:
    def __init__(self, clock: Clock | None = None, *, strict: bool = False) -> None:
        self._clock = clock
        self.strict = strict
        self.heartbeats: list[Heartbeat] = []
        self.completions: list[Completion] = []
        #: How each action the simulator knew about ended: the result, and whether it was
        #: completed by a call (``"completed"``) or by its timeout (``"timeout"``).
        self.outcomes: dict[str, tuple[LifecycleResult, str]] = {}
        self._pending: dict[str, _Pending] = {}
        self._failures: dict[Operation, deque[CloudError]] = {}

    # -- the group's side -----------------------------------------------------------------
    def begin(
        self,
        hook: LifecycleHook,
        *,
        heartbeat_timeout: float = 3600.0,
        default_result: LifecycleResult = "ABANDON",
    ) -> None:
        """The group starts a lifecycle action and waits for ``hook``'s token."""
        if not 30.0 <= heartbeat_timeout <= 7200.0:
            raise ValueError("Auto Scaling allows heartbeat timeouts of 30 s to 7200 s")
        now = self._now()
        self._pending[hook.token] = _Pending(hook, now, now, heartbeat_timeout, default_result)

    def pending(self) -> list[LifecycleHook]:
        """The actions still waiting to be completed (expired ones are ended first)."""
        self._expire()
        return [p.hook for p in self._pending.values()]

    def fail_next(self, operation: Operation, *errors: CloudError) -> None:
        """The next calls of ``operation`` raise these errors in turn."""
        self._failures.setdefault(operation, deque()).extend(errors)

    def heartbeats_for(self, hook: LifecycleHook) -> list[float]:
        return [h.at for h in self.heartbeats if h.hook.token == hook.token]

    # -- the port -------------------------------------------------------------------------
    async def heartbeat(self, hook: LifecycleHook) -> None:
        self._raise_injected("heartbeat")
        pending = self._check(hook)
        now = self._now()
        if pending is not None:
            pending.last_beat = now
        self.heartbeats.append(Heartbeat(now, hook))

    async def complete(self, hook: LifecycleHook, result: LifecycleResult) -> None:
        if result not in LIFECYCLE_RESULTS:
            raise ValueError(f"a lifecycle action result is CONTINUE or ABANDON, not {result!r}")
        self._raise_injected("complete")
        self._check(hook)
        self._pending.pop(hook.token, None)
        self.outcomes[hook.token] = (result, "completed")
        self.completions.append(Completion(self._now(), hook, result))

    # -- rules ----------------------------------------------------------------------------
    def _check(self, hook: LifecycleHook) -> _Pending | None:
        self._expire()
        pending = self._pending.get(hook.token)
        if pending is not None:
            if (pending.hook.asg_name, pending.hook.hook_name) != (hook.asg_name, hook.hook_name):
                raise CloudError(
                    "ValidationError",
                    f"token {hook.token} belongs to hook {pending.hook.hook_name} of group "
                    f"{pending.hook.asg_name}",
                )
            return pending
        if hook.token in self.outcomes or self.strict:
            raise LifecycleActionGone(hook)
        return None

    def _expire(self) -> None:
        now = self._now()
        for token, pending in list(self._pending.items()):
            global_timeout = min(MAX_GLOBAL_TIMEOUT, 100 * pending.heartbeat_timeout)
            if (
                now >= pending.last_beat + pending.heartbeat_timeout
                or now >= pending.started + global_timeout
            ):
                del self._pending[token]
                self.outcomes[token] = (pending.default_result, "timeout")

    def _raise_injected(self, operation: Operation) -> None:
        queue = self._failures.get(operation)
        if queue:
            raise queue.popleft()

    def _now(self) -> float:
        return self._clock.now() if self._clock is not None else 0.0
