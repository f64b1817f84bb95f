"""Slack incoming webhook: a Block Kit message with a plain `text` fallback for notifications.

Limits honoured (Slack's Block Kit reference): header text ≤ 150 characters, at most 10 fields
of ≤ 2000 characters in a section, section text ≤ 3000, button text ≤ 75, button URL ≤ 3000.
Values that come from ingested data are escaped (`&`, `<`, `>`), so a job name cannot smuggle a
link or an `@channel` mention into the message.
"""

from __future__ import annotations

from typing import Any

from app.alerts.content import MessageContent
from app.alerts.message import RenderedMessage, truncate_chars

HEADER_MAX = 150
FIELD_MAX = 2000
SECTION_MAX = 3000
BUTTON_TEXT_MAX = 75
# Evidence can be long; a phone screen cannot. The incident page shows the rest.
EVIDENCE_MAX = 600


def escape_mrkdwn(value: str) -> str:
    return value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _plain(value: str, limit: int) -> dict[str, Any]:
    return {"type": "plain_text", "text": truncate_chars(value, limit), "emoji": True}


def render_slack(content: MessageContent) -> RenderedMessage:
    """Block Kit payload: header, fields, notes, context, link buttons."""
    header = f"{content.emoji} {content.tier_label} · {content.headline}"
    fields = []
    for field in content.fields:
        limit = EVIDENCE_MAX if field.key == "evidence" else FIELD_MAX - len(field.label) - 4
        value = escape_mrkdwn(truncate_chars(field.value, limit))
        fields.append({"type": "mrkdwn", "text": f"*{field.label}*\n{value}"})
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": _plain(header, HEADER_MAX)},
        {"type": "section", "fields": fields[:10]},
    ]
    if content.notes:
        notes = "\n".join(escape_mrkdwn(note) for note in content.notes)
        blocks.append(
            {
                "type": "section",
                "text": {"type": "mrkdwn", "text": truncate_chars(notes, SECTION_MAX)},
            }
        )
    blocks.append(
        {
            "type": "context",
            "elements": [{"type": "mrkdwn", "text": escape_mrkdwn(content.context)}],
        }
    )
    buttons: list[dict[str, Any]] = [
        {
            "type": "button",
            "action_id": "open_incident",
            "text": _plain(content.incident_label, BUTTON_TEXT_MAX),
            "url": content.incident_url,
        }
    ]
    if content.approval_url:
        buttons.append(
            {
                "type": "button",
                "action_id": "open_approval",
                "style": "danger",
                "text": _plain(content.approval_label, BUTTON_TEXT_MAX),
                "url": content.approval_url,
            }
        )
    buttons.append(
        {
            "type": "button",
            "action_id": "open_runbook",
            "text": _plain(content.runbook_label, BUTTON_TEXT_MAX),
            "url": content.runbook_url,
        }
    )
    blocks.append({"type": "actions", "elements": buttons})
    # The fallback is what the phone's notification banner shows.
    fallback = f"{content.emoji} [{content.tier_label}] {content.headline}"
    job = next((f.value for f in content.fields if f.key == "job"), None)
    if job:
        fallback += f" ({job})"
    return RenderedMessage(
        "slack", ({"text": escape_mrkdwn(truncate_chars(fallback, SECTION_MAX)), "blocks": blocks},)
    )
