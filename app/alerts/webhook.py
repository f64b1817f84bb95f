"""Generic JSON webhook, signed with HMAC-SHA256.

Each POST carries `X-RLGuard-Timestamp` (Unix time in whole seconds when it was sent) and
`X-RLGuard-Signature`: `sha256=` + hex HMAC-SHA256, keyed with the channel's `signing_secret`,
over the bytes `<timestamp>.<body>` (the timestamp header's value, a dot, the raw body).

A receiver reads the raw body before parsing it, recomputes the HMAC, compares in constant time
and rejects a timestamp more than a few minutes from its own clock (a replay). `verify_signature`
does exactly that; in a receiver written in Python:

    ok = verify_signature(secret, body=request_body_bytes,
                          timestamp=headers["X-RLGuard-Timestamp"],
                          signature=headers["X-RLGuard-Signature"], now=time.time())

The same delivery may arrive more than once (retries after a timeout); `dedupe_key` in the body
is stable per incident event and channel, so a receiver can drop repeats.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from app.alerts.config import WebhookChannel
from app.alerts.content import MessageContent
from app.alerts.grouping import AlertBatch
from app.alerts.message import RenderedMessage

TIMESTAMP_HEADER = "X-RLGuard-Timestamp"
SIGNATURE_HEADER = "X-RLGuard-Signature"
SCHEMA = "rlguard.alert/v1"
DEFAULT_TOLERANCE_S = 300


def sign(secret: str, *, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode("utf-8"), f"{timestamp}.".encode("ascii") + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def signature_headers(secret: str, *, body: bytes, now: float) -> dict[str, str]:
    timestamp = int(now)
    return {
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: sign(secret, timestamp=timestamp, body=body),
    }


def verify_signature(
    secret: str,
    *,
    body: bytes,
    timestamp: str,
    signature: str,
    now: float,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
) -> bool:
    """True when `signature` is ours for this body and timestamp, and the timestamp is fresh."""
    try:
        sent = int(timestamp)
    except ValueError:
        return False
    if abs(now - sent) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, timestamp=sent, body=body), signature)


def render_webhook(
    content: MessageContent, *, batch: AlertBatch | None, channel: WebhookChannel
) -> RenderedMessage:
    """A stable, documented JSON shape: the same words as the chat channels plus raw fields."""
    body: dict[str, Any] = {
        "schema": SCHEMA,
        "channel": channel.name,
        "locale": content.locale,
        "tier": content.tier.value,
        "resolved": content.resolved,
        "headline": content.headline,
        "notes": list(content.notes),
        "links": {
            "incident": content.incident_url,
            "approval": content.approval_url,
            "runbook": content.runbook_url,
        },
    }
    if batch is None:  # a test message: no incident behind it
        body["test"] = True
        return RenderedMessage("webhook", (body,))
    latest = batch.latest
    decided = batch.decision_event
    body.update(
        {
            "incident_id": batch.incident_id,
            "dedupe_key": batch.dedupe_key(channel.name),
            "kinds": [k.value for k in batch.kinds],
            "job": latest.job,
            "node": latest.node,
            "role": latest.role,
            "fault_kind": latest.fault_kind,
            "evidence_summary": latest.evidence_summary,
            "actions_taken": list(batch.actions_taken),
            "approval": None
            if batch.approval_id is None
            else {
                "id": batch.approval_id,
                "pending": batch.approval_pending,
                "decision": decided.decision.value if decided and decided.decision else None,
                "decided_by": decided.decided_by if decided else None,
                "comment": decided.comment if decided else None,
            },
            "events": [
                {
                    "event_id": e.event_id,
                    "kind": e.kind.value,
                    "tier": e.tier.value,
                    "occurred_at": e.occurred_at.isoformat(),
                    "failed_action": e.failed_action,
                    "error": e.error,
                }
                for e in batch.events
            ],
        }
    )
    return RenderedMessage("webhook", (body,))
