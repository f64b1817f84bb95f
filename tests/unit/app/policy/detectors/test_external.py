"""External signals: an Alertmanager alert mapped to a fault signal until it resolves."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

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
from app.series.store import SeriesStore

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


@pytest.mark.parametrize(
    ("label", "value", "part"),
    [
        ("rl_job", "--run-root=/tmp/x", "job"),
        ("rl_job", "-h", "job"),
        ("rl_job", "jobC;id", "job"),
        ("rl_job", "a" * 129, "job"),
        ("role", "trainer rank", "role"),
        ("role", "r" * 65, "role"),
        ("node", "../n1", "node"),
        ("gpu", "", "gpu"),
    ],
)
def test_a_label_that_names_something_obeys_the_ingest_identifier_rule(
    label: str, value: str, part: str
) -> None:
    m = default_policy().alertmanager
    bad = AlertmanagerPayload.model_validate(payload(labels={label: value})).alerts[0]
    with pytest.raises(AlertMappingError) as err:
        map_alert(bad, m)
    shown = value if len(value) <= 80 else value[:80] + "..."
    assert f"label {label}={shown!r} cannot name a {part}" in str(err.value)


@pytest.mark.parametrize("rank", ["-1", " 3", "+3", "1000001", "9" * 5000])
def test_a_rank_label_is_a_non_negative_integer_in_ascii_digits(rank: str) -> None:
    bad = AlertmanagerPayload.model_validate(payload(labels={"rank": rank})).alerts[0]
    with pytest.raises(AlertMappingError, match="is not an integer rank"):
        map_alert(bad, default_policy().alertmanager)


def test_valid_identifiers_name_the_subject() -> None:
    labels = {"rl_job": "team-a/grpo:7b@v2", "role": "rollout.engine", "rank": "12", "node": "n_1"}
    a = AlertmanagerPayload.model_validate(payload(labels=labels)).alerts[0]
    subject = map_alert(a, default_policy().alertmanager).subject
    assert (subject.job, subject.role, subject.rank, subject.node) == (
        "team-a/grpo:7b@v2", "rollout.engine", 12, "n_1",
    )  # fmt: skip


@pytest.mark.parametrize("change", [{"version": "3"}, {"alerts": "x"}, {"status": "weird"}])
def test_bad_alertmanager_payload_is_refused(change) -> None:
    body = payload()
    body.update(change)
    with pytest.raises(ValidationError):
        AlertmanagerPayload.model_validate(body)
