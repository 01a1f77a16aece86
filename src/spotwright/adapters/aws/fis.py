"""AWS FIS as the target of ``spotwright interrupt``: real spot interruptions, sent the way
amazon-ec2-spot-interrupter sends them.

One run, every call through the adapters' single AWS call path (``AwsCaller``: retries,
errors as ``CloudError``, each operation declared with the permissions it needs):

1. DescribeInstances: every instance must exist, be running and be a spot instance. All
   offenders are named at once, before anything is created (``FisInputError``). The
   reservations' owner is the account, so the ARNs need no STS call.
2. The experiment role: GetRole, and when it is missing CreateRole (trusting
   fis.amazonaws.com on behalf of this account only, tagged as spotwright's) followed by
   a short wait for IAM to make it usable. A role tagged as spotwright's gets its inline
   policy (send spot interruptions, describe instances) written again, so it stays current;
   someone else's role is used as it is, once its trust policy is seen to let FIS in.
3. CreateExperimentTemplate: action aws:ec2:send-spot-instance-interruptions with
   durationBeforeInterruption = 120 s + the delay, the instances as targets by ARN (five
   per target, FIS's default quota for this action), no stop condition, tagged.
4. StartExperiment, then GetExperiment every few seconds on the injected clock, reporting
   each state change, until the experiment is completed, failed, stopped or cancelled. A
   timeout, an error or a cancellation while following it stops the experiment.
5. DeleteExperimentTemplate, whatever happened, unless asked to keep it.

FIS sends the rebalance recommendation when the action starts and the interruption notice
``delay`` seconds later; EC2 interrupts the instances two minutes after the notice.

These operations are declared as interrupter-only (``_operations.INTERRUPTER_OPERATIONS``):
the controller never calls them, so its policy does not grant them. The interrupter's own
policy, checked in as ``deploy/iam-policy-interrupter.json``, is generated next to the
controller's, by ``python -m spotwright.adapters.aws.iam_policy --interrupter``. The
requests and policy documents themselves are built in ``_fis_documents``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

from spotwright.adapters.aws._api import AwsCaller, RetryPolicy, make_client
from spotwright.adapters.aws._fis_documents import (
    ACTION_ID,
    FIS_PRINCIPAL,
    TAGS,
    SpotInstance,
    is_ours,
    role_policy,
    template_request,
    trust_policy,
    trusts_fis,
)
from spotwright.model.durations import format_duration
from spotwright.observability.logs import get_logger
from spotwright.ports.clock import Clock
from spotwright.ports.cloud import CloudError

__all__ = [
    "ACTION_ID",
    "DEFAULT_ROLE_NAME",
    "MAX_DELAY_SECONDS",
    "FisClients",
    "FisError",
    "FisInputError",
    "FisInterrupter",
    "FisOutcome",
    "SpotInstance",
    "duration_before_interruption",
    "template_request",
]

log = get_logger("aws.fis")

#: The notice comes this long before the interruption.
NOTICE_SECONDS: Final = 120
#: durationBeforeInterruption goes from PT2M to PT15M, so the delay up to 13 minutes.
MAX_DELAY_SECONDS: Final = 13 * 60
DEFAULT_ROLE_NAME: Final = "spotwright-fis-spot-interrupter"
ROLE_POLICY_NAME: Final = "spotwright-send-spot-interruptions"
#: How often the experiment is looked at (as ec2-spot-interrupter does).
POLL_SECONDS: Final = 5.0
#: A new role is not at once usable by another service; IAM is eventually consistent.
ROLE_PROPAGATION_SECONDS: Final = 10.0
#: States an experiment does not leave.
TERMINAL_STATES: Final = frozenset({"completed", "stopped", "failed", "cancelled"})


class FisInputError(ValueError):
    """The request cannot be carried out as given (bad instances, unusable role, delay)."""


class FisError(Exception):
    """AWS could not be reached or refused a call; the text says which step and why."""


@dataclass(frozen=True, slots=True)
class FisOutcome:
    """How a run ended. ``status`` is the experiment's last state, or ``timeout``."""

    experiment_id: str
    template_id: str
    status: str
    reason: str
    started_at: float
    role_arn: str
    role_created: bool
    template_deleted: bool

    @property
    def completed(self) -> bool:
        return self.status == "completed"


