"""A heavy-tier fault, driven only through ingest, reaches every channel exactly as promised:
one "opened / approval needed" message, then one "approved", then one "resolved".

Real server process (app + policy scheduler), real Celery worker process, PostgreSQL, a Redis of
our own, and a real HTTP server on 127.0.0.1 standing in for Slack, WeCom and the webhook
receiver. Reuses the policy integration harness (tests/harness/stack.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from sqlmodel import Session, select

from app.alerts.webhook import SIGNATURE_HEADER, TIMESTAMP_HEADER, verify_signature
from app.models.alert import AlertDelivery
from tests.harness import RedisServer
from tests.harness.stack import Stack, fast_policy
from tests.integration.policy.test_policy_scenarios import _checkpoint
from tests.unit.app.alerts._factories import SLACK_SECRET_PATH, WEBHOOK_SIGNING, WECOM_KEY
from tests.unit.app.alerts._recording_server import RecordingServer, wecom

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]
JOB = "grpo-a"
GROUP_WAIT_S = 2.0


def alerts_file(path: Path, server: RecordingServer, **extra: object) -> Path:
    base = server.url("")
    data = {
        "alerts": {
            "external_base_url": "https://rlguard.example.com",
            "group_wait_s": GROUP_WAIT_S,
            "claim_lease_s": 5,
            "retry_base_delay_s": 1,
            "channels": [
                {"type": "slack", "name": "oncall-slack", "url": base + SLACK_SECRET_PATH},
                {
                    "type": "wecom",
                    "name": "oncall-wecom",
                    "url": f"{base}/cgi-bin/webhook/send?key={WECOM_KEY}",
                    "locale": "zh",
                    "mentioned_mobile_list": ["13800138000"],
                },
                {
                    "type": "webhook",
                    "name": "pager",
                    "url": base + "/hook",
                    "signing_secret": WEBHOOK_SIGNING,
                },
            ],
            **extra,
        }
    }
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return path


@pytest.fixture
def alert_stack(
    tmp_path: Path, postgres_url: str, own_redis: RedisServer, server: RecordingServer
) -> Iterator[Stack]:
    # The storage fault's counter episode ends (8 s) before the approved restore finishes, and
    # no quiet period resolves the incident first: the scenario has one incident, start to end.
    policy = fast_policy(
        tmp_path / "policy.yaml",
        **{"incidents.quiet_period_seconds": 60, "detection.storage.error_window_seconds": 8},
    )
    s = Stack(tmp_path, database_url=postgres_url, redis=own_redis, policy=policy)
    s.env["RLGUARD_ALERTS_FILE"] = str(alerts_file(tmp_path / "alerts.yaml", server))
    # The restore takes a while, so "approved" and "resolved" fall in different group windows.
    s.env["RLGUARD_TEST_LAUNCHER_SLEEP"] = "restore_checkpoint=4"
    try:
        yield s
    finally:
        s.close()


def by_channel(server: RecordingServer) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {"slack": [], "wecom": [], "wecom-mention": [], "webhook": []}
    for r in server.requests:
        body = json.loads(r.body)
        if r.path == SLACK_SECRET_PATH:
            out["slack"].append(body)
        elif "key=" in r.path:
            out["wecom" if body["msgtype"] == "markdown" else "wecom-mention"].append(body)
        elif r.path == "/hook":
            out["webhook"].append(body)
    return out


def counts(server: RecordingServer) -> dict[str, int]:
    return {k: len(v) for k, v in by_channel(server).items()}


def test_heavy_incident_alerts_open_decided_resolved_once_each(
    alert_stack: Stack, server: RecordingServer
) -> None:
    stack = alert_stack
    server.default = wecom(
        0
    )  # a 200 with WeCom's JSON; Slack and the webhook only look at the status
    checkpoint = _checkpoint(stack.run_dir(JOB))
    stack.start_server()
    stack.start_worker("--node", "n0", "--node", "n1", "--cluster", "--concurrency", "2")
    f = stack.feeder
    f.participant("n0", "trainer", 0)
    f.participant("n1", "rollout", 0, phase="ROLLOUT")
    f.set("n0", "state_log_write_errors_total", 0, job=JOB, role="trainer", rank="0")
    f.start()
    stack.wait_baselines()  # the detectors saw the counter at its baseline
    f.set(
        "n0", "state_log_write_errors_total", 3, job=JOB, role="trainer", rank="0"
    )  # storage: heavy

    stack.wait(lambda: counts(server)["webhook"] >= 1, 60, "the first alert")
    time.sleep(
        GROUP_WAIT_S + 3
    )  # the scenario (absence): anything else of this window would have gone out by now
    hooks = [
        (b["incident_id"], b["kinds"], [e["event_id"] for e in b["events"]], b["fault_kind"])
        for b in by_channel(server)["webhook"]
    ]
    inc = stack.incident("storage_unwritable", JOB)
    assert counts(server) == {"slack": 1, "wecom": 1, "wecom-mention": 1, "webhook": 1}, (
        hooks,
        inc["timeline"],
        inc["actions"],
    )
    first = by_channel(server)
    assert first["webhook"][0]["kinds"] == ["opened", "approval_requested"]
    assert (
        first["webhook"][0]["tier"] == "heavy"
        and first["webhook"][0]["fault_kind"] == "storage_unwritable"
    )
    approval_id = first["webhook"][0]["approval"]["id"]
    assert (
        first["webhook"][0]["links"]["approval"]
        == f"https://rlguard.example.com/approvals/{approval_id}"
    )
    header = first["slack"][0]["blocks"][0]["text"]["text"]
    assert header.startswith("🔴 HEAVY") and "opened · approval needed" in header
    assert "等待审批" in first["wecom"][0]["markdown"]["content"]
    assert first["wecom-mention"][0]["text"]["mentioned_mobile_list"] == ["13800138000"]
    # Actions are read when the message is sent, not when the incident opened (none yet then).
    assert any(a.startswith("enter_safe_mode (") for a in first["webhook"][0]["actions_taken"])

    r = stack.post(f"/api/v1/approvals/{approval_id}/approve", json={"comment": "restore it"})
    assert r.status_code == 200, r.text
    stack.wait(lambda: counts(server)["webhook"] >= 2, 60, "the decision alert")
    decided = by_channel(server)["webhook"][1]
    assert decided["kinds"] == ["approval_decided"] and decided["approval"]["decided_by"] == "alice"
    stack.wait(
        lambda: stack.incident("storage_unwritable", JOB)["status"] == "resolved", 60, "resolution"
    )
    stack.wait(lambda: counts(server)["webhook"] >= 3, 60, "the resolution alert")
    time.sleep(GROUP_WAIT_S + 3)  # the scenario (absence): past the group window
    hooks = [
        (b["incident_id"], b["kinds"], [e["event_id"] for e in b["events"]], b["fault_kind"])
        for b in by_channel(server)["webhook"]
    ]
    inc = stack.incident("storage_unwritable", JOB)
    assert counts(server) == {"slack": 3, "wecom": 3, "wecom-mention": 1, "webhook": 3}, (
        hooks,
        inc["timeline"],
        inc["actions"],
    )
    final = by_channel(server)
    assert [b["kinds"] for b in final["webhook"]] == [
        ["opened", "approval_requested"],
        ["approval_decided"],
        ["resolved"],
    ]
    assert "Approved by alice: “restore it”" in json.dumps(final["slack"][1], ensure_ascii=False)
    assert final["slack"][2]["blocks"][0]["text"]["text"].startswith("✅ HEAVY")
    assert "已恢复" in final["wecom"][2]["markdown"]["content"]
    assert "restore_checkpoint (succeeded)" in final["webhook"][2]["actions_taken"]
    for req in (r for r in server.requests if r.path == "/hook"):
        assert verify_signature(
            WEBHOOK_SIGNING, body=req.body, timestamp=req.headers[TIMESTAMP_HEADER],
            signature=req.headers[SIGNATURE_HEADER], now=time.time(),
        )  # fmt: skip
    with Session(stack.engine) as session:
        rows = session.exec(select(AlertDelivery)).all()
    assert {r.state for r in rows} <= {"sent", "grouped"}
    assert len([r for r in rows if r.state == "sent"]) == 9
    assert checkpoint in json.dumps(stack.incident("storage_unwritable", JOB))
    for log in stack.tmp.glob("*.log"):  # neither process wrote a webhook secret to its log
        text = log.read_text(errors="replace")
        for secret in ("slacksecrettoken123", WECOM_KEY, WEBHOOK_SIGNING):
            assert secret not in text, f"{secret} in {log.name}"
    assert [(i["kind"], i["status"]) for i in stack.incidents()] == [
        ("storage_unwritable", "resolved")
    ]
    assert stack.feeder.errors == []
