"""Per-minute rollups of the series store, written to ``metric_rollup``.

Every ``rollup_interval_seconds`` each series' points of complete minutes (the server clock is
``rollup_grace_seconds`` past the minute's end) not yet rolled are aggregated into
count/min/max/avg/last and upserted. A row already there for the same (series, minute) is merged,
not replaced, so a minute that straddles a restart keeps what both processes saw. Rows older
than ``rollup_retention_days`` are deleted, as are series silent for longer than the window.

The pass is one of the policy scheduler's leased jobs (``RollupWriter.run_scheduled``): only the
lease holder writes, each transaction fenced by the holder and fencing token the pass started
with (a fenced-out transaction writes nothing; its minutes stay unrolled). It rolls up its own
window: local windows never share a sample, so merging is exact; with a shared window a new
holder first reads each series' newest rolled minute (``take_over``) and rolls only later ones,
so no sample counts twice. A pass writes ``WRITE_CHUNK_ROWS`` rows per transaction (a series'
rows never split), each after the ingest commits waiting for SQLite's write lock
(``app.core.write_turns``); a failed transaction un-marks only the series not yet written.
Without a scheduler in the process ``running_alone`` runs the pass per process (local window).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from operator import itemgetter

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from app.core.config import SeriesSettings
from app.core.db import dialect_insert, table_of
from app.core.lease import HeldLease
from app.core.server_metrics import ServerMetrics
from app.core.write_turns import WriteTurns, background_turn
from app.models import MetricRollup, from_epoch, utcnow
from app.series.store import SeriesKey, SeriesStore

_ts_of = itemgetter(0)
_value_of = itemgetter(1)

log = logging.getLogger("rlguard.rollups")

#: Rows per write transaction (~10 ms of SQLite's write lock on the 2-core test machine).
WRITE_CHUNK_ROWS = 500


def series_id(key: SeriesKey) -> str:
    raw = orjson.dumps([key.node, key.name, key.labels])
    return hashlib.sha1(raw, usedforsecurity=False).hexdigest()


@dataclass(slots=True)
class RollupRow:
    series_id: str
    node: str
    name: str
    labels: dict[str, str]
    minute: float
    count: int
    min: float
    max: float
    avg: float
    last: float
    last_ts: float


class LeaseLost(RuntimeError):
    """The scheduler lease changed hands during a rollup pass: nothing more was written."""


#: Checked inside the write transaction, after the upserts: True while the pass may commit.
Fence = Callable[[Connection], bool]


class RollupWriter:
    def __init__(
        self,
        *,
        engine: Engine,
        store: SeriesStore,
        settings: SeriesSettings,
        metrics: ServerMetrics,
        clock: Callable[[], float] = time.time,
        write_turns: WriteTurns | None = None,
    ) -> None:
        self.engine = engine
        self.store = store
        self.write_turns = write_turns  # SQLite: ingest's commits go between the transactions
        self.settings = settings
        self.metrics = metrics
        self._clock = clock
        # series -> start of the last minute this process rolled up
        self._rolled: dict[SeriesKey, float] = {}
        self._previous_marks: dict[SeriesKey, float] = {}
        self._committed: set[str] = set()  # series ids whose rows this pass has committed
        # series_id -> newest minute in the database when this process took the lease (shared
        # window only), for series not yet in ``_rolled``
        self._written: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None
        #: The scheduler that runs the passes under its lease (None: nobody does yet).
        self.scheduled_by: str | None = None
        self._lease_token: int | None = None  # the lease's token when this writer took over
        self._warned_unrolled = False

    @property
    def shared(self) -> bool:
        return self.settings.shared_window

    def take_over(self) -> None:
        """This process just took the scheduler lease: with a shared window, skip every minute
        the database already holds (the previous holder rolled it from the same samples)."""
        self._written = {}
        if not self.shared:
            return  # a local window never overlaps another process's rows: merge them
        t = table_of(MetricRollup)
        horizon = from_epoch(self._clock() - self.settings.window_seconds - 120)
        with self.engine.connect() as conn:
            found = conn.execute(
                sa.select(t.c.series_id, sa.func.max(t.c.minute))
                .where(t.c.minute >= horizon)
                .group_by(t.c.series_id)
            ).all()
        written = {sid: minute.timestamp() for sid, minute in found}
        for key in self.store.keys():
            minute = written.pop(series_id(key), None)
            if minute is not None and minute > self._rolled.get(key, float("-inf")):
                self._rolled[key] = minute
        self._written = written

    def compute(self, now: float | None = None) -> list[RollupRow]:
        """Rows for every complete, not-yet-rolled minute (marks them as rolled)."""
        now = self._clock() if now is None else now
        complete_before = (now - self.settings.rollup_grace_seconds) // 60 * 60
        rows: list[RollupRow] = []
        self._previous_marks = {}
        for key in self.store.keys():
            done = self._rolled.get(key, float("-inf"))
            start = max(done + 60, complete_before - self.settings.window_seconds)
            points = self.store.between(key, start, complete_before)  # sorted (ts, value)
            if not points:
                continue
            sid = series_id(key)
            if key not in self._rolled and self._written:
                # a series this process first saw after taking the lease over
                done = self._written.pop(sid, done)
                points = points[bisect.bisect_left(points, (done + 60,)) :]
                if not points:
                    self._rolled[key] = done
                    continue
            labels = dict(key.labels)
            # One pass per minute over C-level slices: a pass reads every sample of the last
            # rollup interval (180k samples/s at 10,000 GPUs), so no per-point Python here.
            stamps = list(map(_ts_of, points))
            values = list(map(_value_of, points))
            i, n = 0, len(points)
            minute = start
            while i < n:
                minute = stamps[i] // 60 * 60
                j = bisect.bisect_left(stamps, minute + 60, i)
                chunk = values[i:j]
                last_ts, last = max(points[i:j])
                rows.append(
                    RollupRow(
                        sid,
                        key.node,
                        key.name,
                        labels,
                        minute,
                        j - i,
                        min(chunk),
                        max(chunk),
                        sum(chunk) / (j - i),
                        last,
                        last_ts,
                    )
                )
                i = j
            self._previous_marks[key] = done
            self._rolled[key] = minute
        return rows

    def write(self, rows: list[RollupRow], *, fence: Fence | None = None) -> None:
        """Upsert ``rows``, ``WRITE_CHUNK_ROWS`` per transaction; with ``fence``, each commits
        only while it holds. The series of each committed transaction join ``_committed``."""
        if not rows:
            return
        table = table_of(MetricRollup)
        ins = dialect_insert(self.engine.dialect.name, table)
        ex = ins.excluded
        stmt = ins.on_conflict_do_update(
            index_elements=["series_id", "minute"],
            set_={
                "count": table.c.count + ex.count,
                "min": sa.case((ex.min < table.c.min, ex.min), else_=table.c.min),
                "max": sa.case((ex.max > table.c.max, ex.max), else_=table.c.max),
                "avg": (table.c.avg * table.c.count + ex.avg * ex.count)
                / (table.c.count + ex.count),
                "last": sa.case((ex.last_ts >= table.c.last_ts, ex.last), else_=table.c.last),
                "last_ts": sa.case(
                    (ex.last_ts >= table.c.last_ts, ex.last_ts), else_=table.c.last_ts
                ),
            },
        )
        for chunk in _by_series(rows, WRITE_CHUNK_ROWS):
            with background_turn(self.write_turns), self.engine.begin() as conn:
                conn.execute(
                    stmt,
                    [
                        {
                            "series_id": r.series_id,
                            "node": r.node,
                            "name": r.name,
                            "labels": r.labels,
                            "minute": from_epoch(r.minute),
                            "count": r.count,
                            "min": r.min,
                            "max": r.max,
                            "avg": r.avg,
                            "last": r.last,
                            "last_ts": r.last_ts,
                        }
                        for r in chunk
                    ],
                )
                # Checked last, while this transaction already holds its write locks: a
                # takeover either committed before (then we roll back) or waits until we have
                # committed.
                if fence is not None and not fence(conn):
                    raise LeaseLost("the scheduler lease changed hands; rollup rows not written")
            self._committed.update(r.series_id for r in chunk)
            self.metrics.rollup_rows.inc(len(chunk))

    def prune(self) -> None:
        self.delete_expired_rows()
        self.forget_silent_series()

    def delete_expired_rows(self) -> None:
        cutoff = utcnow() - timedelta(days=self.settings.rollup_retention_days)
        table = table_of(MetricRollup)
        expired = sa.select(table.c.id).where(table.c.minute < cutoff).limit(WRITE_CHUNK_ROWS)
        deleted = WRITE_CHUNK_ROWS
        while deleted == WRITE_CHUNK_ROWS:  # in short transactions, as the rows are written
            with background_turn(self.write_turns), self.engine.begin() as conn:
                deleted = conn.execute(sa.delete(table).where(table.c.id.in_(expired))).rowcount

    def run_scheduled(self, lease: HeldLease) -> int:
        """The scheduler's rollup job; the rows written. A pass only on the replica holding
        ``lease``, fenced by its token (a new token is a takeover: :meth:`take_over` first); the
        others only forget series gone silent."""
        token = lease.token()
        if token is None:
            self.forget_silent_series()
            self._warn_unrolled()
            return 0
        if token != self._lease_token:
            self.take_over()
            self._lease_token = token
        try:
            return self.run_once(fence=lease.fence(token))
        except LeaseLost:
            self._lease_token = None  # take over again (re-read the rows) if it comes back
            log.info("scheduler lease lost during a rollup pass; the new holder rolls up")
            return 0
        except Exception:
            self.metrics.rollup_failures.inc()
            raise

    def lease_released(self) -> None:
        """The scheduler let the lease go: a later hold is a takeover again."""
        self._lease_token = None

    def _warn_unrolled(self) -> None:
        if self.shared or self._warned_unrolled or not len(self.store):
            return
        self._warned_unrolled = True
        log.warning(
            "this replica does not hold the scheduler lease and its series window is not "
            "shared: the samples it ingests are rolled up only if it takes the lease while they "
            "are in its window; run one server per database or set "
            "RLGUARD_SERIES__SHARED_WINDOW=true"
        )

    def forget_silent_series(self) -> None:
        """Drop series silent for longer than the window (every replica, leader or not)."""
        stale_before = self._clock() - self.settings.window_seconds
        if self.store.drop_older_than(stale_before):
            live = set(self.store.keys())
            self._rolled = {k: v for k, v in self._rolled.items() if k in live}

    def run_once(self, *, fence: Fence | None = None) -> int:
        rows = self.compute()
        self._committed = set()
        try:
            if fence is None:
                self.write(rows)
            else:
                self.write(rows, fence=fence)
        except Exception:
            # Un-mark what was not committed, so the next pass retries those minutes.
            for key, done in self._previous_marks.items():
                if self._committed and series_id(key) in self._committed:
                    continue
                if done == float("-inf"):
                    self._rolled.pop(key, None)
                else:
                    self._rolled[key] = done
            raise
        self.prune()
        return len(rows)

    # -- without a scheduler in the process ---------------------------------------------------

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.rollup_interval_seconds)
            try:
                await asyncio.to_thread(self.run_once)
            except Exception:
                self.metrics.rollup_failures.inc()
                log.exception("rollup pass failed; retrying next interval")

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="rlguard-rollups")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task  # we cancelled it; its CancelledError is expected
            self._task = None
        try:
            await asyncio.to_thread(self.run_once)
        except Exception:
            log.exception("final rollup pass failed")

    @contextlib.asynccontextmanager
    async def running_alone(self) -> AsyncIterator[None]:
        """The per-process loop, for a server without the policy scheduler.

        A local window is this process's own samples: rolled here, merged with any other
        process's rows. A shared window is left to the scheduler lease holder of another
        replica; rolling it here too would count every sample twice.
        """
        if self.shared:
            log.warning(
                "no policy scheduler in this process and the series window is shared: this "
                "replica writes no rollups (the scheduler lease holder does)"
            )
            yield
            return
        self.start()
        try:
            yield
        finally:
            await self.stop()


def _by_series(rows: list[RollupRow], size: int) -> Iterator[list[RollupRow]]:
    """``rows`` (a series' rows next to each other, as ``compute`` makes them) in chunks of
    about ``size``, a series' rows never split between two."""
    chunk: list[RollupRow] = []
    for row in rows:
        if len(chunk) >= size and row.series_id != chunk[-1].series_id:
            yield chunk
            chunk = []
        chunk.append(row)
    if chunk:
        yield chunk