@dataclass(frozen=True, slots=True)
class FisClients:
    """The boto3 clients a run needs (EC2, IAM and FIS of one region)."""

    ec2: Any
    iam: Any
    fis: Any

    @classmethod
    def connect(cls, region: str | None, profile: str | None) -> FisClients:
        """Clients for ``region`` (default: the profile's) from the usual credential chain.

        The endpoints are AWS's unless AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_<SERVICE>)
        points elsewhere, which is how an emulator such as moto is reached.
        """
        import boto3  # type: ignore[import-untyped, unused-ignore]
        import botocore.exceptions  # type: ignore[import-untyped, unused-ignore]

        try:
            session = boto3.session.Session(profile_name=profile)
        except botocore.exceptions.ProfileNotFound as exc:
            raise FisInputError(str(exc)) from None
        chosen = region or session.region_name
        if not chosen:
            raise FisInputError(
                "no AWS region: give --region, or set AWS_REGION or the profile's region"
            )
        return cls(*(make_client(service, region=chosen, session=session) for service in _SERVICES))


_SERVICES: Final = ("ec2", "iam", "fis")


def duration_before_interruption(delay: float) -> str:
    """The action's durationBeforeInterruption for a notice ``delay`` seconds from the start.

    ISO 8601, whole seconds: 15 gives ``PT2M15S``, 0 gives ``PT2M``, 60 gives ``PT3M``.
    """
    seconds = round(delay)
    if not 0 <= seconds <= MAX_DELAY_SECONDS:
        raise FisInputError(
            f"FIS sends the notice at most {format_duration(MAX_DELAY_SECONDS)} after the "
            f"experiment starts (durationBeforeInterruption PT2M to PT15M); "
            f"a delay of {format_duration(delay)} is out of range"
        )
    minutes, rest = divmod(NOTICE_SECONDS + seconds, 60)
    return f"PT{minutes}M" + (f"{rest}S" if rest else "")


@contextmanager
def _step(what: str) -> Iterator[None]:
    """Turn a refused or failed AWS call into a ``FisError`` saying what was being done."""
    try:
        yield
    except CloudError as exc:
        if exc.code == "NoCredentialsError":
            raise FisError(
                f"cannot {what}: no AWS credentials found (set AWS_PROFILE, or "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
            ) from None
        raise FisError(f"cannot {what}: {exc.code}: {exc.message}") from None


