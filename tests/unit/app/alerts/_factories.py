"""Events and configurations shared by the alert tests."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from app.alerts.config import AlertsConfig, parse_alerts_config
from app.alerts.events import AlertEvent, Decision, EventKind
from app.policy.signals import Tier

T0 = datetime(2026, 11, 29, 3, 0, 0, tzinfo=UTC)
SLACK_SECRET_PATH = "/services/T0SECRET1/B0SECRET2/slacksecrettoken123"
WECOM_KEY = "693a91f6-7xxx-4bc4-97a0-0ec2sifa5aaa"
WEBHOOK_SIGNING = "whsec-0123456789abcdef"


def event(**overrides: Any) -> AlertEvent:
    values: dict[str, Any] = dict(
        incident_id=42,
        event_id="e1",
        kind=EventKind.OPENED,
        tier=Tier.MEDIUM,
        occurred_at=T0,
        fault_kind="node_heartbeat_lost",
        job="grpo-qwen-7b",
        node="gpu-node-03",
        role="rollout",
        evidence_summary="heartbeat silent for 75 s (suspected at 15 s, confirmed after 60 s)",
        actions_taken=("rebuild_shard",),
        incident_opened_at=T0,
    )
    values.update(overrides)
    return AlertEvent(**values)


def tier_scenario(tier: Tier) -> list[AlertEvent]:
    """What each tier typically sends first: light/medium an opened incident, heavy an opened
    incident that asks for approval two seconds later."""
    if tier is Tier.LIGHT:
        return [
            event(
                tier=Tier.LIGHT,
                fault_kind="gpu_oom",
                role="trainer",
                node="gpu-node-01",
                evidence_summary="CUDA out of memory on GPU 3 at step 1412",
                actions_taken=("skip_failed_step",),
            )
        ]
    if tier is Tier.MEDIUM:
        return [event()]
    opened = event(
        tier=Tier.HEAVY,
        fault_kind="nodes_lost",
        node="gpu-node-03, gpu-node-05",
        role="rollout",
        evidence_summary="2 of 8 nodes silent for 75 s; state_log_write_latency_ms 340 > 200",
        actions_taken=("enter_safe_mode",),
    )
    asked = replace(
        opened,
        event_id="e2",
        kind=EventKind.APPROVAL_REQUESTED,
        approval_id=7,
        occurred_at=T0 + timedelta(seconds=2),
    )
    return [opened, asked]


def decided(approval_id: int = 7, *, at: datetime | None = None) -> AlertEvent:
    return event(
        event_id="e3",
        kind=EventKind.APPROVAL_DECIDED,
        tier=Tier.HEAVY,
        approval_id=approval_id,
        decision=Decision.APPROVED,
        decided_by="alice",
        comment="restore from step 1400",
        occurred_at=at or T0 + timedelta(minutes=3),
    )


def config(server_url: str | None = None, **overrides: Any) -> AlertsConfig:
    base = server_url or "https://alerts.invalid"
    data: dict[str, Any] = {
        "external_base_url": "https://rlguard.example.com",
        "channels": [
            {
                "type": "slack",
                "name": "ops-slack",
                "url": base + SLACK_SECRET_PATH,
                "min_tier": "light",
            },
            {
                "type": "wecom",
                "name": "ops-wecom",
                "url": f"{base}/cgi-bin/webhook/send?key={WECOM_KEY}",
                "min_tier": "light",
                "mentioned_mobile_list": ["13800138000"],
                "locale": "zh",
            },
            {
                "type": "webhook",
                "name": "pager",
                "url": base + "/rlguard/hook",
                "signing_secret": WEBHOOK_SIGNING,
                "min_tier": "light",
            },
        ],
    }
    data.update(overrides)
    return parse_alerts_config(data)
