"""Per-minute rollups run as a leased scheduler job: only the lease holder writes them.

Two ``PolicyScheduler`` instances (two server replicas) on one database, each with its own
series store and ``RollupWriter``. With the shared window (real Redis, real follow threads)
every replica sees every sample, so a second writer would count each sample twice; with local
windows each sees only its own. The jobs are driven by hand (``tick`` takes the lease,
``rollup`` is the scheduled rollup job) and the writers get a fake clock, so that which minute
is complete is the test's choice, not the wall clock's; the lease itself runs on real time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry
from sqlmodel import Session, select

from app.core import migrate
from app.core.config import SeriesSettings
from app.core.db import make_engine
from app.core.lease import LEASE_NAME, lease_fence, lease_token
from app.core.server_metrics import ServerMetrics
from app.main import create_app
from app.models import MetricRollup
from app.scheduler import PolicyScheduler
from app.series.backend import RedisSeriesBackend, forget_shared_window
from app.series.rollups import LeaseLost, RollupWriter, series_id
from app.series.store import SeriesKey, SeriesStore
from tests.harness import AppClient, auth, make_settings, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

GRACE = 5.0
S = SeriesKey.of("n1", "load", {"gpu": "0"})  # reaches both replicas (a load balancer)
T = SeriesKey.of("n2", "load")  # reaches replica B only


def _base() -> float:
    """A minute boundary eight minutes ago: well inside the 900 s window and Redis trim."""
    return (time.time() // 60 - 8) * 60


def samples_for(base: float, minute: int) -> dict[str, list[tuple[SeriesKey, float, float]]]:
    """What each replica ingests for ``minute``: S split between A and B, T only through B."""
    m = base + 60 * minute
    return {
        "A": [(S, m + 1, 10.0 * minute + 1), (S, m + 3, 10.0 * minute + 3)],
        "B": [(S, m + 2, 10.0 * minute + 2), (S, m + 4, 10.0 * minute + 4)]
        + [(T, m + s, float(s)) for s in (10, 20, 30)],
    }


def expected(base: float, minutes: range) -> list[tuple[Any, ...]]:
    """One row per series and minute, counting every sample exactly once."""
    out = []
    for minute in minutes:
        per_key: dict[SeriesKey, list[tuple[float, float]]] = {}
        for part in samples_for(base, minute).values():
            for key, ts, v in part:
                per_key.setdefault(key, []).append((ts, v))
        for key, pts in per_key.items():
            values = [v for _, v in pts]
            out.append(
                (
                    series_id(key),
                    base + 60 * minute,
                    len(values),
                    min(values),
                    max(values),
                    pytest.approx(sum(values) / len(values)),
                    max(pts)[1],
                )
            )
    return sorted(out, key=lambda r: (r[1], r[0]))


def rollup_rows(engine: Any) -> list[tuple[Any, ...]]:
    with Session(engine) as s:
        rows = s.exec(select(MetricRollup)).all()
        return sorted(
            (
                (r.series_id, r.minute.timestamp(), r.count, r.min, r.max, r.avg, r.last)
                for r in rows
            ),
            key=lambda r: (r[1], r[0]),
        )


class Replica:
    """One server replica's pieces: store, optional shared-window follower, writer, scheduler."""

    def __init__(
        self,
        url: str,
        holder: str,
        clock: list[float],
        *,
        redis_url: str | None = None,
        lease_seconds: float = 30.0,
    ) -> None:
        self.holder = holder
        self.engine = make_engine(url)
        self.store = SeriesStore(window_seconds=900)
        self.metrics = ServerMetrics(CollectorRegistry())
        self.backend: RedisSeriesBackend | None = None
        if redis_url is not None:
            self.backend = RedisSeriesBackend(
                redis_url=redis_url,
                database_url=url,
                window_seconds=900,
                follow_interval=0.05,
                replica_id=holder,
            )
            self.backend.start(self.store)
        self.writer = RollupWriter(
            engine=self.engine,
            store=self.store,
            settings=SeriesSettings(
                rollup_grace_seconds=GRACE, window_seconds=900, shared_window=redis_url is not None
            ),
            metrics=self.metrics,
            clock=lambda: clock[0],
        )
        self.sched = PolicyScheduler(
            engine=self.engine,
            store=self.store,
            participants=lambda: [],
            dispatcher=None,
            lease_seconds=lease_seconds,
            holder=holder,
            rollups=self.writer,
        )

    def ingest(self, samples: list[tuple[SeriesKey, float, float]]) -> None:
        """As ingest does: into this replica's own store, then published to the others."""
        self.store.extend(samples)
        if self.backend is not None:
            self.backend.publish(samples, [])

    def roll(self) -> int:
        """What the running scheduler does: renew the lease (each tick), then the rollup job."""
        self.sched.tick()
        return self.sched.rollup()

    def rows_written(self) -> float:
        return self.metrics.rollup_rows._value.get()  # type: ignore[attr-defined]

    def close(self) -> None:
        if self.backend is not None:
            self.backend.stop()
        self.engine.dispose()


