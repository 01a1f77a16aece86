"""``spotwright events decode`` as a user runs it: output, per-payload errors, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

SQS = Path(__file__).parent / "data" / "events"
IMDS = Path(__file__).parent / "data" / "imds"


def decode(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spotwright", "events", "decode", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def items(result: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert "Traceback" not in result.stderr
    document = json.loads(result.stdout)
    found: list[dict[str, Any]] = document["items"]
    assert document["decoded"] + document["failed"] == len(found)
    return found


def test_a_queue_message_file() -> None:
    result = decode(str(SQS / "spot_interruption.json"), "--json")
    assert result.returncode == 0, result.stderr
    (item,) = items(result)
    assert item["source"] == "sqs"
    (event,) = item["events"]
    assert event["kind"] == "spot_interruption"
    assert event["instance_id"] == "i-0a1b2c3d4e5f60718"
    assert event["start"] == "2025-03-04T10:15:30Z"
    assert event["deadline"] == "2025-03-04T10:17:30Z"
    assert event["plan"]["action"] == "cordon-and-drain"
    assert event["plan"]["steps"][-1] == "drain"
    assert event["plan"]["deadline"] == "2025-03-04T10:17:30Z"
    assert event["plan"]["taint"] == "karpenter.sh/disrupted:NoSchedule"


def test_an_array_of_imds_bodies_told_apart_by_shape(tmp_path: Path) -> None:
    payloads = [
        json.loads((IMDS / "spot_instance_action.json").read_text()),
        json.loads((IMDS / "rebalance_recommendation.json").read_text()),
        json.loads((IMDS / "maintenance_ended.json").read_text()),
        json.loads((IMDS / "target_lifecycle_state.json").read_text()),
        "InService",
    ]
    path = tmp_path / "bodies.json"
    path.write_text(json.dumps(payloads))
    result = decode(str(path), "--json", "--instance-id", "i-0123456789abcdef0", "--node", "node-a")
    assert result.returncode == 0, result.stderr
    found = items(result)
    assert [i["path"] for i in found] == [
        "spot/instance-action",
        "events/recommendations/rebalance",
        "events/maintenance/scheduled",
        "autoscaling/target-lifecycle-state",
        "autoscaling/target-lifecycle-state",
    ]
    kinds = [[(e["kind"], e["plan"]["action"]) for e in i["events"]] for i in found]
    assert kinds == [
        [("spot_interruption", "cordon-and-drain")],
        [("rebalance_recommendation", "replace-then-drain")],
        [("scheduled_change_canceled", "uncordon"), ("scheduled_change_completed", "uncordon")],
        [("asg_lifecycle_terminate", "cordon-and-drain")],
        [],
    ]
    spot = found[0]["events"][0]
    assert spot["instance_id"] == "i-0123456789abcdef0" and spot["node"] == "node-a"
    assert spot["source"] == "imds"


def test_a_single_maintenance_list_is_one_payload() -> None:
    result = decode(str(IMDS / "maintenance_scheduled.json"), "--json", "--source", "imds")
    assert result.returncode == 0, result.stderr
    (item,) = items(result)
    (event,) = item["events"]
    assert event["kind"] == "scheduled_change"
    assert event["deadline"] == "2025-03-07T06:00:00Z"


def test_good_and_malformed_payloads_mixed(tmp_path: Path) -> None:
    spot = json.loads((SQS / "spot_interruption.json").read_text())
    broken = json.loads((SQS / "spot_interruption.json").read_text())
    del broken["detail"]["instance-id"]
    unknown = dict(spot, **{"detail-type": "EC2 Instance Daydream"})
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps([spot, broken, {"action": "explode"}, unknown, 42]))
    result = decode(str(path), "--json")
    assert result.returncode == 1
    found = items(result)
    assert "events" in found[0] and found[0]["events"][0]["kind"] == "spot_interruption"
    assert found[1]["error"] == "malformed" and "'instance-id'" in found[1]["reason"]
    assert found[2]["error"] == "malformed" and "spot/instance-action" in found[2]["reason"]
    assert found[3]["error"] == "unknown" and "Daydream" in found[3]["reason"]
    assert found[4]["error"] == "unknown"
    assert "5 payload(s): 1 decoded, 4 failed" in result.stderr


def test_json_lines_on_standard_input_in_text_form() -> None:
    lines = [
        (SQS / "rebalance_recommendation.json").read_text().replace("\n", " "),
        "{not json",
        (IMDS / "spot_instance_action.json").read_text().strip(),
    ]
    result = decode("-", stdin="\n".join(lines) + "\n")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    out = result.stdout
    assert "payload 1 at line 1 (sqs): 1 event(s)" in out
    assert "action replace-then-drain" in out
    assert "payload 2 at line 2: malformed: not JSON" in out
    assert "payload 3 at line 3 (imds spot/instance-action)" in out
    assert "drain by 2025-03-04T10:17:30Z, then force" in out


def test_plain_text_imds_bodies_with_source_imds() -> None:
    result = decode("--source", "imds", "--json", stdin="Terminated\n2025-03-04T10:17:30Z\n")
    assert result.returncode == 0, result.stderr
    found = items(result)
    assert [i["path"] for i in found] == [
        "autoscaling/target-lifecycle-state",
        "spot/termination-time",
    ]


def test_sqs_receive_message_output(tmp_path: Path) -> None:
    bodies = [(SQS / name).read_text() for name in ("spot_interruption.json", "health_issue.json")]
    path = tmp_path / "receive.json"
    path.write_text(
        json.dumps({"Messages": [{"MessageId": str(n), "Body": b} for n, b in enumerate(bodies)]})
    )
    result = decode(str(path), "--json")
    assert result.returncode == 0, result.stderr
    found = items(result)
    assert len(found[0]["events"]) == 1 and found[1]["events"] == []


def test_unreadable_input_exits_2_without_a_traceback(tmp_path: Path) -> None:
    missing = decode(str(tmp_path / "nope.json"))
    assert missing.returncode == 2
    assert missing.stderr.startswith("spotwright: ") and "nope.json" in missing.stderr
    directory = decode(str(tmp_path))
    assert directory.returncode == 2 and "Traceback" not in directory.stderr
    (tmp_path / "empty.json").write_text("\n")
    assert decode(str(tmp_path / "empty.json")).returncode == 2
    (tmp_path / "latin1.json").write_bytes(b'{"x": "\xe9"}')
    binary = decode(str(tmp_path / "latin1.json"))
    assert binary.returncode == 2 and "UTF-8" in binary.stderr
    bad_id = decode(str(SQS / "spot_interruption.json"), "--instance-id", "node-1")
    assert bad_id.returncode == 2 and "--instance-id" in bad_id.stderr
