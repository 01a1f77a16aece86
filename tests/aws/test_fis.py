"""``spotwright interrupt --to fis`` against moto in server mode (real boto3 over HTTP).

Everything is real moto except one answer: the instances are moto EC2 spot instances
(``run_instances`` with spot market options), the experiment role is created, read and
reused in moto IAM, and moto FIS (5.2.5) creates and deletes the templates, starts the
experiments and moves them through pending, initiating, running and completed, one state
per GetExperiment, and to stopping and stopped on StopExperiment.

Injection point. moto never lets an experiment fail, so ``test_a_failed_experiment_...``
answers one GetExperiment itself: ``awsfakes.Injector`` registers a handler for
``before-send.fis.GetExperiment`` on the FIS client, and botocore parses the canned
rest-json body (``_failed_experiment``) as it would parse FIS's. Every other call of that
test, the template's deletion included, goes to moto.

Following an experiment waits on the injected clock (``StepClock``), so nothing here
sleeps; the CLI tests switch moto's experiments to reach their final state at once
(moto's state-manager API) or give a timeout of zero.
"""

from __future__ import annotations

import ast
import asyncio
import json
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from awsfakes import REGION, Injector, http_response, run

from spotwright.adapters.aws import iam_policy
from spotwright.adapters.aws._operations import (
    INTERRUPTER_OPERATIONS,
    INTERRUPTER_TAG,
    OPERATIONS,
)
from spotwright.adapters.aws.fis import (
    ACTION_ID,
    ROLE_POLICY_NAME,
    ROLE_PROPAGATION_SECONDS,
    FisClients,
    FisInputError,
    duration_before_interruption,
)
from spotwright.interrupter import InterruptError, InterruptPlan, Sent, interrupt_fis

ROOT = Path(__file__).resolve().parents[2]
ACCOUNT = "123456789012"  # moto's


class StepClock:
    """A clock whose sleeps return at once, moving time on by what was asked."""

    def __init__(self) -> None:
        self.time = 1_767_225_600.0  # 2026-01-01T00:00:00Z
        self.slept: list[float] = []

    def now(self) -> float:
        return self.time

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.time += max(0.0, seconds)
        await asyncio.sleep(0)


@pytest.fixture
def clients(client: Callable[..., Any]) -> FisClients:
    return FisClients(client("ec2"), client("iam"), client("fis"))


@pytest.fixture
def iam(client: Callable[..., Any]) -> Any:
    """An IAM client for the tests' own setup, apart from the one a run counts calls on."""
    return client("iam")


@pytest.fixture
def role_name() -> str:
    """A role of its own per test: moto's IAM is shared by the whole session."""
    return f"fis-test-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def image(moto_endpoint: str, boto_session: Any) -> str:
    """An AMI moto knows, looked up once: moto lists all its images slowly."""
    from spotwright.adapters.aws import make_client

    ec2 = make_client("ec2", region=REGION, endpoint_url=moto_endpoint, session=boto_session)
    return str(ec2.describe_images()["Images"][0]["ImageId"])


@pytest.fixture
def launch(client: Callable[..., Any], image: str) -> Iterator[Callable[..., list[str]]]:
    """``launch(count, spot=True)``: instance ids, running; terminated after the test."""
    ec2 = client("ec2")
    launched: list[str] = []

    def make(count: int = 1, *, spot: bool = True) -> list[str]:
        extra: dict[str, Any] = {"InstanceMarketOptions": {"MarketType": "spot"}} if spot else {}
        answer = ec2.run_instances(
            ImageId=image, InstanceType="m5.large", MinCount=count, MaxCount=count, **extra
        )
        ids = [instance["InstanceId"] for instance in answer["Instances"]]
        launched.extend(ids)
        return ids

    yield make
    if launched:
        ec2.terminate_instances(InstanceIds=launched)


