"""The Evidence panel shows what the detector judged, for every kind the corpus opens (the real
signals of tests/policy_traces), and never an empty plot: liveness as the silence's age against
the suspect and confirm thresholds, a hang against its limit, a straggler beside its peers, an
XID with its catalogue row, an exit cause's matched line, a golden metric as its series."""

from __future__ import annotations

import time
from typing import Any

import pytest

from app.models import Job, from_epoch
from app.models.incident import Incident
from app.models.phase import PhaseTransition
from app.policy.policy_file import default_policy
from app.policy.signals import FaultKind
from app.views.models.evidence import HELD_FOR, LIVENESS_KINDS, evidence_panel
from app.views.models.incidents import evidence_chart, evidence_of
from tests.harness.corpus_incidents import first_opened_per_kind
from tests.harness.dashboard import Browser, DashboardApp, login

pytestmark = pytest.mark.timeout(240)

POLICY = default_policy()
GOLDEN = {FaultKind.ROLLOUT_PENDING_HIGH, FaultKind.STATE_LOG_SLOW, FaultKind.TRAINER_IDLE}
EXIT_CAUSES = {FaultKind.CUDA_OOM, FaultKind.HOST_OOM, FaultKind.COLLECTIVE_TIMEOUT}


def panel_of(signal: dict[str, Any], kind: str) -> Any:
    chart = evidence_chart(evidence_of(signal))  # as the incident page builds it
    return evidence_panel(
        signal, kind=kind, policy=POLICY, now=float(signal["detected_at"]) + 5, chart=chart
    )


def test_every_kind_the_corpus_opens_shows_its_fault() -> None:
    opened = first_opened_per_kind()
    # What the corpus covers today; a kind that stops being produced is a regression here.
    assert len(opened) >= 27, sorted(opened)
    for kind, decision in sorted(opened.items()):
        assert decision.signal is not None
        panel = panel_of(decision.signal.to_dict(), kind)
        assert not panel.empty and panel.detail, kind
        if panel.chart is not None:
            assert len(panel.chart.x) >= 2, f"{kind}: a one-point plot"
        if kind in LIVENESS_KINDS:
            assert panel.gauge is not None, kind
            assert [m.label for m in panel.gauge.marks] == ["suspect 15 s", "confirmed 75 s"]
        if kind in LIVENESS_KINDS - {FaultKind.ROLLOUT_DOWN}:
            assert panel.chart is None, f"{kind}: a heartbeat has no series to plot"
        if kind in HELD_FOR:  # an engine: how long it held, against its window
            assert panel.gauge is not None and panel.gauge.marks[0].label.startswith("limit"), kind
        if kind in GOLDEN:
            assert panel.chart is not None, kind
        if kind in EXIT_CAUSES:
            assert panel.quote, kind
    hang_signal = opened["train_hang"].signal.to_dict()  # type: ignore[union-attr]
    hang = panel_of(hang_signal, "train_hang")
    limit = hang_signal["evidence"]["threshold"]
    assert hang.gauge is not None and hang.gauge.title.startswith("Stuck at step ")
    assert [m.label for m in hang.gauge.marks] == [f"limit {limit:.0f} s"]
    assert hang.gauge.level == "bad" and hang.chart is None
    if "median_step_seconds" in hang_signal["extra"]:  # not for a first step that never ended
        assert any(label == "median step time" for label, _ in hang.facts)
    straggler = panel_of(opened["straggler"].signal.to_dict(), "straggler")  # type: ignore[union-attr]
    labels = [b.label for b in straggler.bars]
    assert labels[0] == "this participant" and labels[1].startswith("peers' median")
    xid = panel_of(opened["gpu_xid"].signal.to_dict(), "gpu_xid")  # type: ignore[union-attr]
    facts = dict(xid.facts)
    assert facts["XID"].startswith("79 ") and "resolution bucket (NVIDIA's catalogue)" in facts


def _lost(last_heard: float, detected: float, detail: str, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "heartbeat_lost",
        "subject": {"job": "j", "role": "trainer", "rank": 0, "node": "n0"},
        "evidence": {
            "metric": None,
            "values": [[last_heard, 0.0]],
            "window_seconds": 75.0,
            "threshold": 15.0,
            "detail": detail,
        },
        "detected_at": detected,
        "since": last_heard,
        "extra": extra,
    }


