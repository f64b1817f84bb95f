"""Alerts for the real-stack tests: one signed webhook channel pointed at the local receiver
(``tests.unit.app.alerts._recording_server.RecordingServer``, the ``server`` fixture), and what
it received."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from sqlmodel import Session, select

from app.models.alert import AlertDelivery
from tests.harness.stack import Stack
from tests.unit.app.alerts._factories import WEBHOOK_SIGNING
from tests.unit.app.alerts._recording_server import RecordingServer

HOOK = "/hook"


def webhook_alerts_file(path: Path, server: RecordingServer, *, group_wait_s: float = 1) -> Path:
    """An alerts file with one webhook channel (``pager``) delivering to ``server``."""
    data = {
        "alerts": {
            "external_base_url": "https://rlguard.example.com",
            "group_wait_s": group_wait_s,
            "claim_lease_s": 5,
            "retry_base_delay_s": 1,
            "channels": [
                {
                    "type": "webhook",
                    "name": "pager",
                    "url": server.url(HOOK),
                    "signing_secret": WEBHOOK_SIGNING,
                }
            ],
        }
    }
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def hooks(server: RecordingServer) -> list[dict[str, Any]]:
    """The webhook documents received so far, oldest first."""
    return [json.loads(r.body) for r in server.requests if r.path == HOOK]


def deliveries(stack: Stack) -> list[AlertDelivery]:
    """Every alert delivery row the stack's database holds."""
    with Session(stack.engine) as s:
        return list(s.exec(select(AlertDelivery)).all())


def delivered(stack: Stack, server: RecordingServer) -> list[dict[str, Any]] | None:
    """The webhook bodies received, once every queued delivery is sent (or grouped)."""
    rows = deliveries(stack)
    done = rows and all(r.state in ("sent", "grouped") for r in rows)
    return hooks(server) if done and hooks(server) else None