class Run:
    """One ``interrupt_fis`` on moto: what it printed, sent and waited."""

    def __init__(self, clients: FisClients, role_name: str) -> None:
        self.clients = clients
        self.role_name = role_name
        self.clock = StepClock()
        self.lines: list[str] = []
        self.sent: list[Sent] = []
        self.fis = Injector(clients.fis).watch("CreateExperimentTemplate")
        self.iam = Injector(clients.iam).watch("CreateRole").watch("PutRolePolicy")
        for operation in ("StartExperiment", "GetExperiment", "StopExperiment"):
            self.fis.watch(operation)
        self.fis.watch("DeleteExperimentTemplate")

    def __call__(
        self,
        instance_ids: list[str],
        *,
        delay: float = 15.0,
        on_line: Callable[[str], None] = lambda _: None,
        **options: Any,
    ) -> list[Sent]:
        def progress(line: str) -> None:
            self.lines.append(line)
            on_line(line)

        plan = InterruptPlan(tuple(instance_ids), delay=delay)
        return run(
            interrupt_fis(
                plan,
                role_name=self.role_name,
                on_sent=self.sent.append,
                on_progress=progress,
                clock=self.clock,
                clients=self.clients,
                **options,
            )
        )

    @property
    def template_request(self) -> dict[str, Any]:
        [request] = self.fis.params["CreateExperimentTemplate"]
        return request

    def template_id(self) -> str:
        line = next(line for line in self.lines if line.startswith("experiment template "))
        return line.split()[2].rstrip(":")

    def experiment_id(self) -> str:
        return self.sent[0].reference.removeprefix("FIS experiment ")

    def states(self) -> list[str]:
        return [
            line.split(": ", 1)[1].split(" (")[0]
            for line in self.lines
            if line.startswith("experiment ") and not line.startswith("experiment template")
        ]


@pytest.fixture
def fis_run(clients: FisClients, role_name: str) -> Run:
    return Run(clients, role_name)


def template_exists(clients: FisClients, template_id: str) -> bool:
    try:
        clients.fis.get_experiment_template(id=template_id)
    except clients.fis.exceptions.ResourceNotFoundException:
        return False
    return True


# -- a run that completes ------------------------------------------------------------------