def test_a_silent_heartbeat_is_its_age_against_both_thresholds() -> None:
    panel = evidence_panel(
        _lost(1000.0, 1080.0, "heartbeat of trainer-0 silent for 80s"),
        kind="heartbeat_lost", policy=POLICY, now=1100.0, chart=None,
    )  # fmt: skip
    gauge = panel.gauge
    assert gauge is not None and gauge.value == 80.0 and gauge.level == "bad"
    assert gauge.value_text == "80 s"
    assert [(m.label, m.value, m.level) for m in gauge.marks] == [
        ("suspect 15 s", 15.0, "warn"), ("confirmed 75 s", 75.0, "bad"),
    ]  # fmt: skip
    assert 0 < gauge.marks[0].pct < gauge.marks[1].pct < gauge.pct <= 100
    assert ("last heard from", "1970-01-01 00:16:40 UTC") in panel.facts
    assert panel.chart is None


def test_an_exit_is_lost_at_once_and_says_so() -> None:
    panel = evidence_panel(
        _lost(1000.0, 1002.0, "trainer-0 exited (phase EXITED, reported by its launcher 2s ago)"),
        kind="heartbeat_lost", policy=POLICY, now=1010.0, chart=None,
    )  # fmt: skip
    gauge = panel.gauge
    assert gauge is not None and gauge.title == "Exited: lost at once" and gauge.level == "bad"
    assert gauge.value == 2.0 and gauge.pct < gauge.marks[0].pct  # judged before suspicion
    assert ("judged", "exited: lost at once (its launcher saw the exit)") in panel.facts


def test_an_event_with_one_point_is_not_plotted() -> None:
    one_point = {"metric": "gpu_lost", "values": [[1000.0, 1.0]], "threshold": 1.0, "detail": "x"}
    chart = evidence_chart(one_point)
    panel = evidence_panel(one_point, kind="gpu_lost", policy=POLICY, now=1010.0, chart=chart)
    assert panel.chart is None and ("counter", "gpu_lost") in panel.facts


def test_a_hang_on_the_incident_page_shows_its_gauge_and_the_participants_phases(
    client: Browser, dash: DashboardApp
) -> None:
    now = time.time()
    with dash.session() as s:
        s.add(Job(name="grpo-a", last_seen_at=from_epoch(now - 1)))
        s.flush()
        for phase, prev, step, at in (
            ("ROLLOUT", None, 40, now - 400),
            ("TRAIN", "ROLLOUT", 40, now - 300),
            ("ROLLOUT", "TRAIN", 41, now - 250),
        ):
            s.add(PhaseTransition(job_name="grpo-a", role="trainer", rank=0, node_name="n0",
                                  phase=phase, previous_phase=prev, step=step, at=from_epoch(at)))  # fmt: skip
        subject = {"node": "n0", "job": "grpo-a", "role": "trainer", "rank": 0}
        signal = {
            "kind": "train_hang", "subject": subject, "detected_at": now - 10,
            "since": now - 250, "step": 41, "extra": {"median_step_seconds": 3.0},
            "evidence": {
                "metric": None, "values": [[now - 250, 41.0], [now - 10, 41.0]],
                "window_seconds": 120.0, "threshold": 120.0,
                "detail": "trainer-0 stuck at step 41 for 240s in ROLLOUT/TRAIN",
            },
        }  # fmt: skip
        incident = Incident(
            key="train_hang:job=grpo-a/role=trainer/rank=0/node=n0", kind="train_hang",
            tier="medium", subject=subject, job="grpo-a", node="n0", evidence=signal,
            summary="trainer-0 hung",
        )  # fmt: skip
        s.add(incident)
        s.commit()
        incident_id = incident.id
    login(client, "vera")
    page = client.get(f"/incidents/{incident_id}").text
    assert 'data-testid="evidence-gauge"' in page and "Stuck at step 41" in page
    assert "limit 120 s" in page and "240 s" in page
    phases = page.split('data-testid="evidence-phases"', 1)[1].split("</ol>", 1)[0]
    assert "ROLLOUT at step 40" in phases and "TRAIN at step 40 for 50 s" in phases
    assert "ROLLOUT at step 41" in phases
    assert (
        'class="js-chart' not in page.split('data-testid="evidence"', 1)[1].split("</section>")[0]
    )
