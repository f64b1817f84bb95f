"""The clock-offset estimate and the correction of a node's stamps (app/ingest/clock_skew.py)."""

from __future__ import annotations

from pytest import approx

from app.ingest.clock_skew import AGREE, KEPT, ClockOffsets, offset_sample, shifted
from app.ingest.validation import ValidBatch
from app.series.store import SeriesKey
from recovery.protocol.samples import ParticipantReport

KEY = SeriesKey.of("n1", "gpu_util", {"gpu": "0"})


def batch(sent_at: float, node: str = "n1") -> ValidBatch:
    return ValidBatch(
        agent_id="a",
        node=node,
        seq=1,
        sent_at=sent_at,
        samples=[(KEY, sent_at - 1.0, 0.5)],
        participants=[ParticipantReport("j", "rollout", 0, "ROLLOUT", 7, sent_at - 2.0)],
        fingerprint=None,
    )


def test_the_estimate_is_the_smallest_recent_difference_so_delays_do_not_count() -> None:
    c = ClockOffsets()
    # A node 30 s behind; requests take 5 ms, one queued request 4 s.
    assert c.observe("n1", 1000.0, 1030.005) == approx(30.005)
    assert c.observe("n1", 1001.0, 1035.0) == approx(30.005)  # a slow one does not move it
    assert c.observe("n1", 1002.0, 1032.001) == approx(30.001)
    # A clock ahead: negative; nodes are apart.
    assert c.observe("n2", 1000.0, 980.002) == approx(-19.998)


def test_a_clock_stepped_back_is_followed_once_the_older_batches_have_passed() -> None:
    c = ClockOffsets()
    for i in range(KEPT):
        c.observe("n1", 1000.0 + i, 1000.0 + i + 0.01)  # in time
    # NTP steps the node's clock 20 s back: each difference is now 20 s larger.
    estimates = [c.observe("n1", 980.0 + 16 + i, 1016.0 + i + 0.01) for i in range(KEPT)]
    assert estimates[0] < 1 and estimates[-1] > 19.9


def test_under_the_threshold_nothing_is_touched_above_it_every_stamp_moves() -> None:
    c = ClockOffsets(correct_above_seconds=5.0)
    for i in range(3):
        same = batch(1000.0 + i)
        kept, offset = c.correct(same, received_at=1004.0 + i)  # 4 s off: under the threshold
        assert kept is same and offset is None
    # A node behind: its first batches are moved at once (a tick between them must not judge
    # them 30 s stale), but its lag is recorded as a clock only once AGREE of them say so (one
    # slow or re-sent request is no clock).
    for i in range(AGREE - 1):
        early = batch(990.0 + i, node="n2")
        moved, offset = c.correct(early, received_at=1020.0 + i)
        assert offset is None and moved.sent_at == approx(1020.0 + i)
        assert moved.samples == [(KEY, approx(1019.0 + i), 0.5)]
    late = batch(1000.0, node="n2")
    moved, offset = c.correct(late, received_at=1030.0)
    assert offset == approx(30.0)
    assert moved.sent_at == approx(1030.0)
    assert moved.samples == [(KEY, approx(1029.0), 0.5)]
    assert [p.ts for p in moved.participants] == [approx(1028.0)]
    assert late.samples == [(KEY, 999.0, 0.5)]  # the original is not changed
    assert shifted(late, -5.0).sent_at == 995.0
    assert offset_sample("n2", 30.0, 1030.0) == (
        SeriesKey.of("n2", "agent_clock_offset_seconds", {}),
        1030.0,
        30.0,
    )


def test_a_node_ahead_is_corrected_from_its_first_batch() -> None:
    c = ClockOffsets(correct_above_seconds=5.0)
    ahead = batch(1030.0)
    moved, offset = c.correct(ahead, received_at=1000.0)
    assert offset == approx(-30.0) and moved.sent_at == approx(1000.0)


def test_one_batch_re_sent_with_its_old_sent_at_is_no_clock() -> None:
    """After a server restart a client re-sends the body it sent 6 s ago: a delay, no clock.
    Its stamps move no later than its arrival; no skew is recorded, and the next timely batch
    is taken as sent."""
    c = ClockOffsets(correct_above_seconds=5.0)
    again = batch(1000.0)
    moved, offset = c.correct(again, received_at=1006.0)
    assert offset is None and moved.sent_at == approx(1006.0)
    timely = batch(1007.0)
    assert c.correct(timely, received_at=1007.01) == (timely, None)
