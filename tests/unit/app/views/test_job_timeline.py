"""Job page: the phase timeline (from recorded transitions) and the checkpoint versions."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest

from app.cluster.phase_history import phase_history
from app.core.errors import InvalidInput, NotFound
from app.models import Job, MetricRollup, from_epoch
from app.models.phase import PhaseTransition
from app.series.store import SeriesKey
from app.views.models.phases import phase_timeline
from tests.harness.dashboard import Browser, DashboardApp, login

LABELS = {"job": "grpo-a", "role": "trainer", "rank": "0"}


def _transitions(dash: DashboardApp, now: float) -> None:
    rows = [
        # Before the hour: the phase trainer/0 was in when the window opens.
        ("trainer", 0, "INIT", None, now - 7200),
        ("trainer", 0, "ROLLOUT", "INIT", now - 1800),
        ("trainer", 0, "TRAIN", "ROLLOUT", now - 900),
        ("rollout", 1, "ROLLOUT", None, now - 1200),
        ("rollout", 1, "SAFE_MODE", "ROLLOUT", now - 60),
    ]
    with dash.session() as s:
        s.add(Job(name="grpo-a", last_seen_at=from_epoch(now - 1)))
        s.add(Job(name="quiet", last_seen_at=from_epoch(now - 1)))
        s.flush()
        for role, rank, phase, prev, at in rows:
            s.add(
                PhaseTransition(
                    job_name="grpo-a",
                    role=role,
                    rank=rank,
                    node_name="node-1",
                    phase=phase,
                    previous_phase=prev,
                    step=40,
                    at=from_epoch(at),
                )
            )
        s.commit()


def test_timeline_bands_cover_the_window_per_participant(dash: DashboardApp) -> None:
    now = time.time()
    _transitions(dash, now)
    with dash.session() as s:
        tl = phase_timeline(s, job="grpo-a", now=now, minutes=60)
    lanes = {lane.who: lane for lane in tl.lanes}
    assert list(lanes) == ["trainer/0", "rollout/1"]  # trainers first
    trainer = lanes["trainer/0"]
    assert [b.phase for b in trainer.bands] == ["INIT", "ROLLOUT", "TRAIN"]
    # INIT began two hours ago: its band is clipped to the window's start.
    assert trainer.bands[0].left_pct == 0 and trainer.bands[0].width_pct == pytest.approx(50)
    assert trainer.bands[2].left_pct == pytest.approx(75)
    assert sum(b.width_pct for b in trainer.bands) == pytest.approx(100)
    rollout = lanes["rollout/1"]
    assert rollout.bands[0].left_pct == pytest.approx(100 * 2400 / 3600, abs=0.01)
    assert rollout.current == "SAFE_MODE" and rollout.bands[-1].css == "ph-safe_mode"
    assert tl.phases == ["INIT", "ROLLOUT", "TRAIN", "SAFE_MODE"]
    assert len(tl.ticks) == 6


def test_job_page_draws_the_timeline(client: Browser, dash: DashboardApp) -> None:
    now = time.time()
    _transitions(dash, now)
    login(client, "vera")
    html = client.get("/jobs/grpo-a").text
    assert 'data-testid="phase-timeline"' in html
    lane = re.search(r'data-lane="trainer/0" data-current="TRAIN"(.*?)</div>\s*</div>', html, re.S)
    assert lane, html
    assert re.findall(r'data-phase="(\w+)"', lane.group(1)) == ["INIT", "ROLLOUT", "TRAIN"]
    assert 'class="band ph-train"' in html and 'class="band ph-safe_mode"' in html
    quiet = client.get("/jobs/quiet").text
    assert "No phase change recorded for this job" in quiet
    assert "No committed checkpoint reported" in quiet


def test_job_page_shows_checkpoint_versions(client: Browser, dash: DashboardApp) -> None:
    now = time.time()
    _transitions(dash, now)
    minute = from_epoch(now).replace(second=0, microsecond=0) - timedelta(minutes=20)
    with dash.session() as s:
        for name, last, avg in (
            ("checkpoint_committed_step", 50.0, 37.5),  # a mean over a commit is no version
            ("checkpoint_inference_version", 11.0, 10.5),
        ):
            s.add(
                MetricRollup(
                    series_id=f"r-{name}"[:40],
                    node="node-1",
                    name=name,
                    labels=LABELS,
                    minute=minute,
                    count=60,
                    min=0,
                    max=last,
                    avg=avg,
                    last=last,
                    last_ts=minute.timestamp() + 59,
                )
            )
        s.commit()
    step = SeriesKey.of("node-1", "checkpoint_committed_step", LABELS)
    version = SeriesKey.of("node-1", "checkpoint_inference_version", LABELS)
    dash.store.extend([(step, now - 30, 100.0), (version, now - 30, 12.0)])
    dash.store.extend([(step, now - 2, 100.0), (version, now - 2, 12.0)])
    login(client, "vera")
    html = client.get("/jobs/grpo-a").text
    card = re.search(r'data-checkpoint="trainer/0"(.*?)</div>\s*</div>', html, re.S)
    assert card, html
    assert '<strong data-testid="ckpt-step">100</strong>' in card.group(1)
    assert '<strong data-testid="ckpt-inference">12</strong>' in card.group(1)
    # History: the rolled-up commit (its last value, not its mean), then the live one.
    assert re.findall(r'<tr data-commit="(\d+)">', html) == ["100", "50"]
    assert "37" not in re.findall(r'<tr data-commit="(\d+)">', html)


def test_phase_history_bad_input_is_refused(dash: DashboardApp) -> None:
    now = time.time()
    _transitions(dash, now)
    with dash.session() as s:
        with pytest.raises(NotFound, match="no job named 'nope'"):
            phase_history(s, job="nope", now=from_epoch(now))
        with pytest.raises(InvalidInput, match="time zone"):
            phase_history(
                s, job="grpo-a", now=from_epoch(now), since=from_epoch(now).replace(tzinfo=None)
            )
        with pytest.raises(InvalidInput, match="in the future"):
            phase_history(s, job="grpo-a", now=from_epoch(now), since=from_epoch(now + 60))
        for bad in (0, 10_001, True):
            with pytest.raises(InvalidInput, match=f"got {bad!r}"):
                phase_history(s, job="grpo-a", now=from_epoch(now), limit=bad)


def test_phase_history_opens_with_the_phase_at_since_and_truncates(dash: DashboardApp) -> None:
    now = time.time()
    _transitions(dash, now)
    with dash.session() as s:
        h = phase_history(s, job="grpo-a", now=from_epoch(now), since=from_epoch(now - 1000))
        assert [(t.role, t.phase) for t in h.data] == [
            ("trainer", "ROLLOUT"),  # opening: in ROLLOUT at since
            ("rollout", "ROLLOUT"),  # opening
            ("trainer", "TRAIN"),
            ("rollout", "SAFE_MODE"),
        ]
        assert h.count == 4 and not h.truncated
        short = phase_history(
            s, job="grpo-a", now=from_epoch(now), since=from_epoch(now - 1000), limit=1
        )
        assert short.truncated and [t.phase for t in short.data][-1] == "TRAIN"


def test_a_young_job_is_drawn_from_its_first_transition(dash: DashboardApp) -> None:
    now = time.time()
    with dash.session() as s:
        s.add(Job(name="young", last_seen_at=from_epoch(now)))
        s.flush()
        for phase, back in (("ROLLOUT", 300), ("TRAIN", 100)):
            s.add(
                PhaseTransition(
                    job_name="young", role="trainer", rank=0, phase=phase, at=from_epoch(now - back)
                )
            )
        s.commit()
        tl = phase_timeline(s, job="young", now=now)
    assert tl.start == pytest.approx(now - 300)
    bands = tl.lanes[0].bands
    assert [(b.left_pct, b.width_pct) for b in bands] == [
        (0, pytest.approx(200 / 3, abs=0.01)),
        (pytest.approx(200 / 3, abs=0.01), pytest.approx(100 / 3, abs=0.01)),
    ]
    assert tl.span_label == "5 min" and tl.tick_format == "%H:%M"
    assert all(0 < left < 100 for left, _ in tl.ticks) and len(tl.ticks) >= 2
