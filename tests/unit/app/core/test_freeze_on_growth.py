"""FreezeOnGrowth: the grown series store leaves the collector's full passes, a few times only."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from app.core.gc_tuning import FreezeOnGrowth, freeze_startup_heap, thaw_heap


@pytest.fixture
def frozen_process() -> Iterator[None]:
    """This process as the server runs: its start-up heap frozen (undone afterwards)."""
    freeze_startup_heap()
    try:
        yield
    finally:
        thaw_heap()


def test_freezes_when_the_store_grew_by_a_quarter_and_only_then(frozen_process: None) -> None:
    heap = FreezeOnGrowth(growth=0.25, minimum_series=1_000)
    assert not heap.after_tick(999)  # too small to matter
    assert heap.after_tick(1_000)  # the first time past the minimum
    kept = [[i] for i in range(5_000)]  # long-lived containers created since
    assert not heap.after_tick(1_249)  # grew by less than a quarter
    before = gc.get_freeze_count()
    assert heap.after_tick(1_250)
    assert gc.get_freeze_count() >= before + len(kept)  # now skipped by full passes
    assert not heap.after_tick(1_250)  # unchanged: nothing to do
    assert not heap.after_tick(900)  # a store that shrank is not frozen again


def test_young_garbage_cycles_are_collected_before_freezing(frozen_process: None) -> None:
    class Node:
        other: Node

    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: garbage once dropped, freed only by a collection
    gone = weakref.ref(a)
    del a, b
    assert gone() is not None
    assert FreezeOnGrowth().after_tick(10_000)
    assert gone() is None  # freed, not kept forever in the permanent generation


def test_freezing_never_runs_a_full_collection(frozen_process: None) -> None:
    # A full pass walks everything created since the last freeze while holding the GIL: it
    # stopped every request for 18-74 ms in the tick after a node's first 5,000 series.
    generations: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            generations.append(info["generation"])

    kept = [[i] for i in range(20_000)]  # what a grown store adds, partly in the oldest
    gc.collect()  # ... generation by now, as after a few seconds of ingest
    gc.callbacks.append(seen)
    try:
        assert FreezeOnGrowth().after_tick(10_000)
    finally:
        gc.callbacks.remove(seen)
    assert generations and max(generations) < 2
    assert gc.get_freeze_count() >= len(kept)  # the oldest generation was frozen all the same


def test_freezing_does_not_count_the_frozen_heap(
    frozen_process: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # gc.get_freeze_count() walks every frozen object holding the GIL (50-90 ms under load in
    # the server's tick): a log line is not worth it.
    def walks(*_: object) -> int:
        raise AssertionError("the permanent generation was walked")

    monkeypatch.setattr(gc, "get_freeze_count", walks)
    assert FreezeOnGrowth().after_tick(10_000)


def test_does_nothing_in_a_process_that_never_froze_its_start_up_heap() -> None:
    gc.unfreeze()
    assert not FreezeOnGrowth().after_tick(1_000_000)
    assert gc.get_freeze_count() == 0
