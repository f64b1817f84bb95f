"""Per-minute rollups written from the series store, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from prometheus_client import CollectorRegistry
from sqlmodel import Session, select

from app.core.config import SeriesSettings
from app.core.db import make_engine
from app.core.server_metrics import ServerMetrics
from app.core.write_turns import WriteTurns
from app.models import MetricRollup, from_epoch, utcnow
from app.series.rollups import WRITE_CHUNK_ROWS, LeaseLost, RollupWriter, series_id
from app.series.store import SeriesKey, SeriesStore
from tests.harness import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

T0 = 1_800_000_000.0 // 60 * 60  # a minute boundary


def rows(engine) -> list[tuple]:  # type: ignore[no-untyped-def]
    with Session(engine) as s:
        return [
            (
                r.node,
                r.name,
                r.labels,
                r.minute.timestamp() - T0,
                r.count,
                r.min,
                r.max,
                r.avg,
                r.last,
            )
            for r in s.exec(
                select(MetricRollup).order_by(MetricRollup.minute, MetricRollup.name)
            ).all()
        ]


def writer(engine, store: SeriesStore, now: list[float]) -> RollupWriter:  # type: ignore[no-untyped-def]
    return RollupWriter(
        engine=engine,
        store=store,
        settings=SeriesSettings(rollup_grace_seconds=5, window_seconds=900),
        metrics=ServerMetrics(CollectorRegistry()),
        clock=lambda: now[0],
    )


def test_complete_minutes_are_rolled_once_and_merged_across_restarts(migrated_url: str) -> None:
    engine = make_engine(migrated_url)
    store = SeriesStore(window_seconds=900)
    key = SeriesKey.of("n1", "gpu_util", {"gpu": "0"})
    store.extend([(key, T0 + s, float(s)) for s in (0, 10, 20, 50)])  # minute 0: 0,10,20,50
    store.extend([(key, T0 + 60 + s, 100.0 + s) for s in (0, 30)])  # minute 1: 100,130
    now = [T0 + 66]  # minute 0 is complete (60 s + 5 s grace), minute 1 is not
    w = writer(engine, store, now)
    assert w.run_once() == 1
    assert rows(engine) == [("n1", "gpu_util", {"gpu": "0"}, 0.0, 4, 0.0, 50.0, 20.0, 50.0)]
    assert w.run_once() == 0  # nothing new: minute 0 is not written twice
    now[0] = T0 + 130
    assert w.run_once() == 1
    assert rows(engine)[1] == ("n1", "gpu_util", {"gpu": "0"}, 60.0, 2, 100.0, 130.0, 115.0, 130.0)

    # a restarted server saw later points of minute 1 (e.g. a replayed batch): merged, not replaced
    store2 = SeriesStore(window_seconds=900)
    store2.extend([(key, T0 + 61, 90.0), (key, T0 + 70, 200.0)])
    w2 = writer(engine, store2, now)
    assert w2.run_once() == 1
    merged = rows(engine)[1]
    assert merged == (
        "n1",
        "gpu_util",
        {"gpu": "0"},
        60.0,
        4,
        90.0,
        200.0,
        pytest.approx(130.0),
        130.0,
    )
    engine.dispose()


def test_failed_write_is_retried_and_old_rows_pruned(migrated_url: str) -> None:
    engine = make_engine(migrated_url)
    store = SeriesStore()
    key = SeriesKey.of("n1", "m")
    store.append(key, T0 + 1, 1.0)
    now = [T0 + 70]
    w = writer(engine, store, now)
    real_write = w.write

    def failing(_rows):  # type: ignore[no-untyped-def]
        raise RuntimeError("database down")

    w.write = failing  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        w.run_once()
    w.write = real_write  # type: ignore[method-assign]
    assert w.run_once() == 1  # the minute was un-marked, so it is written now
    assert len(rows(engine)) == 1

    with Session(engine) as s:
        s.add(
            MetricRollup(
                series_id=series_id(key),
                node="n1",
                name="m",
                labels={},
                minute=utcnow() - timedelta(days=31),
                count=1,
                min=0,
                max=0,
                avg=0,
                last=0,
                last_ts=0,
            )
        )
        s.commit()
    assert len(rows(engine)) == 2
    w.prune()
    assert len(rows(engine)) == 1
    assert from_epoch(T0).timestamp() == T0
    engine.dispose()


def test_the_running_server_writes_rollups_in_the_background(migrated_url: str, make_api) -> None:  # type: ignore[no-untyped-def]
    import time

    from tests.harness import auth, batch

    api = make_api(migrated_url, series={"rollup_interval_seconds": 0.2, "rollup_grace_seconds": 0})
    token = api.node_token("node-a")
    body = batch("node-a", 0, n=2)
    minute_ago = (time.time() // 60 - 1) * 60
    for i, s in enumerate(body["samples"]):
        s["ts"] = minute_ago + i
    assert api.client.post("/api/v1/ingest", json=body, headers=auth(token)).status_code == 200
    wait_for(lambda: rows(api.engine), 20, "a rollup row")
    assert sorted((r[2]["gpu"], r[4], r[8]) for r in rows(api.engine)) == [
        ("0", 1, 0.0),
        ("1", 1, 1.0),
    ]


def test_a_large_pass_commits_in_short_transactions_and_a_failed_one_is_retried_once(
    migrated_url: str,
) -> None:
    """1,200 series: three transactions. The lease is lost after the first: its 500 series
    stay written and are not added again by the next pass; the other 700 are written then."""
    engine = make_engine(migrated_url)
    store = SeriesStore(window_seconds=900)
    keys = [SeriesKey.of("n1", "gpu_util", {"gpu": str(g)}) for g in range(1200)]
    store.extend([(k, T0 + s, 1.0) for k in keys for s in (0, 30)])  # 2 points each, minute 0
    now = [T0 + 70]
    w = writer(engine, store, now)
    holds = iter([True])  # the first transaction's fence holds, the second finds it changed

    with pytest.raises(LeaseLost):
        w.run_once(fence=lambda _conn: next(holds, False))
    first = rows(engine)
    assert len(first) == WRITE_CHUNK_ROWS
    assert {r[4] for r in first} == {2}

    assert w.run_once(fence=lambda _conn: True) == 1200 - WRITE_CHUNK_ROWS
    after = rows(engine)
    assert len(after) == 1200
    assert {r[4] for r in after} == {2}  # every series' 2 samples counted once
    assert w.run_once() == 0
    engine.dispose()


def test_a_pass_lets_a_waiting_ingest_commit_go_between_its_transactions(
    migrated_url: str,
) -> None:
    engine = make_engine(migrated_url)
    store = SeriesStore(window_seconds=900)
    store.extend([(SeriesKey.of("n1", "m", {"gpu": str(g)}), T0 + 1, 1.0) for g in range(600)])
    turns = WriteTurns(max_wait_s=60)  # never goes on anyway while the test looks
    w = writer(engine, store, [T0 + 70])
    w.write_turns = turns
    passed: list[int] = []
    with turns.ingest_commit():  # an ingest commit is waiting for the write lock, or writing
        pass_thread = threading.Thread(target=lambda: passed.append(w.run_once()))
        pass_thread.start()
        wait_for(lambda: turns.ingest_first == 1, 10, "the pass to wait for the ingest commit")
        assert rows(engine) == []  # its first transaction has not begun
    pass_thread.join(10)
    assert passed == [600]
    assert len(rows(engine)) == 600
    engine.dispose()
