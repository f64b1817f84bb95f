from __future__ import annotations

from app.goodput.intervals import Interval, clip_all, measure, overlap, subtract, union


def test_union_merges_overlaps_and_drops_empty() -> None:
    got = union([Interval(5, 8), Interval(0, 3), Interval(2, 4), Interval(9, 9), Interval(8, 10)])
    assert got == [Interval(0, 4), Interval(5, 10)]
    assert measure([Interval(0, 10), Interval(5, 15), Interval(20, 21)]) == 16


def test_clip_subtract_overlap() -> None:
    assert clip_all([Interval(0, 10), Interval(12, 20)], 5, 15) == [
        Interval(5, 10),
        Interval(12, 15),
    ]
    assert Interval(0, 3).clip(3, 5) is None
    assert subtract(Interval(0, 10), [Interval(2, 3), Interval(2.5, 4), Interval(9, 12)]) == [
        Interval(0, 2),
        Interval(4, 9),
    ]
    assert subtract(Interval(0, 10), []) == [Interval(0, 10)]
    assert overlap([Interval(0, 10)], [Interval(5, 7), Interval(9, 30)]) == 3
