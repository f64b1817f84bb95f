"""Signals from outside: Prometheus Alertmanager (webhook version 4).

The webhook route turns each alert into an :class:`ExternalAlert` through the policy file's
label mapping and puts it into an :class:`ExternalAlerts` registry; the
:class:`ExternalAlertDetector` reports every firing alert as a fault signal on each tick, so an
external alert becomes an incident like any other (grouped, tiered, resolved after the quiet
period once Alertmanager says ``resolved`` or the alert's ``endsAt`` has passed).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from app.ingest.wire_rules import ID_PATTERN, MAX_RANK
from app.policy.detectors.base import Detector
from app.policy.policy_file import AlertmanagerMapping, Policy
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject
from app.policy.world import World


class AlertmanagerAlert(BaseModel):
    model_config = ConfigDict(extra="allow")

    status: Literal["firing", "resolved"]
    labels: dict[str, str] = Field(max_length=64)
    annotations: dict[str, str] = Field(default_factory=dict, max_length=64)
    startsAt: datetime  # noqa: N815 - Alertmanager's field name
    endsAt: datetime | None = None  # noqa: N815
    fingerprint: str = Field(min_length=1, max_length=128)


class AlertmanagerPayload(BaseModel):
    model_config = ConfigDict(extra="allow")

    version: Literal["4"]
    status: Literal["firing", "resolved"]
    receiver: str = Field(max_length=256)
    groupKey: str = Field(max_length=4096)  # noqa: N815
    alerts: list[AlertmanagerAlert] = Field(max_length=1000)


class AlertmanagerAck(BaseModel):
    firing: int
    resolved: int


class AlertMappingError(ValueError):
    """An alert's labels cannot be mapped; the message names the label."""


# A label that names a node, job, role or GPU obeys the ingest rule for identifiers (the
# subject's values reach run directories and the launcher hook's argv): ``jobC;id`` or
# ``--run-root=/x`` never names anything. Lengths as ingest's (roles 64, the rest 128).
_ID = re.compile(ID_PATTERN)
_ID_CHARS = {"role": 64}


def _check_identifier(alert: AlertmanagerAlert, part: str, label: str, value: str) -> None:
    limit = _ID_CHARS.get(part, 128)
    if len(value) > limit or not _ID.fullmatch(value):
        shown = value if len(value) <= 80 else value[:80] + "..."
        raise AlertMappingError(
            f"alert {alert.fingerprint}: label {label}={shown!r} cannot name a {part}: use "
            f"1-{limit} letters, digits and _.:@/- (not starting with . : @ / -)"
        )


@dataclass(frozen=True, slots=True)
class ExternalAlert:
    fingerprint: str
    kind: FaultKind
    subject: Subject
    firing: bool
    starts_at: float
    ends_at: float | None
    summary: str
    labels: dict[str, str]


def map_alert(alert: AlertmanagerAlert, mapping: AlertmanagerMapping) -> ExternalAlert:
    labels = alert.labels
    kind = mapping.default_kind
    named = labels.get(mapping.kind_label)
    if named is not None:
        try:
            kind = FaultKind(named)
        except ValueError:
            raise AlertMappingError(
                f"alert {alert.fingerprint}: label {mapping.kind_label}={named!r} is not a fault kind"
            ) from None
    elif labels.get("alertname") in mapping.alertname_kinds:
        kind = mapping.alertname_kinds[labels["alertname"]]
    parts: dict[str, object] = {}
    for part, label in mapping.subject_labels.items():
        if label in labels:
            if part != "rank":
                _check_identifier(alert, part, label, labels[label])
            parts[part] = labels[label]
    if "rank" in parts:
        text = str(parts["rank"])
        # Ingest's rule for ranks: 0..MAX_RANK in ASCII digits (int() would take " -1").
        if len(text) <= 7 and text.isascii() and text.isdigit() and int(text) <= MAX_RANK:
            parts["rank"] = int(text)
        else:
            raise AlertMappingError(
                f"alert {alert.fingerprint}: label {mapping.subject_labels['rank']}={text[:80]!r} "
                f"is not an integer rank (0 to {MAX_RANK})"
            )
    subject = Subject.from_dict(parts)
    summary = (
        alert.annotations.get("summary")
        or alert.annotations.get("description")
        or labels.get("alertname", "")
    )
    return ExternalAlert(
        fingerprint=alert.fingerprint,
        kind=kind,
        subject=subject,
        firing=alert.status == "firing",
        starts_at=alert.startsAt.timestamp(),
        ends_at=alert.endsAt.timestamp() if alert.endsAt and alert.endsAt.year > 1 else None,
        summary=summary[:300],
        labels=dict(labels),
    )


class ExternalAlerts:
    """Firing external alerts by fingerprint (thread-safe: the route writes, the tick reads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._firing: dict[str, ExternalAlert] = {}

    def apply(self, alerts: list[ExternalAlert]) -> tuple[int, int]:
        fired = resolved = 0
        with self._lock:
            for a in alerts:
                if a.firing:
                    self._firing[a.fingerprint] = a
                    fired += 1
                elif self._firing.pop(a.fingerprint, None) is not None:
                    resolved += 1
        return fired, resolved

    def active(self, now: float) -> list[ExternalAlert]:
        with self._lock:
            expired = [
                f for f, a in self._firing.items() if a.ends_at is not None and a.ends_at < now
            ]
            for f in expired:
                del self._firing[f]
            return list(self._firing.values())


class ExternalAlertDetector(Detector):
    def __init__(self, policy: Policy, registry: ExternalAlerts) -> None:
        super().__init__(policy)
        self.registry = registry

    def detect(self, world: World) -> list[FaultSignal]:
        out = []
        for a in self.registry.active(world.now):
            evidence = Evidence(
                metric=a.labels.get("alertname"), detail=f"Alertmanager: {a.summary}"
            )
            out.append(
                self.signal(
                    world,
                    a.kind,
                    a.subject,
                    evidence,
                    since=a.starts_at,
                    fingerprint=a.fingerprint,
                    source="alertmanager",
                )
            )
        return out
