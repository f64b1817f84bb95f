"""WeChat Work (WeCom) group robot: a markdown message, plus a mention on the heavy tier.

The robot takes `msgtype: markdown` with content ≤ 4096 bytes of UTF-8; only `text` messages
(≤ 2048 bytes) can mention people by phone number, so a heavy-tier incident that needs someone
gets a second, short text message with `mentioned_mobile_list`. Tier colours use the three
colours WeCom markdown knows: comment (grey) for light, info (green) for medium and for a
resolution, warning (orange-red) for heavy.
"""

from __future__ import annotations

from app.alerts.config import WeComChannel
from app.alerts.content import MessageContent, text
from app.alerts.message import RenderedMessage, truncate_utf8
from app.policy.signals import Tier

MARKDOWN_MAX_BYTES = 4096
TEXT_MAX_BYTES = 2048
TIER_COLOUR = {Tier.LIGHT: "comment", Tier.MEDIUM: "info", Tier.HEAVY: "warning"}

# Ingested values must not become markup: '<' would open a <font> or a <@mention>,
# square brackets a [link](...). Full-width look-alikes keep the text readable.
_NEUTRALIZE = str.maketrans({"<": "＜", "[": "［", "]": "］", "\n": " ", "\r": " ", "`": "'"})


def neutralize(value: str) -> str:
    return value.translate(_NEUTRALIZE)


def _fit(head: list[str], body: list[str], tail: list[str], limit: int, note: str) -> str:
    """Join head, as much of body as fits, and tail within `limit` bytes.

    Head and tail (title, links, context) are always kept whole; body lines are kept whole
    while they fit, then the first that does not is cut on a character boundary and `note`
    says so. Body lines carry no markup, so a cut can never leave a tag open.
    """
    full = "\n".join(head + body + tail)
    if len(full.encode("utf-8")) <= limit:
        return full
    fixed = len("\n".join(head + tail + [note]).encode("utf-8")) + 1
    budget = limit - fixed
    kept: list[str] = []
    for line in body:
        size = len(line.encode("utf-8")) + 1
        if size <= budget:
            kept.append(line)
            budget -= size
            continue
        if budget > 16:
            kept.append(truncate_utf8(line, budget - 1))
        break
    return "\n".join(head + kept + [note] + tail)


def render_wecom(
    content: MessageContent, *, channel: WeComChannel, mention: bool
) -> RenderedMessage:
    """Markdown message; with `mention` (heavy tier, someone must act) also a text mention."""
    colour = "info" if content.resolved else TIER_COLOUR[content.tier]
    head = [
        f'<font color="{colour}">**{content.emoji} {content.tier_label}**</font> '
        f"**{neutralize(content.headline)}**"
    ]
    sep = text(content.locale, "label_sep")
    body = [f"> {field.label}{sep}{neutralize(field.value)}" for field in content.fields]
    body += [neutralize(note) for note in content.notes]
    links = f"[{content.incident_label}]({content.incident_url})"
    if content.approval_url:
        links += f"  [{content.approval_label}]({content.approval_url})"
    links += f"  [{content.runbook_label}]({content.runbook_url})"
    tail = [links, f'<font color="comment">{content.context}</font>']
    markdown = _fit(head, body, tail, MARKDOWN_MAX_BYTES, text(content.locale, "truncated"))
    parts: list[dict[str, object]] = [{"msgtype": "markdown", "markdown": {"content": markdown}}]
    if mention and channel.mentioned_mobile_list and content.tier is Tier.HEAVY:
        job = next((f.value for f in content.fields if f.key == "job"), "")
        summary = f"{content.emoji} {content.tier_label} {content.headline} ({job})"
        link = content.approval_url or content.incident_url
        room = TEXT_MAX_BYTES - len(link.encode("utf-8")) - 1
        message = truncate_utf8(summary, room) + "\n" + link
        parts.append(
            {
                "msgtype": "text",
                "text": {
                    "content": message,
                    "mentioned_mobile_list": list(channel.mentioned_mobile_list),
                },
            }
        )
    return RenderedMessage("wecom", tuple(parts))
