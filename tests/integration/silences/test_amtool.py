"""The real ``amtool`` (Debian's prometheus-alertmanager) against a real RLGuard server, with
RLGuard's bearer tokens through ``--http.config.file``.

- ``silence add / query / expire`` and ``alert query`` work; a bad matcher and a viewer's
  token are refused with a message naming why, and store nothing.
- End to end with a real Celery worker and the local alert receiver: a silence made by amtool
  mutes the alert of what it matches exactly as one made on the Silences page does (the same
  row, read by the same muting code), and ``amtool alert query`` shows it silenced.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.harness.stack import JOB, Stack
from tests.integration.silences.test_silence_worker_e2e import (
    HEARTBEAT,
    alerted,
    kinds,
    lost,
    restarted,
    start,
)
from tests.unit.app.alerts._recording_server import RecordingServer

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

AMTOOL = shutil.which("amtool")


class Amtool:
    """amtool pointed at ``stack``'s server, one HTTP config file per token."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack

    def __call__(self, token: str, *args: str) -> subprocess.CompletedProcess[str]:
        config = self.stack.tmp / f"amtool-{abs(hash(token))}.yml"
        config.write_text(f"authorization:\n  type: Bearer\n  credentials: {token}\n")
        config.chmod(0o600)
        # Never a silent skip: the test command installs it (scripts/system-deps.sh).
        assert AMTOOL is not None, (
            "amtool missing: scripts/system-deps.sh installs prometheus-alertmanager"
        )
        return subprocess.run(
            [
                AMTOOL,
                f"--alertmanager.url={self.stack.base_url}",
                f"--http.config.file={config}",
                "--timeout=20s",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=Path(self.stack.tmp),
        )

    def ok(self, token: str, *args: str) -> str:
        done = self(token, *args)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout


def silences(stack: Stack) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = stack.get("/api/v1/silences", stack.viewer)
    return found


@pytest.fixture
def stack(webhook_stack: Callable[..., Stack]) -> Stack:
    return webhook_stack(**HEARTBEAT)


def test_amtool_adds_queries_and_expires_silences_and_is_refused_what_it_may_not_do(
    stack: Stack,
) -> None:
    stack.start_server()
    am = Amtool(stack)
    silence_id = am.ok(
        stack.approver, "silence", "add", "node=n1", "kind=~gpu_.*", "--comment=riser swap"
    ).strip()
    [row] = silences(stack)  # the one store: the REST API and the Silences page see it
    assert silence_id.endswith(f"{row['id']:012x}")
    assert row["matchers"] == [
        {"label": "node", "op": "=", "value": "n1"},
        {"label": "kind", "op": "=~", "value": "gpu_.*"},
    ]
    assert row["author"] == "user:alice" and row["comment"] == "riser swap"

    listed = am.ok(stack.viewer, "silence", "query")
    assert silence_id in listed and "riser swap" in listed
    [as_json] = json.loads(am.ok(stack.viewer, "silence", "query", "-o", "json", "node=n1"))
    assert as_json["id"] == silence_id and as_json["status"]["state"] == "active"
    assert json.loads(am.ok(stack.viewer, "silence", "query", "-o", "json", "node=n2")) in (
        [],
        None,
    )

    # A viewer may look but not write (403: amtool shows the status, not the body, of a code
    # Alertmanager's spec does not list); a bad matcher is refused naming it. Nothing stored.
    viewer_add = am(stack.viewer, "silence", "add", "node=n2", "--comment=x")
    assert viewer_add.returncode != 0 and "status 403" in viewer_add.stderr, viewer_add.stderr
    bad = am(stack.approver, "silence", "add", "gpu_model=H100", "--comment=x")
    assert bad.returncode != 0 and "unknown label 'gpu_model'" in bad.stderr, bad.stderr
    assert "[400]" in bad.stderr or "400" in bad.stderr, bad.stderr
    viewer_expire = am(stack.viewer, "silence", "expire", silence_id)
    assert viewer_expire.returncode != 0 and "status 403" in viewer_expire.stderr
    assert [s["id"] for s in silences(stack)] == [row["id"]]

    am.ok(stack.approver, "silence", "expire", silence_id)
    assert silences(stack)[0]["state"] == "expired"
    assert silences(stack)[0]["expired_by"] == "user:alice"
    assert silence_id not in am.ok(stack.viewer, "silence", "query")  # expired: hidden
    assert silence_id in am.ok(stack.viewer, "silence", "query", "--expired")
    assert am.ok(stack.viewer, "alert", "query", "-o", "json").strip() in ("[]", "null")

    # amtool's bare word is an alertname: RLGuard's kind.
    by_name = am.ok(stack.approver, "silence", "add", "heartbeat_lost", "--comment=drill").strip()
    newest = silences(stack)[0]
    assert by_name.endswith(f"{newest['id']:012x}")
    assert newest["matchers"] == [{"label": "kind", "op": "=", "value": "heartbeat_lost"}]


def test_an_amtool_silence_mutes_the_alert_as_one_from_the_silences_page_does(
    stack: Stack, server: RecordingServer
) -> None:
    start(stack)
    am = Amtool(stack)
    silence_id = am.ok(
        stack.approver, "silence", "add", "node=n1", "--duration=1h", "--comment=riser swap"
    ).strip()
    stack.feeder.freeze_heartbeat("n1", JOB, "rollout", 0)
    stack.feeder.freeze_heartbeat("n0", JOB, "trainer", 1)

    trainer = stack.wait(lambda: lost(stack, "trainer"), 60, "the trainer's incident")
    stack.wait(lambda: alerted(server, trainer["id"]), 60, "the trainer's alert")
    stack.wait(lambda: restarted(stack, "trainer"), 60, "the trainer restarted")
    rollout = stack.wait(lambda: lost(stack, "rollout"), 60, "the rollout's incident")
    # Muted by the silence amtool made; its plan still runs (an Alertmanager silence mutes
    # notifications only, it does not hold actions).
    assert kinds(stack, rollout["id"])[:2] == ["opened", "silenced"]
    stack.wait(lambda: restarted(stack, "rollout"), 60, "the rollout restarted")

    alerts = json.loads(am.ok(stack.viewer, "alert", "query", "-o", "json", "--silenced"))
    by_role = {
        a["labels"].get("role"): a for a in alerts if a["labels"]["kind"] == "heartbeat_lost"
    }
    assert by_role["rollout"]["status"]["silencedBy"] == [silence_id]
    assert by_role["rollout"]["status"]["state"] == "suppressed"
    assert "trainer" not in by_role or by_role["trainer"]["status"]["silencedBy"] == []
    simple = am.ok(stack.viewer, "alert", "query", "alertname=heartbeat_lost")
    assert "heartbeat_lost" in simple
    # Nothing about the rollout reached the receiver while the trainer's alert did.
    assert not alerted(server, rollout["id"])