def test_spot_instances_are_interrupted_through_an_fis_experiment(
    fis_run: Run, launch: Callable[..., list[str]], clients: FisClients, role_name: str
) -> None:
    ids = launch(2)
    sent = fis_run(ids, delay=15)

    request = fis_run.template_request
    arns = [f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/{i}" for i in ids]
    assert request["targets"] == {
        "spotInstances0": {
            "resourceType": "aws:ec2:spot-instance",
            "resourceArns": arns,
            "selectionMode": "ALL",
        }
    }
    [action] = request["actions"].values()
    assert action["actionId"] == ACTION_ID == "aws:ec2:send-spot-instance-interruptions"
    assert action["parameters"] == {"durationBeforeInterruption": "PT2M15S"}
    assert action["targets"] == {"SpotInstances": "spotInstances0"}
    assert request["stopConditions"] == [{"source": "none"}]
    assert request["roleArn"] == f"arn:aws:iam::{ACCOUNT}:role/{role_name}"
    assert request["tags"][INTERRUPTER_TAG[0]] == INTERRUPTER_TAG[1]

    # started once, followed state by state on the clock, every 5 s, after the role's wait
    assert fis_run.fis.sent["StartExperiment"] == 1
    assert fis_run.states() == ["pending", "initiating", "running", "completed"]
    assert fis_run.fis.sent["GetExperiment"] == 3
    assert fis_run.clock.slept == [ROLE_PROPAGATION_SECONDS, 5.0, 5.0, 5.0]
    assert fis_run.fis.sent["StopExperiment"] == 0
    experiment = clients.fis.get_experiment(id=fis_run.experiment_id())["experiment"]
    assert experiment["state"]["status"] == "completed"
    assert experiment["tags"][INTERRUPTER_TAG[0]] == INTERRUPTER_TAG[1]

    # the template is gone
    assert fis_run.fis.sent["DeleteExperimentTemplate"] == 1
    assert not template_exists(clients, fis_run.template_id())
    assert fis_run.lines[-1] == f"experiment template {fis_run.template_id()}: deleted"

    # the signals: the recommendation at the start, the notice 15 s later, per instance
    assert sent == fis_run.sent
    assert [(s.instance_id, s.kind) for s in sent] == [
        (ids[0], "EC2 Instance Rebalance Recommendation"),
        (ids[1], "EC2 Instance Rebalance Recommendation"),
        (ids[0], "EC2 Spot Instance Interruption Warning"),
        (ids[1], "EC2 Spot Instance Interruption Warning"),
    ]
    assert sent[2].at - sent[0].at == 15.0
    assert sent[0].at == StepClock().time + ROLE_PROPAGATION_SECONDS  # after the role's wait
    assert "EC2 would terminate it at" in sent[2].describe()


def test_the_role_is_created_trusting_fis_for_this_account_and_tagged(
    fis_run: Run, launch: Callable[..., list[str]], clients: FisClients, role_name: str
) -> None:
    fis_run(launch(1), delay=0)
    role = clients.iam.get_role(RoleName=role_name)["Role"]
    [statement] = role["AssumeRolePolicyDocument"]["Statement"]
    assert statement["Principal"] == {"Service": "fis.amazonaws.com"}
    assert statement["Action"] == "sts:AssumeRole"
    assert statement["Condition"] == {"StringEquals": {"aws:SourceAccount": ACCOUNT}}
    assert {"Key": INTERRUPTER_TAG[0], "Value": INTERRUPTER_TAG[1]} in role["Tags"]
    document = clients.iam.get_role_policy(RoleName=role_name, PolicyName=ROLE_POLICY_NAME)[
        "PolicyDocument"
    ]
    grants = {s["Action"]: s["Resource"] for s in document["Statement"]}
    assert grants == {
        "ec2:SendSpotInstanceInterruptions": f"arn:aws:ec2:*:{ACCOUNT}:instance/*",
        "ec2:DescribeInstances": "*",
    }
    assert any(f"IAM role {role_name}: created" in line for line in fis_run.lines)
    assert fis_run.template_request["actions"]["interrupt0"]["parameters"] == {
        "durationBeforeInterruption": "PT2M"
    }


def test_an_existing_role_is_reused_not_duplicated(
    client: Callable[..., Any],
    clients: FisClients,
    role_name: str,
    launch: Callable[..., list[str]],
) -> None:
    # each run with clients of its own, so each counts only its own calls
    again = FisClients(client("ec2"), client("iam"), client("fis"))
    first, second = Run(clients, role_name), Run(again, role_name)
    ids = launch(1)
    first(ids)
    second(ids)
    assert first.iam.sent["CreateRole"] == 1
    assert second.iam.sent["CreateRole"] == 0
    assert second.iam.sent["PutRolePolicy"] == 1  # its permissions kept current
    assert ROLE_PROPAGATION_SECONDS not in second.clock.slept  # no wait for a known role
    assert any(f"IAM role {role_name}: reused" in line for line in second.lines)
    names = [r["RoleName"] for r in clients.iam.list_roles()["Roles"]]
    assert names.count(role_name) == 1
    assert first.template_request["roleArn"] == second.template_request["roleArn"]


def test_a_role_of_someone_else_is_used_as_it_is_if_fis_may_assume_it(
    fis_run: Run, iam: Any, role_name: str, launch: Callable[..., list[str]]
) -> None:
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "fis.amazonaws.com"},
                "Action": "sts:AssumeRole",
            }
        ],
    }
    arn = iam.create_role(RoleName=role_name, AssumeRolePolicyDocument=json.dumps(trust))["Role"][
        "Arn"
    ]
    fis_run(launch(1))
    assert fis_run.iam.sent["CreateRole"] == 0
    assert fis_run.iam.sent["PutRolePolicy"] == 0  # not ours to change
    assert fis_run.template_request["roleArn"] == arn
    assert iam.list_role_policies(RoleName=role_name)["PolicyNames"] == []


