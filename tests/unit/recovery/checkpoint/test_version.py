from __future__ import annotations

import pytest

from recovery.checkpoint.errors import CheckpointInputError
from recovery.checkpoint.version import (
    Ordering,
    VersionVector,
    WeightPush,
    WeightVersionTable,
    staleness,
    trainer_must_wait,
)

V = VersionVector


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (V(5, 2), V(5, 2), Ordering.EQUAL),
        (V(6, 2), V(5, 2), Ordering.AHEAD),
        (V(6, 3), V(5, 2), Ordering.AHEAD),
        (V(5, 1), V(5, 2), Ordering.BEHIND),
        (V(6, 1), V(5, 2), Ordering.CONCURRENT),
    ],
)
def test_compare(a: VersionVector, b: VersionVector, expected: Ordering) -> None:
    assert a.compare(b) is expected
    mirrored = {Ordering.AHEAD: Ordering.BEHIND, Ordering.BEHIND: Ordering.AHEAD}
    assert b.compare(a) is mirrored.get(expected, expected)
    assert a.is_ahead_of(b) == (expected is Ordering.AHEAD)
    assert a.is_behind(b) == (expected is Ordering.BEHIND)


def test_buffer_version_follows_training_step() -> None:
    assert V(42, 7).buffer_version == 42


@pytest.mark.parametrize("bad", [(-1, 0), (0, -2), (1.5, 0), (True, 0), ("3", 0)])
def test_bad_vector_is_refused(bad: tuple[object, object]) -> None:
    with pytest.raises(CheckpointInputError, match="non-negative int"):
        V(*bad)  # type: ignore[arg-type]


def test_vector_json_round_trip_and_bad_json() -> None:
    assert V.from_json(V(3, 4).as_json()) == V(3, 4)
    with pytest.raises(CheckpointInputError, match="not a version vector"):
        V.from_json({"training_step": 1})


def test_table_lookups_both_ways() -> None:
    # Pushes every 3 steps: a weight version is not step // 3 once the cadence changes (seed 5.2).
    table = WeightVersionTable([WeightPush(3, 1), WeightPush(6, 2), WeightPush(7, 3)])
    assert table.step_for_version(2) == 6
    assert table.step_for_version(4) is None
    assert table.version_at_step(2) is None
    assert table.version_at_step(3) == 1
    assert table.version_at_step(5) == 1
    assert table.version_at_step(100) == 3
    assert WeightVersionTable.from_json(table.as_json()) == table
    assert table.truncate_after(6).as_json() == [[3, 1], [6, 2]]
    assert len(table) == 3


@pytest.mark.parametrize("push", [(7, 4), (8, 3), (2, 9)])
def test_table_refuses_non_increasing_push_and_stays_unchanged(push: tuple[int, int]) -> None:
    table = WeightVersionTable([WeightPush(3, 1), WeightPush(7, 3)])
    with pytest.raises(CheckpointInputError, match="does not follow"):
        table.record(*push)
    assert table.as_json() == [[3, 1], [7, 3]]


@pytest.mark.parametrize("bad", [{"a": 1}, [[1, 2, 3]], [[1, -1]]])
def test_table_from_bad_json(bad: object) -> None:
    with pytest.raises(CheckpointInputError):
        WeightVersionTable.from_json(bad)


def test_staleness_bound() -> None:
    assert staleness(10, [8, 5]) == 5
    assert staleness(10, []) == 0
    assert not trainer_must_wait(10, [5], bound=5)
    assert trainer_must_wait(11, [5], bound=5)
    with pytest.raises(CheckpointInputError):
        trainer_must_wait(1, [1], bound=-1)