class FisInterrupter:
    """One ``spotwright interrupt --to fis`` run (see the module docstring).

    ``say`` gets one line per step for a person to read; ``on_started(experiment_id,
    started_at)`` is called once the experiment runs. ``clock`` paces the polling and the
    retries, so tests follow an experiment without waiting.
    """

    def __init__(
        self,
        clients: FisClients,
        *,
        clock: Clock,
        role_name: str = DEFAULT_ROLE_NAME,
        clean: bool = True,
        timeout: float = 600.0,
        poll_seconds: float = POLL_SECONDS,
        retry: RetryPolicy | None = None,
        say: Callable[[str], None] = lambda _: None,
        on_started: Callable[[str, float], None] = lambda _id, _at: None,
    ) -> None:
        if timeout < 0 or poll_seconds <= 0:
            raise ValueError("the timeout must be 0 or more and the poll interval above 0")
        self._ec2 = AwsCaller(clients.ec2, clock=clock, retry=retry)
        self._iam = AwsCaller(clients.iam, clock=clock, retry=retry)
        self._fis = AwsCaller(clients.fis, clock=clock, retry=retry)
        self.region: str = clients.ec2.meta.region_name
        self.partition: str = getattr(clients.ec2.meta, "partition", None) or "aws"
        self._clock = clock
        self.role_name = role_name
        self._clean = clean
        self._timeout = timeout
        self._poll = poll_seconds
        self._say = say
        self._on_started = on_started

    async def run(self, instance_ids: Sequence[str], delay: float) -> FisOutcome:
        """Interrupt the instances ``delay`` seconds from the start; see the module docstring.

        Raises ``FisInputError`` when the instances or the role cannot be used (nothing has
        been created then), ``FisError`` when AWS refuses a step (the template is deleted
        all the same); any other end of the experiment is in the outcome.
        """
        duration = duration_before_interruption(delay)
        account_id, instances = await self.check_instances(instance_ids)
        for instance in instances:
            self._say(
                f"{instance.instance_id}: running spot instance "
                f"({instance.instance_type} in {instance.zone})"
            )
        role_arn, created = await self.ensure_role(account_id)
        if created:
            self._say(
                f"waiting {format_duration(ROLE_PROPAGATION_SECONDS)} for IAM to make the "
                "new role usable"
            )
            await self._clock.sleep(ROLE_PROPAGATION_SECONDS)
        request = template_request(
            instances, role_arn=role_arn, duration=duration, client_token=uuid.uuid4().hex
        )
        with _step("create the FIS experiment template"):
            template = (await self._fis.call("CreateExperimentTemplate", **request))[
                "experimentTemplate"
            ]
        template_id = str(template["id"])
        self._say(
            f"experiment template {template_id}: {ACTION_ID} on {len(instances)} "
            f"instance(s), durationBeforeInterruption {duration}"
        )
        deleted = False
        try:
            experiment_id, started, status, reason = await self._experiment(template_id)
        finally:
            if self._clean:
                deleted = await self._delete_template(template_id)
            else:
                self._say(f"experiment template {template_id}: kept (--no-clean)")
        if created and status == "failed" and "role" in reason.lower():
            reason += " (the role was created just now; IAM may take a while: run it again)"
        return FisOutcome(
            experiment_id=experiment_id,
            template_id=template_id,
            status=status,
            reason=reason,
            started_at=started,
            role_arn=role_arn,
            role_created=created,
            template_deleted=deleted,
        )

    async def check_instances(self, instance_ids: Sequence[str]) -> tuple[str, list[SpotInstance]]:
        """(account id, the instances) if every one exists, runs and is spot; else names
        every one that does not, in a ``FisInputError``."""
        with _step("describe the instances"):
            reservations = await self._ec2.collect(
                "DescribeInstances",
                "Reservations",
                Filters=[{"Name": "instance-id", "Values": list(instance_ids)}],
            )
        found: dict[str, tuple[str, dict[str, Any]]] = {}
        for reservation in reservations:
            for instance in reservation.get("Instances") or ():
                found[instance["InstanceId"]] = (str(reservation.get("OwnerId", "")), instance)
        problems: list[str] = []
        checked: list[SpotInstance] = []
        account_id = ""
        for instance_id in instance_ids:
            if instance_id not in found:
                problems.append(f"{instance_id} does not exist in {self.region}")
                continue
            owner, instance = found[instance_id]
            state = str((instance.get("State") or {}).get("Name", "unknown"))
            lifecycle = str(instance.get("InstanceLifecycle") or "on-demand")
            wrong = []
            if lifecycle != "spot":
                wrong.append(f"is {lifecycle}, not spot")
            if state != "running":
                wrong.append(f"is {state}, not running")
            if wrong:
                problems.append(f"{instance_id} " + " and ".join(wrong))
                continue
            account_id = account_id or owner
            checked.append(
                SpotInstance(
                    instance_id=instance_id,
                    arn=f"arn:{self.partition}:ec2:{self.region}:{owner}:instance/{instance_id}",
                    instance_type=str(instance.get("InstanceType", "?")),
                    zone=str((instance.get("Placement") or {}).get("AvailabilityZone", "?")),
                )
            )
        if problems:
            count = f"{len(problems)} of {len(instance_ids)} instances"
            raise FisInputError(f"cannot interrupt {count}: " + "; ".join(problems))
        return account_id, checked

    async def ensure_role(self, account_id: str) -> tuple[str, bool]:
        """(role ARN, whether it was created now) of the experiment role."""
        name = self.role_name
        role = await self._get_role(name)
        created = False
        if role is None:
            try:
                role = (
                    await self._iam.call(
                        "CreateRole",
                        RoleName=name,
                        AssumeRolePolicyDocument=json.dumps(trust_policy(account_id)),
                        Description="Lets AWS FIS send spot interruptions for spotwright interrupt",
                        Tags=[{"Key": key, "Value": value} for key, value in TAGS.items()],
                    )
                )["Role"]
                created = True
            except CloudError as exc:
                if exc.code != "EntityAlreadyExists":  # else made meanwhile by another run
                    raise FisError(
                        f"cannot create the IAM role {name}: {exc.code}: {exc.message}"
                    ) from None
                role = await self._get_role(name)
                if role is None:
                    raise FisError(f"the IAM role {name} exists but cannot be read") from None
        elif not is_ours(role.get("Tags")):
            if not trusts_fis(role.get("AssumeRolePolicyDocument")):
                raise FisInputError(
                    f"the IAM role {name} exists, is not spotwright's and does not let "
                    f"{FIS_PRINCIPAL} assume it; give another --role-name"
                )
            self._say(f"IAM role {name}: using it as it is (not created by spotwright)")
            return str(role["Arn"]), False
        with _step(f"write the inline policy of the IAM role {name}"):
            await self._iam.call(
                "PutRolePolicy",
                RoleName=name,
                PolicyName=ROLE_POLICY_NAME,
                PolicyDocument=json.dumps(role_policy(self.partition, account_id)),
            )
        self._say(f"IAM role {name}: {'created' if created else 'reused'} ({role['Arn']})")
        return str(role["Arn"]), created

    async def _get_role(self, name: str) -> dict[str, Any] | None:
        try:
            role: dict[str, Any] = (await self._iam.call("GetRole", RoleName=name))["Role"]
        except CloudError as exc:
            if exc.code == "NoSuchEntity":
                return None
            raise FisError(
                f"cannot look up the IAM role {name}: {exc.code}: {exc.message}"
            ) from None
        return role

    async def _experiment(self, template_id: str) -> tuple[str, float, str, str]:
        """Start the experiment and follow it: (id, start, last status, its reason)."""
        with _step("start the FIS experiment"):
            experiment = (
                await self._fis.call(
                    "StartExperiment",
                    clientToken=uuid.uuid4().hex,
                    experimentTemplateId=template_id,
                    tags=dict(TAGS),
                )
            )["experiment"]
        experiment_id = str(experiment["id"])
        started = self._clock.now()
        log.info("experiment started", experiment_id=experiment_id, template_id=template_id)
        deadline = started + self._timeout
        last = ""
        status = ""
        try:
            self._on_started(experiment_id, started)
            while True:
                state = experiment.get("state") or {}
                status = str(state.get("status") or "unknown")
                reason = str(state.get("reason") or "")
                if status != last:
                    because = f" ({reason})" if reason else ""
                    self._say(f"experiment {experiment_id}: {status}{because}")
                    last = status
                if status in TERMINAL_STATES:
                    return experiment_id, started, status, reason
                remaining = deadline - self._clock.now()
                if remaining <= 0:
                    late = f"not finished after {format_duration(self._timeout)}"
                    await self._stop(experiment_id, late)
                    return experiment_id, started, "timeout", f"{late}; stopped it"
                await self._clock.sleep(min(self._poll, remaining))
                with _step(f"follow the FIS experiment {experiment_id}"):
                    experiment = (await self._fis.call("GetExperiment", id=experiment_id))[
                        "experiment"
                    ]
        except BaseException:
            if status not in TERMINAL_STATES:
                await self._stop(experiment_id, "interrupted while following it")
            raise

    async def _stop(self, experiment_id: str, why: str) -> None:
        """Stop the experiment, best effort: a failure is reported, not raised."""
        self._say(f"experiment {experiment_id}: stopping it, {why}")
        try:
            await self._fis.call("StopExperiment", id=experiment_id)
        except CloudError as exc:
            self._say(f"experiment {experiment_id}: could not stop it: {exc.code}: {exc.message}")

    async def _delete_template(self, template_id: str) -> bool:
        """Delete the template, best effort, so it never hides how the experiment went."""
        try:
            await self._fis.call("DeleteExperimentTemplate", id=template_id)
        except CloudError as exc:
            self._say(
                f"experiment template {template_id}: could not delete it ({exc.code}: "
                f"{exc.message}); delete it with: aws fis delete-experiment-template "
                f"--id {template_id} --region {self.region}"
            )
            return False
        self._say(f"experiment template {template_id}: deleted")
        return True