def test_a_role_fis_may_not_assume_is_refused_before_anything_is_created(
    fis_run: Run, iam: Any, role_name: str, launch: Callable[..., list[str]]
) -> None:
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "ec2.amazonaws.com"},
                "Action": "sts:AssumeRole",
            }
        ],
    }
    iam.create_role(RoleName=role_name, AssumeRolePolicyDocument=json.dumps(trust))
    with pytest.raises(ValueError, match=f"{role_name} exists, is not spotwright's"):
        fis_run(launch(1))
    assert "CreateExperimentTemplate" not in fis_run.fis.sent


def test_no_clean_keeps_the_template_and_many_instances_go_five_per_target(
    fis_run: Run, launch: Callable[..., list[str]], clients: FisClients
) -> None:
    ids = launch(7)
    fis_run(ids, delay=60, clean=False)
    assert "DeleteExperimentTemplate" not in fis_run.fis.sent
    template = clients.fis.get_experiment_template(id=fis_run.template_id())["experimentTemplate"]
    assert fis_run.lines[-1] == f"experiment template {fis_run.template_id()}: kept (--no-clean)"
    arn = f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/"
    assert template["targets"] == {
        "spotInstances0": {
            "resourceType": "aws:ec2:spot-instance",
            "resourceArns": [arn + i for i in ids[:5]],
            "selectionMode": "ALL",
        },
        "spotInstances1": {
            "resourceType": "aws:ec2:spot-instance",
            "resourceArns": [arn + i for i in ids[5:]],
            "selectionMode": "ALL",
        },
    }
    assert {name: a["targets"] for name, a in template["actions"].items()} == {
        "interrupt0": {"SpotInstances": "spotInstances0"},
        "interrupt1": {"SpotInstances": "spotInstances1"},
    }
    for action in template["actions"].values():
        assert action["actionId"] == ACTION_ID
        assert action["parameters"] == {"durationBeforeInterruption": "PT3M"}
    assert template["stopConditions"] == [{"source": "none"}]
    assert template["tags"][INTERRUPTER_TAG[0]] == INTERRUPTER_TAG[1]
    clients.fis.delete_experiment_template(id=fis_run.template_id())


# -- instances that cannot be interrupted ---------------------------------------------------


@pytest.mark.parametrize("problem", ["on-demand", "stopped", "unknown"])
def test_an_instance_that_is_not_a_running_spot_instance_is_named(
    problem: str,
    fis_run: Run,
    launch: Callable[..., list[str]],
    clients: FisClients,
) -> None:
    good = launch(1)[0]
    if problem == "on-demand":
        bad, expected = launch(1, spot=False)[0], "is on-demand, not spot"
    elif problem == "stopped":
        bad, expected = launch(1)[0], "is stopped, not running"
        clients.ec2.stop_instances(InstanceIds=[bad])
    else:
        bad, expected = "i-0123456789abcdef0", f"does not exist in {REGION}"
    with pytest.raises(FisInputError, match=f"cannot interrupt 1 of 2 instances: {bad} {expected}"):
        fis_run([good, bad])
    # nothing was created: no role, no template
    assert not fis_run.iam.sent
    assert not fis_run.fis.sent
    with pytest.raises(clients.iam.exceptions.NoSuchEntityException):
        clients.iam.get_role(RoleName=fis_run.role_name)


def test_every_offender_is_named_at_once(
    fis_run: Run, launch: Callable[..., list[str]], clients: FisClients
) -> None:
    on_demand = launch(1, spot=False)[0]
    stopped = launch(1, spot=False)[0]
    clients.ec2.stop_instances(InstanceIds=[stopped])
    with pytest.raises(FisInputError) as caught:
        fis_run([on_demand, stopped, "i-0fedcba9876543210"])
    assert str(caught.value) == (
        "cannot interrupt 3 of 3 instances: "
        f"{on_demand} is on-demand, not spot; "
        f"{stopped} is on-demand, not spot and is stopped, not running; "
        f"i-0fedcba9876543210 does not exist in {REGION}"
    )


