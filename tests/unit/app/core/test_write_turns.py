"""WriteTurns: a waiting ingest commit goes between two of the tick's transactions."""

from __future__ import annotations

import threading
import time

from app.core.write_turns import WriteTurns


def until(cond, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def test_a_waiting_ingest_commit_goes_before_the_ticks_next_write() -> None:
    turns = WriteTurns(max_wait_s=5.0)
    order: list[str] = []
    ingest_may_finish = threading.Event()

    def ingest() -> None:
        with turns.ingest_commit():
            order.append("ingest starts")
            ingest_may_finish.wait(5)
            order.append("ingest ends")

    with turns.background_write():
        order.append("tick write 1")
        t = threading.Thread(target=ingest)
        t.start()
        until(lambda: turns.ingest_waiting == 1)
        time.sleep(0.05)  # the ingest commit waits for this write, it does not run beside it
        assert order == ["tick write 1"]
    # The ingest commit runs now; the tick's next write waits until it has ended.
    threading.Timer(0.1, ingest_may_finish.set).start()
    with turns.background_write():
        order.append("tick write 2")
    t.join(5)
    assert order == ["tick write 1", "ingest starts", "ingest ends", "tick write 2"]
    assert turns.ingest_first == 1


def test_without_a_waiting_ingest_commit_the_tick_goes_on_at_once() -> None:
    turns = WriteTurns(max_wait_s=5.0)
    started = time.monotonic()
    for _ in range(50):
        with turns.background_write():
            pass
    assert time.monotonic() - started < 1.0
    assert turns.ingest_first == 0


def test_neither_side_waits_longer_than_the_bound() -> None:
    turns = WriteTurns(max_wait_s=0.1)
    stuck = threading.Event()

    def slow_ingest() -> None:
        with turns.ingest_commit():
            stuck.wait(5)  # an ingest commit that does not end (a slow disk)

    t = threading.Thread(target=slow_ingest)
    t.start()
    until(lambda: turns.ingest_waiting == 1)
    started = time.monotonic()
    with turns.background_write():  # goes on after the bound (SQLite's busy timeout decides then)
        waited = time.monotonic() - started
        started = time.monotonic()
        with turns.ingest_commit():  # and an ingest commit does not wait past it for the tick
            assert time.monotonic() - started < 1.0
    stuck.set()
    t.join(5)
    assert 0.05 <= waited < 1.0