@pytest.fixture
def pg(postgres_url: str) -> str:
    migrate.upgrade(postgres_url)
    return postgres_url


@pytest.fixture
def replicas_factory() -> Iterator[Any]:
    made: list[Replica] = []

    def make(*args: Any, **kwargs: Any) -> Replica:
        r = Replica(*args, **kwargs)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def wait_followed(replicas: list[Replica], counts: dict[SeriesKey, int]) -> None:
    def have() -> list[dict[SeriesKey, int]]:
        return [{k: len(r.store.since(k, 0)) for k in counts} for r in replicas]

    wait_for(
        lambda: all(h == counts for h in have()),
        15,
        "every window to hold every sample",
        interval=0.05,
        context=lambda: str(have()),
    )


@pytest.mark.parametrize("handover", ["released", "expired"])
def test_shared_window_only_the_holder_rolls_up_and_the_next_holder_continues_exactly(
    pg: str, redis_url: str, replicas_factory: Any, handover: str
) -> None:
    base = _base()
    clock = [base]
    lease = 30.0 if handover == "released" else 3.0
    a = replicas_factory(pg, "replica-a", clock, redis_url=redis_url, lease_seconds=lease)
    b = replicas_factory(pg, "replica-b", clock, redis_url=redis_url, lease_seconds=lease)
    try:
        for minute in range(4):
            part = samples_for(base, minute)
            a.ingest(part["A"])
            b.ingest(part["B"])
        wait_followed([a, b], {S: 16, T: 12})  # both windows hold both replicas' samples

        assert a.sched.tick() is not None and a.sched.is_leader()
        assert b.sched.tick() is None and not b.sched.is_leader()

        clock[0] = base + 60 + GRACE + 1  # minute 0 complete
        assert b.roll() == 0  # not the holder: writes nothing, even though it sees all
        assert a.roll() == 2
        assert b.roll() == 0
        assert rollup_rows(a.engine) == expected(base, range(1))
        clock[0] = base + 120 + GRACE + 1  # minute 1 complete
        assert a.roll() == 2
        assert b.roll() == 0
        assert rollup_rows(a.engine) == expected(base, range(2))
        assert b.rows_written() == 0

        clock[0] = base + 180 + GRACE + 1  # minute 2 complete
        if handover == "released":
            # A stops: its last pass writes minute 2 under the lease, then it lets go.
            a.sched.stop()
            assert rollup_rows(a.engine) == expected(base, range(3))
            assert b.sched.tick() is not None
        else:
            # A dies before rolling minute 2 (it just stops renewing): B takes over once the
            # lease has run out, and minute 2 is B's to write.
            wait_for(lambda: b.sched.tick() is not None, 10, "B to take the expired lease")
            assert rollup_rows(a.engine) == expected(base, range(2))
        assert b.sched.is_leader()

        # B saw minutes 0-2 in its window too; it writes only what A did not.
        assert b.roll() == (0 if handover == "released" else 2)
        assert rollup_rows(b.engine) == expected(base, range(3))
        clock[0] = base + 240 + GRACE + 1  # minute 3 complete
        assert b.roll() == 2
        assert b.roll() == 0
        assert rollup_rows(b.engine) == expected(base, range(4))  # no gap, nothing twice

        if handover == "expired":
            # A comes back without knowing: it is no holder any more and writes nothing.
            assert a.sched.rollup() == 0 and not a.sched.is_leader()
            assert a.sched.tick() is None
            assert rollup_rows(b.engine) == expected(base, range(4))
    finally:
        forget_shared_window(redis_url, pg)


def test_a_holder_that_lost_the_lease_mid_pass_writes_nothing(
    database_url: str, replicas_factory: Any
) -> None:
    """The fence: a pass that began under A's token cannot commit once B holds the lease."""
    migrate.upgrade(database_url)
    base = _base()
    clock = [base + 60 + GRACE + 1]
    a = replicas_factory(database_url, "replica-a", clock, lease_seconds=1.0)
    b = replicas_factory(database_url, "replica-b", clock, lease_seconds=30.0)
    a.ingest(samples_for(base, 0)["A"])
    assert a.sched.tick() is not None
    token = lease_token(a.engine, holder="replica-a")
    assert token is not None
    # A stalls past its lease; B takes over
    wait_for(lambda: b.sched.tick() is not None, 10, "B to take the lease over")
    assert lease_token(b.engine, holder="replica-b") == token + 1
    assert lease_token(a.engine, holder="replica-a") is None

    fence = lease_fence(holder="replica-a", token=token)
    with pytest.raises(LeaseLost, match="changed hands"):
        a.writer.run_once(fence=fence)
    assert rollup_rows(a.engine) == []  # rolled back with the fence
    assert a.rows_written() == 0
    # The minute was un-marked: were the lease A's again, it would still write it.
    assert a.writer.compute() != []
    with Session(a.engine) as s:
        s.execute(
            sa.text("UPDATE scheduler_lease SET holder = 'replica-a' WHERE name = :n"),
            {"n": LEASE_NAME},
        )
        s.commit()
    with a.engine.begin() as conn:  # the fence compares the token, not only the holder
        assert lease_fence(holder="replica-a", token=token)(conn) is False
        assert lease_fence(holder="replica-a", token=token + 1)(conn) is True