# -- runs that do not complete ---------------------------------------------------------------


def _failed_experiment(reason: str) -> Any:
    body = {
        "experiment": {
            "id": "EXPinjected",
            "state": {"status": "failed", "reason": reason},
        }
    }
    return http_response(200, json.dumps(body), "application/json")


def test_a_failed_experiment_is_an_error_and_the_template_is_still_deleted(
    fis_run: Run, launch: Callable[..., list[str]], clients: FisClients
) -> None:
    fis_run.fis.answer("GetExperiment", _failed_experiment("Target resolution failed"))
    with pytest.raises(InterruptError, match="failed: Target resolution failed"):
        fis_run(launch(1))
    assert fis_run.states() == ["pending", "failed"]
    assert fis_run.fis.sent["DeleteExperimentTemplate"] == 1
    assert not template_exists(clients, fis_run.template_id())
    assert fis_run.fis.sent["StopExperiment"] == 0  # it is over already


def test_an_experiment_stopped_elsewhere_is_an_error(
    fis_run: Run, launch: Callable[..., list[str]], clients: FisClients
) -> None:
    def stop_when_running(line: str) -> None:
        if line.endswith(": running (Experiment is running)"):
            clients.fis.stop_experiment(id=fis_run.experiment_id())

    with pytest.raises(InterruptError, match="stopped"):
        fis_run(launch(1), on_line=stop_when_running)
    assert fis_run.states()[-1] == "stopped"
    assert not template_exists(clients, fis_run.template_id())


def test_a_timeout_stops_the_experiment_and_deletes_the_template(
    fis_run: Run, launch: Callable[..., list[str]], clients: FisClients
) -> None:
    with pytest.raises(InterruptError, match=r"timed out: not finished after 7s; stopped it"):
        fis_run(launch(1), timeout=7.0)
    # 5 s, then the 2 s left; then the deadline
    assert fis_run.clock.slept[1:] == [5.0, 2.0]
    assert fis_run.fis.sent["StopExperiment"] == 1
    status = clients.fis.get_experiment(id=fis_run.experiment_id())["experiment"]["state"]
    assert status["status"] in {"stopping", "stopped"}
    assert not template_exists(clients, fis_run.template_id())


def test_being_cancelled_while_following_stops_the_experiment_and_cleans_up(
    fis_run: Run, launch: Callable[..., list[str]], clients: FisClients
) -> None:
    def cancel_when_initiating(line: str) -> None:
        if ": initiating" in line:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()

    with pytest.raises(asyncio.CancelledError):
        fis_run(launch(1), on_line=cancel_when_initiating)
    assert fis_run.fis.sent["StopExperiment"] == 1
    assert not template_exists(clients, fis_run.template_id())


def test_a_refused_start_is_an_error_and_the_template_is_still_deleted(
    fis_run: Run, launch: Callable[..., list[str]], clients: FisClients
) -> None:
    refusal = http_response(
        400,
        json.dumps({"message": "The role cannot be assumed"}),
        "application/json",
    )
    refusal.headers["x-amzn-ErrorType"] = "ValidationException"
    fis_run.fis.answer("StartExperiment", refusal)
    with pytest.raises(InterruptError, match="cannot start the FIS experiment: Validation"):
        fis_run(launch(1))
    assert not template_exists(clients, fis_run.template_id())


# -- input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("delay", "duration"),
    [
        (0, "PT2M"),
        (15, "PT2M15S"),
        (15.4, "PT2M15S"),
        (60, "PT3M"),
        (100, "PT3M40S"),
        (780, "PT15M"),
    ],
)
def test_duration_before_interruption_is_the_notice_plus_two_minutes(
    delay: float, duration: str
) -> None:
    assert duration_before_interruption(delay) == duration


@pytest.mark.parametrize("delay", [-1.0, 781.0, 3600.0])
def test_a_delay_fis_cannot_give_is_refused(delay: float) -> None:
    with pytest.raises(FisInputError, match="PT2M to PT15M"):
        duration_before_interruption(delay)


