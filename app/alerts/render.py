"""One entry point from (batch, channel) to the message that channel gets."""

from __future__ import annotations

from datetime import datetime

from app.alerts.config import (
    AlertsConfig,
    ChannelConfig,
    SlackChannel,
    WebhookChannel,
    WeComChannel,
)
from app.alerts.content import MessageContent, build_content, format_time, text
from app.alerts.grouping import AlertBatch
from app.alerts.message import RenderedMessage
from app.alerts.slack import render_slack
from app.alerts.webhook import render_webhook
from app.alerts.wecom import render_wecom
from app.policy.signals import Tier


def _dispatch(
    content: MessageContent, batch: AlertBatch | None, channel: ChannelConfig
) -> RenderedMessage:
    if isinstance(channel, SlackChannel):
        return render_slack(content)
    if isinstance(channel, WeComChannel):
        mention = batch is not None and batch.needs_attention
        return render_wecom(content, channel=channel, mention=mention)
    if isinstance(channel, WebhookChannel):
        return render_webhook(content, batch=batch, channel=channel)
    raise TypeError(f"unknown channel type {type(channel).__name__}")


def render_batch(
    batch: AlertBatch, *, channel: ChannelConfig, config: AlertsConfig
) -> RenderedMessage:
    """The message `channel` gets for `batch`, in the channel's locale."""
    content = build_content(batch, config=config, locale=channel.locale)
    return _dispatch(content, batch, channel)


def render_test_message(
    *, channel: ChannelConfig, config: AlertsConfig, now: datetime
) -> RenderedMessage:
    """A harmless message that proves a channel works (`POST /api/v1/alerts/test`)."""
    locale = channel.locale
    content = MessageContent(
        locale=locale,
        tier=Tier.LIGHT,
        emoji="🧪",
        tier_label=text(locale, "tier.light"),
        headline=text(locale, "test.headline"),
        fields=(),
        notes=(text(locale, "test.body", channel=channel.name),),
        context=text(locale, "context", tier=text(locale, "tier.light"), when=format_time(now)),
        incident_url=config.external_base_url + "/",
        approval_url=None,
        incident_label="RLGuard",
        approval_label=text(locale, "button.approval"),
        resolved=False,
        runbook_url=config.external_base_url + "/runbooks",
        runbook_label=text(locale, "button.runbook"),
    )
    return _dispatch(content, None, channel)
