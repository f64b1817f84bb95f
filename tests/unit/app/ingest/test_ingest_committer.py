"""The group committer's isolation of a batch the database refuses (issue 17 item 1)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import sqlalchemy.exc as sa_exc
from redis.exceptions import ConnectionError as RedisConnectionError

from app.ingest.commit.groups import (
    QueuedBatch,
    group_of,
    is_transient,
    isolate,
    rejection_of,
)
from app.ingest.dedupe import DedupeWindow
from app.ingest.persist import _writing
from app.models import utcnow
from recovery.protocol.samples import ParticipantReport


def queued(node: str, seq: int, *, agent: str = "a", ts: float = 1.0, step: int = 1) -> QueuedBatch:
    part = ParticipantReport("job", "trainer", int(node[1:]), "TRAIN", step, ts)
    return QueuedBatch(node, agent, seq, seq + 1, utcnow(), None, [part], [], [])


def test_a_groups_cursor_holds_exactly_its_own_seqs() -> None:
    # A refused seq must never be recorded as applied by a later batch's cursor: each commit's
    # cursor is the window of its own batches, merged into the row by the database.
    group = group_of([queued("n1", 5), queued("n1", 7), queued("n2", 0)])
    w = DedupeWindow(*group.cursors[("n1", "a")])
    assert [s for s in range(9) if w.seen(s)] == [5, 7]
    assert group.cursors[("n2", "a")] == (0, 1)


def test_the_newest_report_of_a_participant_wins() -> None:
    group = group_of([queued("n1", 1, ts=5.0, step=9), queued("n1", 2, ts=4.0, step=3)])
    assert group.participants[("job", "trainer", 1)].step == 9


def _operational(invalidated: bool = False) -> sa_exc.OperationalError:
    return sa_exc.OperationalError(
        "INSERT", {}, Exception("server closed the connection"), invalidated
    )


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (_operational(), True),
        (sa_exc.InterfaceError("x", {}, Exception("connection already closed")), True),
        (sa_exc.DataError("x", {}, Exception("integer out of range")), False),
        (sa_exc.DataError("x", {}, Exception("closed"), connection_invalidated=True), True),
        (sa_exc.IntegrityError("x", {}, Exception("FOREIGN KEY constraint failed")), False),
        (OverflowError("date value out of range"), False),
        (ValueError("year -31688 is out of range"), False),
        (RedisConnectionError("refused"), True),
        (ConnectionRefusedError(), True),
        (sa_exc.TimeoutError("QueuePool limit"), True),
    ],
)
def test_transient_failures_are_told_from_data_failures(
    exc: BaseException, transient: bool
) -> None:
    assert is_transient(exc) is transient


class FakeDatabase:
    """A commit callable that refuses any group holding a poisoned seq (like a real database
    refusing one row fails its whole transaction) and can go down after some commits."""

    def __init__(self, poisoned: set[int], *, down_after: int | None = None) -> None:
        self.poisoned = poisoned
        self.down_after = down_after
        self.stored: list[int] = []
        self.calls = 0

    def commit(self, batches: Sequence[QueuedBatch]) -> None:
        self.calls += 1
        if self.down_after is not None and self.calls > self.down_after:
            raise _operational()
        with _writing("participants"):
            if any(b.seq in self.poisoned for b in batches):
                raise OverflowError("date value out of range")
        self.stored.extend(b.seq for b in batches)


@pytest.mark.parametrize("poisoned", [{0}, {7}, {31}, {3, 4}, {0, 16, 31}])
def test_isolation_commits_every_batch_but_the_poisoned_ones(poisoned: set[int]) -> None:
    batches = [queued(f"n{i}", i) for i in range(32)]
    db = FakeDatabase(poisoned)
    out = isolate(batches, db.commit)
    assert sorted(db.stored) == [i for i in range(32) if i not in poisoned]
    assert [r.batch.seq for r in out.rejected] == sorted(poisoned)
    assert out.unresolved == [] and out.transient is None
    assert all(r.field == "participants" for r in out.rejected)
    assert "OverflowError: date value out of range" in out.rejected[0].reason
    # about 2 log2(n) commits per poisoned batch, not one per batch
    assert out.commits <= 2 + 2 * 5 * len(poisoned)


def test_a_transient_failure_during_isolation_leaves_the_rest_queued_in_order() -> None:
    batches = [queued(f"n{i}", i) for i in range(8)]
    db = FakeDatabase({6}, down_after=1)
    out = isolate(batches, db.commit)
    assert [b.seq for b in out.committed] == [0, 1, 2, 3] == db.stored
    assert [b.seq for b in out.unresolved] == [4, 5, 6, 7]
    assert out.rejected == [] and isinstance(out.transient, sa_exc.OperationalError)


def test_a_rejection_names_the_field_and_the_reason() -> None:
    b = queued("n1", 41)
    exc = sa_exc.DataError("UPDATE participant ...", {}, Exception("integer out of range\nDETAIL"))
    exc.add_note("rlguard ingest part: steps")
    r = rejection_of(b, exc)
    assert r.field == "participants[].step"
    assert r.reason.startswith("participants[].step: the database cannot store this batch")
    assert "Exception: integer out of range" in r.reason and "seq 41" in r.reason
    assert rejection_of(b, RuntimeError("boom")).field == "batch"


def test_unmark_releases_a_seq_inside_the_window_only() -> None:
    w = DedupeWindow()
    for s in (10, 11, 12):
        w.mark(s)
    w.unmark(11)
    assert not w.seen(11) and w.seen(10) and w.seen(12)
    w.unmark(12)
    assert not w.seen(12) and w.mark(12)
    w.unmark(12 - 100)  # below the window: still counts as seen
    assert w.seen(12 - 100)
