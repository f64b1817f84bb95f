"""What a message says, independent of the channel: headline, fields, links, in en or zh.

Renderers turn a `MessageContent` into Slack blocks, WeCom markdown or webhook JSON and escape
its text for their own markup; the strings here are raw.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from app.alerts.config import AlertsConfig, Locale
from app.alerts.events import Decision, EventKind
from app.alerts.grouping import AlertBatch
from app.policy.signals import Tier

TIER_EMOJI = {Tier.LIGHT: "🔵", Tier.MEDIUM: "🟠", Tier.HEAVY: "🔴"}
RESOLVED_EMOJI = "✅"

_TEXT: dict[Locale, dict[str, str]] = {
    "en": {
        "tier.light": "LIGHT",
        "tier.medium": "MEDIUM",
        "tier.heavy": "HEAVY",
        "headline": "Incident #{id}: {what}",
        "joiner": " · ",
        "kind.opened": "opened",
        "kind.escalated": "escalated to {tier}",
        "kind.approval_requested": "approval needed",
        "kind.approval_decided.approved": "recovery approved",
        "kind.approval_decided.rejected": "recovery rejected",
        "kind.approval_decided.expired": "approval expired",
        "kind.action_failed": "recovery action failed",
        "kind.resolved": "resolved",
        "kind.reminder": "still unresolved",
        "label_sep": ": ",
        "field.job": "Job",
        "field.node": "Node",
        "field.role": "Role",
        "field.kind": "Fault",
        "field.evidence": "Evidence",
        "field.actions": "Actions taken",
        "empty": "—",
        "none_yet": "none yet",
        "button.incident": "Open incident",
        "button.approval": "Approve or reject",
        "button.runbook": "Runbook",
        "safe_mode": "The job is in SAFE_MODE. Restoring from the latest checkpoint waits for an approver.",
        "decided.approved": "Approved by {who}",
        "decided.rejected": "Rejected by {who}; the job stays in SAFE_MODE",
        "decided.expired": "Nobody decided in time; the job stays in SAFE_MODE",
        "decided.comment": "{line}: “{comment}”",
        "failed": "Action {action} failed: {error}",
        "failed.no_error": "Action {action} failed",
        "reminder": "Unresolved for {duration}",
        "resolved": "Resolved after {duration}",
        "context": "RLGuard · {tier} · {when} UTC",
        "hours": "{h} h {m} min",
        "minutes": "{m} min",
        "seconds": "{s} s",
        "someone": "someone",
        "truncated": "… (truncated, see the incident page)",
        "test.headline": "Test message from RLGuard",
        "test.body": "Channel {channel} is configured correctly. No incident is open because of this message.",
    },
    "zh": {
        "tier.light": "轻度",
        "tier.medium": "中度",
        "tier.heavy": "重度",
        "headline": "事件 #{id}：{what}",
        "joiner": "，",
        "kind.opened": "已触发",
        "kind.escalated": "已升级为{tier}",
        "kind.approval_requested": "等待审批",
        "kind.approval_decided.approved": "恢复方案已批准",
        "kind.approval_decided.rejected": "恢复方案被拒绝",
        "kind.approval_decided.expired": "审批已超时",
        "kind.action_failed": "恢复动作失败",
        "kind.resolved": "已恢复",
        "kind.reminder": "仍未解决",
        "label_sep": "：",
        "field.job": "任务",
        "field.node": "节点",
        "field.role": "角色",
        "field.kind": "故障类型",
        "field.evidence": "证据",
        "field.actions": "已执行动作",
        "empty": "无",
        "none_yet": "暂无",
        "button.incident": "查看事件",
        "button.approval": "去审批",
        "button.runbook": "处置手册",
        "safe_mode": "任务已进入 SAFE_MODE，从最近的 checkpoint 恢复需要审批人确认。",
        "decided.approved": "{who} 已批准",
        "decided.rejected": "{who} 已拒绝，任务保持在 SAFE_MODE",
        "decided.expired": "审批超时无人处理，任务保持在 SAFE_MODE",
        "decided.comment": "{line}：「{comment}」",
        "failed": "动作 {action} 执行失败：{error}",
        "failed.no_error": "动作 {action} 执行失败",
        "reminder": "已持续 {duration} 未解决",
        "resolved": "历时 {duration} 后恢复",
        "context": "RLGuard · {tier} · {when} UTC",
        "hours": "{h} 小时 {m} 分钟",
        "minutes": "{m} 分钟",
        "seconds": "{s} 秒",
        "someone": "有人",
        "truncated": "…（内容过长已截断，详情见事件页面）",
        "test.headline": "RLGuard 测试消息",
        "test.body": "通道 {channel} 配置正确。这条消息不对应任何事件。",
    },
}


def text(locale: Locale, key: str, **values: object) -> str:
    return _TEXT[locale][key].format(**values)


def format_duration(locale: Locale, span: timedelta) -> str:
    seconds = max(0, int(span.total_seconds()))
    if seconds < 60:
        return text(locale, "seconds", s=seconds)
    minutes = seconds // 60
    if minutes < 60:
        return text(locale, "minutes", m=minutes)
    return text(locale, "hours", h=minutes // 60, m=minutes % 60)


def format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


@dataclass(frozen=True, slots=True)
class Field:
    key: str
    label: str
    value: str


@dataclass(frozen=True, slots=True)
class MessageContent:
    locale: Locale
    tier: Tier
    emoji: str
    tier_label: str
    headline: str
    fields: tuple[Field, ...]
    notes: tuple[str, ...]
    context: str
    incident_url: str
    approval_url: str | None
    incident_label: str
    approval_label: str
    resolved: bool
    # What to do about this kind of fault (docs/runbooks/<kind>.md, served by the dashboard).
    runbook_url: str
    runbook_label: str


def _kind_phrase(locale: Locale, batch: AlertBatch, kind: EventKind) -> str:
    if kind is EventKind.ESCALATED:
        return text(locale, "kind.escalated", tier=text(locale, f"tier.{batch.tier.value}"))
    if kind is EventKind.APPROVAL_DECIDED:
        decision = batch.decision or Decision.APPROVED
        return text(locale, f"kind.approval_decided.{decision.value}")
    return text(locale, f"kind.{kind.value}")


def _notes(locale: Locale, batch: AlertBatch) -> list[str]:
    notes: list[str] = []
    latest = batch.latest
    decided = batch.decision_event
    if decided is not None and decided.decision is not None:
        who = decided.decided_by or text(locale, "someone")
        line = text(locale, f"decided.{decided.decision.value}", who=who)
        if decided.comment:
            line = text(locale, "decided.comment", line=line, comment=decided.comment)
        notes.append(line)
    failed = batch.failed_event
    if failed is not None:
        action = failed.failed_action or text(locale, "empty")
        if failed.error:
            notes.append(text(locale, "failed", action=action, error=failed.error))
        else:
            notes.append(text(locale, "failed.no_error", action=action))
    opened_at = latest.incident_opened_at
    if opened_at is not None and EventKind.RESOLVED in batch.kinds:
        notes.append(
            text(
                locale, "resolved", duration=format_duration(locale, latest.occurred_at - opened_at)
            )
        )
    elif opened_at is not None and EventKind.REMINDER in batch.kinds:
        notes.append(
            text(
                locale, "reminder", duration=format_duration(locale, latest.occurred_at - opened_at)
            )
        )
    if batch.tier is Tier.HEAVY and batch.approval_pending:
        notes.append(text(locale, "safe_mode"))
    return notes


def build_content(batch: AlertBatch, *, config: AlertsConfig, locale: Locale) -> MessageContent:
    """Resolve a batch into the words and links every channel shows."""
    latest = batch.latest
    resolved = EventKind.RESOLVED in batch.kinds
    phrases = [_kind_phrase(locale, batch, kind) for kind in batch.kinds]
    headline = text(
        locale, "headline", id=batch.incident_id, what=text(locale, "joiner").join(phrases)
    )
    empty = text(locale, "empty")
    actions = batch.actions_taken
    fields = (
        Field("job", text(locale, "field.job"), latest.job or empty),
        Field("node", text(locale, "field.node"), latest.node or empty),
        Field("role", text(locale, "field.role"), latest.role or empty),
        Field("kind", text(locale, "field.kind"), latest.fault_kind),
        Field("evidence", text(locale, "field.evidence"), latest.evidence_summary or empty),
        Field(
            "actions",
            text(locale, "field.actions"),
            "; ".join(actions) if actions else text(locale, "none_yet"),
        ),
    )
    tier_label = text(locale, f"tier.{batch.tier.value}")
    approval_id = batch.approval_id
    return MessageContent(
        locale=locale,
        tier=batch.tier,
        emoji=RESOLVED_EMOJI if resolved else TIER_EMOJI[batch.tier],
        tier_label=tier_label,
        headline=headline,
        fields=fields,
        notes=tuple(_notes(locale, batch)),
        context=text(locale, "context", tier=tier_label, when=format_time(latest.occurred_at)),
        incident_url=config.incident_url(batch.incident_id),
        approval_url=config.approval_url(approval_id)
        if approval_id and batch.approval_pending
        else None,
        incident_label=text(locale, "button.incident"),
        approval_label=text(locale, "button.approval"),
        resolved=resolved,
        runbook_url=config.runbook_url(latest.fault_kind),
        runbook_label=text(locale, "button.runbook"),
    )