def test_local_windows_the_holder_rolls_up_what_it_ingested_and_a_successor_adds_its_own(
    database_url: str, replicas_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Without the shared window each replica's window holds only its own samples (run one
    server per database). The samples of a non-holder are not written while it is one; a
    successor that still has them in its window merges them into the rows (never twice)."""
    migrate.upgrade(database_url)
    base = _base()
    clock = [base + 60 + GRACE + 1]  # minute 0 complete
    a = replicas_factory(database_url, "replica-a", clock)
    b = replicas_factory(database_url, "replica-b", clock)
    part = samples_for(base, 0)
    a.ingest(part["A"])
    b.ingest(part["B"])
    assert a.sched.tick() is not None and b.sched.tick() is None

    with caplog.at_level(logging.WARNING, logger="rlguard.scheduler"):
        assert b.roll() == 0
        assert b.roll() == 0
    warnings = [r for r in caplog.records if "its series window is not shared" in r.message]
    assert len(warnings) == 1  # said once, not every pass
    assert a.roll() == 1
    only_a = rollup_rows(a.engine)
    assert [(r[0], r[2], r[3], r[4]) for r in only_a] == [(series_id(S), 2, 1.0, 3.0)]

    a.sched.stop()  # final pass (nothing new) and the lease goes
    assert b.roll() == 2
    assert rollup_rows(b.engine) == expected(base, range(1))  # A's and B's samples, once each
    assert b.roll() == 0


def test_the_scheduler_runs_rollups_as_a_leased_job(database_url: str) -> None:
    """A real APScheduler: the rollup job writes while the lease is held; stop() writes the
    last complete minute and then releases the lease."""
    migrate.upgrade(database_url)
    engine = make_engine(database_url)
    store = SeriesStore(window_seconds=900)
    clock = [_base() + 60 + 1]
    writer = RollupWriter(
        engine=engine,
        store=store,
        settings=SeriesSettings(rollup_interval_seconds=0.2, rollup_grace_seconds=0),
        metrics=ServerMetrics(CollectorRegistry()),
        clock=lambda: clock[0],
    )
    sched = PolicyScheduler(
        engine=engine,
        store=store,
        participants=lambda: [],
        dispatcher=None,
        holder="only",
        rollups=writer,
    )
    base = clock[0] - 61
    store.extend([(S, base + 5, 1.0), (S, base + 65, 2.0)])
    sched.start()
    try:
        assert writer.scheduled_by == "only"
        wait_for(lambda: rollup_rows(engine), 20, "the scheduled job's rollup", interval=0.05)
        assert [(r[1], r[2]) for r in rollup_rows(engine)] == [(base, 1)]
        clock[0] += 60  # minute 1 complete; stop() must not lose it
    finally:
        sched.stop()
    assert [(r[1], r[2]) for r in rollup_rows(engine)] == [(base, 1), (base + 60, 1)]
    assert writer.scheduled_by is None
    assert lease_token(engine, holder="only") is None  # released
    engine.dispose()


def test_two_server_replicas_with_a_shared_window_write_each_sample_once(
    postgres_url: str, redis_url: str, tmp_path: Path
) -> None:
    """Two apps (policy scheduler included) on one PostgreSQL and one Redis window: a batch
    ingested through one is rolled up by the lease holder alone, so counts are not doubled."""
    migrate.upgrade(postgres_url)
    clients = []
    try:
        for i in range(2):
            settings = make_settings(
                postgres_url,
                tmp_path / f"data{i}",
                redis_url=redis_url,
                series={
                    "shared_window": True,
                    "shared_follow_interval_seconds": 0.1,
                    "rollup_interval_seconds": 0.2,
                    "rollup_grace_seconds": 0,
                },
            )
            clients.append(AppClient(create_app(settings)))
        apps = [c.app for c in clients]
        holders = {app.state.policy_scheduler.holder for app in apps}
        assert {app.state.rollups.scheduled_by for app in apps} == holders  # leased jobs

        from tests.harness import Api, batch

        api = Api(clients[1])
        token = api.node_token("node-a")
        body = batch("node-a", 0, n=4)
        minute_ago = (time.time() // 60 - 1) * 60
        for i, s in enumerate(body["samples"]):
            s["ts"] = minute_ago + i
        r = clients[1].post("/api/v1/ingest", json=body, headers=auth(token))
        assert r.status_code == 200, r.text

        engine = api.engine
        wait_for(lambda: len(rollup_rows(engine)) >= 2, 30, "two rollup rows")
        time.sleep(
            1.5
        )  # the scenario: several more passes of both replicas: still one count per sample
        counts = sorted(row[2] for row in rollup_rows(engine))
        assert counts == [2, 2]  # gpu 0 and gpu 1, two samples each
        written = [app.state.metrics.rollup_rows._value.get() for app in apps]
        assert sorted(written) == [0, 2]  # the holder wrote both rows, the other none
    finally:
        for c in reversed(clients):
            c.close()
        forget_shared_window(redis_url, postgres_url)