def test_fis_takes_no_rebalance_first(clients: FisClients) -> None:
    plan = InterruptPlan(("i-0123456789abcdef0",), delay=30, rebalance_first=10)
    with pytest.raises(ValueError, match="sends the rebalance recommendation itself"):
        run(interrupt_fis(plan, clients=clients, clock=StepClock()))


# -- the command ------------------------------------------------------------------------------


def cli(moto_endpoint: str, *args: str) -> Any:
    """The click command in this process, its AWS calls sent to moto by AWS_ENDPOINT_URL."""
    import structlog
    from click.testing import CliRunner

    from spotwright.cli import cli as command

    saved = structlog.get_config()
    try:
        return CliRunner().invoke(
            command, ["interrupt", *args], env={"AWS_ENDPOINT_URL": moto_endpoint}
        )
    finally:
        structlog.configure(**saved)


def _moto_api(moto_endpoint: str, action: str, body: dict[str, Any]) -> None:
    request = urllib.request.Request(
        f"{moto_endpoint}/moto-api/state-manager/{action}",
        data=json.dumps(body).encode(),
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert 200 <= answer.status < 300


@pytest.fixture
def experiments_finish_at_once(moto_endpoint: str) -> Iterator[None]:
    """moto's experiments go straight to their last state, so the command never waits."""
    model = {"model_name": "fis::experiment"}
    _moto_api(
        moto_endpoint, "set-transition", {**model, "transition": {"progression": "immediate"}}
    )
    yield
    _moto_api(moto_endpoint, "unset-transition", model)


@pytest.fixture
def own_role(iam: Any, role_name: str) -> str:
    """A role spotwright made before, so the command has no new role to wait for."""
    trust = {"Version": "2012-10-17", "Statement": []}
    iam.create_role(
        RoleName=role_name,
        AssumeRolePolicyDocument=json.dumps(trust),
        Tags=[{"Key": INTERRUPTER_TAG[0], "Value": INTERRUPTER_TAG[1]}],
    )
    return role_name


def test_the_command_defaults_to_fis_and_exits_0_when_it_completed(
    moto_endpoint: str,
    launch: Callable[..., list[str]],
    own_role: str,
    experiments_finish_at_once: None,
    clients: FisClients,
) -> None:
    [instance] = launch(1)
    result = cli(moto_endpoint, "-i", instance, "--delay", "15s", "--role-name", own_role)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"{instance}: running spot instance (m5.large in {REGION}a)"
    assert lines[1].startswith(f"IAM role {own_role}: reused (arn:aws:iam::{ACCOUNT}:role/")
    assert "durationBeforeInterruption PT2M15S" in lines[2]
    assert lines[3].startswith(f"{instance}: rebalance recommendation at ")
    assert lines[4].startswith(f"{instance}: spot interruption warning at ")
    assert lines[5].endswith(": completed (Experiment completed)")
    template_id = lines[2].split()[2].rstrip(":")
    assert lines[6] == f"experiment template {template_id}: deleted"
    assert not template_exists(clients, template_id)


def test_the_command_exits_2_naming_an_instance_that_is_not_spot(
    moto_endpoint: str, launch: Callable[..., list[str]], role_name: str
) -> None:
    [instance] = launch(1, spot=False)
    result = cli(moto_endpoint, "-i", instance, "--role-name", role_name)
    assert result.exit_code == 2
    assert f"spotwright: fis: cannot interrupt 1 of 1 instances: {instance} is on-demand" in (
        result.stderr
    )
    assert "Traceback" not in result.output


def test_the_command_exits_1_when_the_experiment_does_not_finish_in_time(
    moto_endpoint: str, launch: Callable[..., list[str]], own_role: str, clients: FisClients
) -> None:
    result = cli(moto_endpoint, "-i", launch(1)[0], "--role-name", own_role, "--timeout", "0s")
    assert result.exit_code == 1, result.output
    assert "timed out: not finished after 0s; stopped it" in result.stderr
    assert ": stopping it, not finished after 0s" in result.stdout
    template_id = next(
        line.split()[2].rstrip(":")
        for line in result.stdout.splitlines()
        if line.startswith("experiment template")
    )
    assert not template_exists(clients, template_id)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--rebalance-first", "5s"], "--rebalance-first does not apply to --to fis"),
        (["http://127.0.0.1:1338"], "--to fis takes no TARGET"),
        (["--delay", "14m"], "PT2M to PT15M"),
        (["--to", "imds-mock", "http://h", "--no-clean"], "apply to --to fis only"),
        (["--timeout", "soon"], "--timeout:"),
    ],
)
def test_the_command_refuses_what_fis_cannot_do(
    moto_endpoint: str, args: list[str], fragment: str
) -> None:
    result = cli(moto_endpoint, "-i", "i-0123456789abcdef0", *args)
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr


