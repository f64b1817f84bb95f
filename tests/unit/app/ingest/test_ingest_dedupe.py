from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.ingest.dedupe import WINDOW, DedupeWindow


def test_in_order_and_replays() -> None:
    w = DedupeWindow()
    assert [w.mark(s) for s in (0, 1, 2)] == [True, True, True]
    assert [w.mark(s) for s in (0, 1, 2)] == [False, False, False]
    assert (w.high_seq, w.window_mask) == (2, 0b111)


def test_late_batch_inside_the_window_is_new_once() -> None:
    w = DedupeWindow()
    assert w.mark(10)
    assert w.mark(7)  # a retry overtaken by a newer batch is not lost
    assert not w.mark(7)
    assert w.mark(8)


def test_far_jump_and_too_old() -> None:
    w = DedupeWindow()
    w.mark(5)
    w.mark(5 + 1000)
    assert (w.high_seq, w.window_mask) == (1005, 1)
    assert w.seen(5 + 1000 - WINDOW)  # below the window: treated as applied
    assert not w.seen(1005 - WINDOW + 1)


def test_mask_fits_a_signed_64_bit_column() -> None:
    w = DedupeWindow()
    for s in range(500):
        w.mark(s)
        assert 0 <= w.window_mask < 2**63


def test_negative_seq_refused() -> None:
    with pytest.raises(ValueError, match="-1"):
        DedupeWindow().mark(-1)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=300), max_size=200))
def test_matches_a_set_model_inside_the_window(seqs: list[int]) -> None:
    """Within the window the bitmap is exact; state survives a round trip through its two ints."""
    w = DedupeWindow()
    applied: set[int] = set()
    for s in seqs:
        too_old = w.high_seq - s >= WINDOW
        fresh = w.mark(s)
        if too_old:
            assert not fresh
        else:
            assert fresh == (s not in applied)
        if fresh:
            applied.add(s)
        w = DedupeWindow(w.high_seq, w.window_mask)  # what a restart loads from the database
    assert len(applied) == len(set(applied))
