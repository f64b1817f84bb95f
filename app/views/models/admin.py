"""The Audit and Settings pages: the audit log, filtered and paged; effective configuration.

Settings are read-only here, and nothing secret leaves the server: the secret key is shown only as
set/unset, passwords in URLs are replaced, and alert channels are shown as their ``public()`` form
(the webhook URL reduced to scheme and host).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlmodel import Session, col, select

from app.core.config import (
    DEFAULT_SECRET_KEY,
    POLICY_OVERRIDE_PATHS,
    Settings,
    policy_variable,
)
from app.models import AuditEvent
from app.policy.policy_file import Policy
from app.views.models.jobs import golden_thresholds

AUDIT_PAGE_SIZE = 50
MAX_FILTER_LENGTH = 160


class BadFilter(ValueError):
    """A filter value the page refuses; the message names it."""


@dataclass(slots=True)
class AuditPage:
    events: list[AuditEvent]
    actor: str
    action: str
    before_id: int | None
    next_before_id: int | None


def audit_page(
    session: Session, *, actor: str = "", action: str = "", before_id: int | None = None
) -> AuditPage:
    """Newest first; ``before_id`` pages back (keyset paging stays fast on a long log)."""
    for name, value in (("actor", actor), ("action", action)):
        if len(value) > MAX_FILTER_LENGTH:
            raise BadFilter(f"{name} filter is longer than {MAX_FILTER_LENGTH} characters")
    if before_id is not None and before_id < 1:
        raise BadFilter(f"before={before_id} is not a positive event id")
    query = select(AuditEvent)
    if actor:
        query = query.where(col(AuditEvent.actor).contains(actor, autoescape=True))
    if action:
        query = query.where(col(AuditEvent.action).startswith(action, autoescape=True))
    if before_id is not None:
        query = query.where(col(AuditEvent.id) < before_id)
    rows = list(
        session.exec(query.order_by(col(AuditEvent.id).desc()).limit(AUDIT_PAGE_SIZE + 1)).all()
    )
    more = len(rows) > AUDIT_PAGE_SIZE
    rows = rows[:AUDIT_PAGE_SIZE]
    return AuditPage(
        events=rows,
        actor=actor,
        action=action,
        before_id=before_id,
        next_before_id=rows[-1].id if more and rows else None,
    )


def mask_dsn(url: str | None) -> str:
    """A database or Redis URL with any password replaced."""
    if not url:
        return "(not set: embedded)"
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:  # unparseable: it must still not leak, so show nothing of it
        return "(set; not parseable, not shown)"


def _flatten(prefix: str, value: Any) -> list[tuple[str, str]]:
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, dict):
        rows: list[tuple[str, str]] = []
        for key, item in value.items():
            rows.extend(_flatten(f"{prefix}.{key}" if prefix else str(key), item))
        return rows
    if isinstance(value, list | tuple):
        return [(prefix, ", ".join(str(v) for v in value) or "(none)")]
    return [(prefix, "–" if value is None else str(value))]


def _policy_rows(settings: Settings, policy: Policy) -> list[tuple[str, str]]:
    """The thresholds ``RLGUARD_POLICY__*`` may override, as the engine runs them."""
    overridden = settings.policy.overridden()
    dumped = policy.model_dump(mode="json")
    rows = []
    for path in POLICY_OVERRIDE_PATHS:
        if path.startswith("golden_metrics."):
            continue  # the golden metrics' table shows them
        value: Any = dumped
        for part in path.split("."):
            value = value[part]
        source = f" ({policy_variable(path)})" if path in overridden else ""
        rows.append((path, f"{value}{source}"))
    rows.append(("checkpoint_interval_steps", str(settings.policy.checkpoint_interval_steps)))
    return rows


@dataclass(slots=True)
class SettingsView:
    server: list[tuple[str, str]]
    golden: list[tuple[str, float, float]]  # metric, healthy, warning
    policy: list[tuple[str, str]]
    policy_file: list[tuple[str, str]]
    channels: list[dict[str, Any]]


def settings_view(
    settings: Settings, *, policy: Policy, channels: list[dict[str, Any]] | None = None
) -> SettingsView:
    """The loaded policy (the engine's), with the ``RLGUARD_POLICY__*`` it took marked."""
    server = [
        ("database_url", mask_dsn(settings.database_url)),
        ("redis_url", mask_dsn(settings.redis_url)),
        ("data_dir", str(settings.data_dir)),
        ("bind", f"{settings.host}:{settings.port}"),
        ("dev mode", "on" if settings.dev else "off"),
        (
            "secret_key",
            "built-in default (dev only)"
            if settings.secret_key == DEFAULT_SECRET_KEY
            else "set (hidden)",
        ),
        ("policy_scheduler", "on" if settings.policy_scheduler else "off"),
    ]
    return SettingsView(
        server=server
        + _flatten("series", settings.series)
        + _flatten("ingest", settings.ingest)
        + _flatten("recovery", settings.recovery)
        + _flatten("alerts", settings.alerts),
        golden=golden_thresholds(policy),
        policy=_policy_rows(settings, policy),
        policy_file=_flatten("", policy),
        channels=list(channels or []),
    )