# -- the interrupter's IAM policy ------------------------------------------------------------


def test_checked_in_interrupter_policy_matches_the_generator(tmp_path: Path) -> None:
    shipped = (ROOT / "deploy" / "iam-policy-interrupter.json").read_text(encoding="utf-8")
    assert shipped == iam_policy.interrupter_policy_json(), (
        "deploy/iam-policy-interrupter.json is stale: run python -m "
        "spotwright.adapters.aws.iam_policy --interrupter --out deploy/iam-policy-interrupter.json"
    )
    assert iam_policy.main(["--interrupter", "--out", str(tmp_path / "p.json")]) == 0
    assert (tmp_path / "p.json").read_text(encoding="utf-8") == shipped


def _operations_named_in(path: Path) -> set[str]:
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"call", "collect"}
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            named.add(node.args[0].value)
    return named


def test_the_interrupter_calls_exactly_its_declared_operations_and_stays_apart() -> None:
    package = ROOT / "src" / "spotwright" / "adapters" / "aws"
    named = _operations_named_in(package / "fis.py")
    assert named == {operation for _, operation in INTERRUPTER_OPERATIONS}
    # the controller's side neither names them nor grants them (DescribeInstances is shared)
    controller = set().union(
        *(_operations_named_in(p) for p in package.glob("*.py") if p.name != "fis.py")
    )
    only_ours = {op for (_, op) in INTERRUPTER_OPERATIONS} - {op for (_, op) in OPERATIONS}
    assert only_ours and not controller & only_ours
    controller_policy = iam_policy.policy_json()
    assert "fis:" not in controller_policy
    assert "iam:CreateRole" not in controller_policy and "FisRoleName" not in controller_policy


def test_the_interrupter_policy_is_least_privilege() -> None:
    statements = json.loads(iam_policy.interrupter_policy_json())["Statement"]
    assert len({s["Sid"] for s in statements}) == len(statements)
    for statement in statements:
        assert statement["Effect"] == "Allow"
        assert all(":" in a and "*" not in a for a in statement["Action"])
        writes = [
            a for a in statement["Action"] if not a.split(":")[1].startswith(("Describe", "Get"))
        ]
        if writes:
            assert statement["Resource"] != "*", statement["Sid"]
    by_action: dict[str, list[dict[str, Any]]] = {}
    for statement in statements:
        for action in statement["Action"]:
            by_action.setdefault(action, []).append(statement)
    # what spotwright did not create, it may neither change nor delete
    for action in ("iam:PutRolePolicy", "fis:DeleteExperimentTemplate", "fis:StopExperiment"):
        [statement] = by_action[action]
        assert statement["Condition"] == {
            "StringEquals": {f"aws:ResourceTag/{INTERRUPTER_TAG[0]}": INTERRUPTER_TAG[1]}
        }
    [passing] = by_action["iam:PassRole"]
    assert passing["Condition"] == {"StringEquals": {"iam:PassedToService": "fis.amazonaws.com"}}
    assert passing["Resource"].endswith(":role/${FisRoleName}")
