"""External signals: an Alertmanager alert mapped to a fault signal until it resolves."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from app.ingest.series_store import SeriesStore
from app.policy.detectors.external import (
    AlertmanagerPayload,
    AlertMappingError,
    ExternalAlertDetector,
    ExternalAlerts,
    map_alert,
)
from app.policy.policy_file import default_policy
from app.policy.signals import FaultKind
from app.policy.world import World

pytestmark = pytest.mark.timeout(60)


def payload(**alert) -> dict:
    a = {
        "status": "firing",
        "labels": {"alertname": "GPUXidError", "node": "n3", "gpu": "1"},
        "annotations": {"summary": "XID 79"},
        "startsAt": "2026-11-29T10:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "fingerprint": "abc",
    }
    a.update(alert)
    return {
        "version": "4",
        "status": "firing",
        "receiver": "rlguard",
        "groupKey": "{}:{}",
        "alerts": [a],
    }


def test_alert_maps_to_a_fault_signal_until_resolved() -> None:
    policy = default_policy()
    alerts = ExternalAlerts()
    det = ExternalAlertDetector(policy, alerts)
    mapped = [
        map_alert(a, policy.alertmanager)
        for a in AlertmanagerPayload.model_validate(payload()).alerts
    ]
    assert alerts.apply(mapped) == (1, 0)
    world = World(now=datetime(2026, 11, 29, 10, 1, tzinfo=UTC).timestamp(), store=SeriesStore())
    [sig] = det.run(world)
    assert sig.kind is FaultKind.GPU_XID and sig.subject.node == "n3" and sig.subject.gpu == "1"
    assert "XID 79" in sig.evidence.detail
    resolved = AlertmanagerPayload.model_validate(payload(status="resolved")).alerts
    assert alerts.apply([map_alert(a, policy.alertmanager) for a in resolved]) == (0, 1)
    assert det.run(world) == []


def test_kind_label_wins_and_bad_labels_are_named() -> None:
    m = default_policy().alertmanager
    a = AlertmanagerPayload.model_validate(
        payload(labels={"rlguard_kind": "nodes_lost", "rl_job": "j"})
    ).alerts[0]
    assert map_alert(a, m).kind is FaultKind.NODES_LOST and map_alert(a, m).subject.job == "j"
    bad = AlertmanagerPayload.model_validate(payload(labels={"rlguard_kind": "meteor"})).alerts[0]
    with pytest.raises(AlertMappingError, match="label rlguard_kind='meteor' is not a fault kind"):
        map_alert(bad, m)
    bad_rank = AlertmanagerPayload.model_validate(payload(labels={"rank": "first"})).alerts[0]
    with pytest.raises(AlertMappingError, match="rank='first' is not an integer rank"):
        map_alert(bad_rank, m)
    other = AlertmanagerPayload.model_validate(payload(labels={"alertname": "DiskFull"})).alerts[0]
    assert map_alert(other, m).kind is FaultKind.EXTERNAL_ALERT


@pytest.mark.parametrize("change", [{"version": "3"}, {"alerts": "x"}, {"status": "weird"}])
def test_bad_alertmanager_payload_is_refused(change) -> None:
    body = payload()
    body.update(change)
    with pytest.raises(ValidationError):
        AlertmanagerPayload.model_validate(body)
