"""PhaseTracker (what counts as a change), its place in the ingest group, and retention."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

from app.core.db import make_engine
from app.core.migrate import upgrade
from app.ingest.commit.groups import QueuedBatch, group_of
from app.ingest.persist import IngestGroup, write_ingest_group
from app.ingest.phases import (
    PhaseChange,
    PhaseRetention,
    PhaseTracker,
    write_phase_changes,
)
from app.models import utcnow


def test_first_report_and_changes_only() -> None:
    t = PhaseTracker()
    first = t.observe("j", "trainer", 0, "n1", "ROLLOUT", 1, 10.0)
    assert first == PhaseChange("j", "trainer", 0, "n1", "ROLLOUT", None, 1, 10.0)
    assert t.observe("j", "trainer", 0, "n1", "ROLLOUT", 1, 11.0) is None
    change = t.observe("j", "trainer", 0, "n1", "TRAIN", 2, 12.0)
    assert change is not None and (change.previous, change.phase) == ("ROLLOUT", "TRAIN")
    # Older than the newest report: ignored, and it does not become the known phase.
    assert t.observe("j", "trainer", 0, "n1", "ROLLOUT", 1, 11.5) is None
    assert t.observe("j", "trainer", 0, "n1", "TRAIN", 2, 13.0) is None
    # Participants are independent.
    assert t.observe("j", "rollout", 0, "n2", "TRAIN", 2, 13.0) is not None
    assert len(t) == 2


def test_seeded_tracker_does_not_repeat_the_known_phase() -> None:
    t = PhaseTracker()
    t.seed([("j", "trainer", 0, "TRAIN", 100.0)])
    assert t.observe("j", "trainer", 0, "n1", "TRAIN", 5, 101.0) is None
    change = t.observe("j", "trainer", 0, "n1", "EVAL", 5, 102.0)
    assert change is not None and change.previous == "TRAIN"


def test_a_group_keeps_its_batches_changes_in_order() -> None:
    # (A failed group is put back as its queued batches, ahead of newer ones: group_of of the
    # retried queue gives the same order.)
    a = PhaseChange("j", "trainer", 0, "n", "ROLLOUT", None, 1, 1.0)
    b = PhaseChange("j", "trainer", 0, "n", "TRAIN", "ROLLOUT", 2, 2.0)
    first = QueuedBatch("n", "a", 1, 1, utcnow(), None, [], [a], [])
    second = QueuedBatch("n", "a", 2, 2, utcnow(), None, [], [b], [])
    only_phases = IngestGroup(phases=[a])
    assert only_phases  # a group with only a phase change still commits
    assert group_of([first, second]).phases == [a, b]


@pytest.fixture
def engine(tmp_path):  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'p.db'}"
    upgrade(url)
    eng = make_engine(url)
    yield eng
    eng.dispose()


def _count(engine) -> int:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM phase_transition")).scalar_one())


def test_group_commit_writes_changes_once_and_retention_prunes(engine) -> None:  # type: ignore[no-untyped-def]
    now = utcnow()
    old = (now - timedelta(days=40)).timestamp()
    group = IngestGroup()
    group.jobs["j"] = now
    group.phases = [
        PhaseChange("j", "trainer", 0, "n", "ROLLOUT", None, 1, old),
        PhaseChange("j", "trainer", 0, "n", "TRAIN", "ROLLOUT", 2, now.timestamp() - 5),
    ]
    write_ingest_group(engine, group)
    write_ingest_group(engine, group)  # a retried commit: the unique key keeps one row each
    assert _count(engine) == 2
    clock = [0.0]
    retention = PhaseRetention(retention_days=30, every=3600, monotonic=lambda: clock[0])
    with engine.begin() as conn:
        assert retention.prune_if_due(conn, now=now) == 1
        write_phase_changes(conn, [PhaseChange("j", "trainer", 0, "n", "X", "TRAIN", 3, old)])
        assert retention.prune_if_due(conn, now=now) is None  # not due for another hour
    assert _count(engine) == 2
    clock[0] = 3601.0
    with engine.begin() as conn:
        assert retention.prune_if_due(conn, now=now) == 1
    with engine.connect() as conn:
        left = conn.execute(sa.text("SELECT phase, at FROM phase_transition")).all()
    assert [r[0] for r in left] == ["TRAIN"]


def test_a_change_for_a_job_not_in_the_database_fails_the_whole_group(engine) -> None:  # type: ignore[no-untyped-def]
    group = IngestGroup()
    group.cursors[("n", "a")] = (1, 1)
    group.phases = [PhaseChange("ghost", "trainer", 0, "n", "TRAIN", None, 1, 1.0)]
    with pytest.raises(sa.exc.IntegrityError):
        write_ingest_group(engine, group)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM ingest_cursor")).scalar_one() == 0
    assert _count(engine) == 0


@pytest.mark.parametrize(("days", "every"), [(0, 60), (-1, 60), (30, 0)])
def test_retention_refuses_bad_settings(days: float, every: float) -> None:
    with pytest.raises(ValueError, match=f"got {days!r}, {every!r}"):
        PhaseRetention(retention_days=days, every=every)
