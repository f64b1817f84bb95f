"""Storage: failed state-log or checkpoint writes mean storage_unwritable (heavy); snapshots
that could not be persisted mean checkpoint_write_errors (medium, alert only)."""

from __future__ import annotations

import pytest

from app.policy.detectors import SnapshotPersistDetector, StorageDetector
from app.policy.engine import DecisionType, PolicyEngine
from app.policy.signals import FaultKind, Tier
from recovery.protocol import metric_names as m

from .._helpers import JOB, T0, Cluster, first_firing

pytestmark = pytest.mark.timeout(30)


def test_state_log_write_errors_mean_storage_unwritable_heavy() -> None:
    c = Cluster()
    det = StorageDetector(c.policy)
    t = {"job": JOB, "role": "trainer", "rank": "0"}
    c.run(3, lambda c: c.put("n0", m.STATE_LOG_WRITE_ERRORS_TOTAL, 0, **t), detector=det)
    res = c.run(1, lambda c: c.put("n0", m.STATE_LOG_WRITE_ERRORS_TOTAL, 4, **t), detector=det)
    assert res[0][0].kind is FaultKind.STORAGE_UNWRITABLE and res[0][0].suggested_tier is Tier.HEAVY


def test_checkpoint_write_errors_mean_storage_unwritable_heavy() -> None:
    c = Cluster()
    det = StorageDetector(c.policy)
    t = {"job": JOB, "role": "trainer", "rank": "0"}
    c.run(3, lambda c: c.put("n0", m.CHECKPOINT_WRITE_ERRORS_TOTAL, 0, **t), detector=det)
    assert (
        first_firing(
            c.run(3, lambda c: c.put("n0", m.CHECKPOINT_WRITE_ERRORS_TOTAL, 0, **t), detector=det)
        )
        is None
    )  # a steady zero is no fault
    res = c.run(1, lambda c: c.put("n0", m.CHECKPOINT_WRITE_ERRORS_TOTAL, 1, **t), detector=det)
    sig = res[0][0]
    assert sig.kind is FaultKind.STORAGE_UNWRITABLE and sig.suggested_tier is Tier.HEAVY
    assert sig.evidence.metric == m.CHECKPOINT_WRITE_ERRORS_TOTAL
    assert sig.subject.to_dict() == {"node": "n0", "job": JOB, "role": "trainer", "rank": 0}


PERSIST_DIR = "/runs/job-x/snapshots/rank-0"
NO_SPACE = "[Errno 28] No space left on device"


def _persist_errors(total: int, error: str | None = NO_SPACE, **t: str):
    def feed(c: Cluster) -> None:
        c.put("n0", m.SNAPSHOT_PERSIST_ERRORS_TOTAL, total, **t)
        if error is not None and total:
            c.put("n0", m.SNAPSHOT_PERSIST_LAST_ERROR, total, **t, dir=PERSIST_DIR, error=error)

    return feed


def test_snapshot_persist_errors_mean_checkpoint_write_errors_with_dir_and_last_error() -> None:
    c = Cluster()
    det = SnapshotPersistDetector(c.policy)
    t = {"job": JOB, "role": "trainer", "rank": "0"}
    assert first_firing(c.run(3, _persist_errors(0, **t), detector=det)) is None
    c.run(1, _persist_errors(1, "[Errno 13] Permission denied", **t), detector=det)
    res = c.run(1, _persist_errors(3, **t), detector=det)
    sig = res[0][0]
    assert sig.kind is FaultKind.CHECKPOINT_WRITE_ERRORS and sig.suggested_tier is Tier.MEDIUM
    assert sig.subject.to_dict() == {"node": "n0", "job": JOB, "role": "trainer", "rank": 0}
    assert sig.extra == {"failed_persists": 3, "directory": PERSIST_DIR, "last_error": NO_SPACE}
    assert "3 snapshot persist(s) failed" in sig.evidence.detail
    assert PERSIST_DIR in sig.evidence.detail and NO_SPACE in sig.evidence.detail
    assert c.policy.tier_rule(FaultKind.CHECKPOINT_WRITE_ERRORS).plan == ()  # alert only


def test_a_counter_carried_over_a_restart_is_no_new_error_and_the_signal_ends() -> None:
    c = Cluster()
    det = SnapshotPersistDetector(c.policy)
    t = {"job": JOB, "role": "trainer", "rank": "0"}
    assert first_firing(c.run(5, _persist_errors(4, **t), detector=det)) is None
    fired = c.run(1, _persist_errors(5, **t), detector=det)
    assert fired[0] and fired[0][0].extra["failed_persists"] == 5
    window = int(c.policy.detection.storage.error_window_seconds)
    quiet = c.run(window + 2, _persist_errors(5, **t), detector=det)
    assert quiet[-1] == []  # no new failure within the window: the signal is gone


def test_snapshot_persist_errors_do_not_open_storage_unwritable() -> None:
    c = Cluster()
    engine = PolicyEngine(c.policy)
    t = {"job": JOB, "role": "trainer", "rank": "0"}
    c.participant("trainer", 0, "n0")

    def feed(c: Cluster) -> None:
        c.participant("trainer", 0, "n0")
        c.put("n0", m.CHECKPOINT_WRITE_ERRORS_TOTAL, 0, **t)
        _persist_errors(0 if c.now < T0 + 5 else int(c.now - T0), **t)(c)

    opened = [d for d in c.run(12, feed, engine=engine) if d.type is DecisionType.OPEN]
    assert [(d.kind, d.tier, d.actions) for d in opened] == [
        (FaultKind.CHECKPOINT_WRITE_ERRORS, Tier.MEDIUM, ())
    ]
