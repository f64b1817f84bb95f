"""Per-minute rollups of the series store, written to ``metric_rollup`` in the background.

Every ``rollup_interval_seconds`` each series' points of minutes that are complete (the server
clock is ``rollup_grace_seconds`` past the minute's end) and not yet rolled by this process are
aggregated into count/min/max/avg/last and upserted. An existing row for the same (series, minute)
is merged, not replaced (counts add, min/max widen, avg is count-weighted, last is the later one):
after a restart the store starts empty, and a minute that straddles the restart keeps what both
processes saw. Rows older than ``rollup_retention_days`` are deleted, as are series gone silent
for longer than the in-memory window.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import orjson
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine

from app.core.config import SeriesSettings
from app.metrics import ServerMetrics
from app.models import MetricRollup, from_epoch, utcnow
from app.services.series_store import SeriesKey, SeriesStore

log = logging.getLogger("rlguard.rollups")


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


class RollupWriter:
    def __init__(
        self,
        *,
        engine: Engine,
        store: SeriesStore,
        settings: SeriesSettings,
        metrics: ServerMetrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.store = store
        self.settings = settings
        self.metrics = metrics
        self._clock = clock
        # series -> start of the last minute this process rolled up
        self._rolled: dict[SeriesKey, float] = {}
        self._previous_marks: dict[SeriesKey, float] = {}
        self._task: asyncio.Task[None] | None = None

    def compute(self, now: float | None = None) -> list[RollupRow]:
        """Rows for every complete, not-yet-rolled minute (marks them as rolled)."""
        now = self._clock() if now is None else now
        complete_before = (now - self.settings.rollup_grace_seconds) // 60 * 60
        rows: list[RollupRow] = []
        self._previous_marks = {}
        for key in self.store.keys():
            done = self._rolled.get(key, float("-inf"))
            start = max(done + 60, complete_before - self.settings.window_seconds)
            points = [p for p in self.store.since(key, start) if p.ts < complete_before]
            if not points:
                continue
            sid = series_id(key)
            labels = dict(key.labels)
            minute_pts: dict[float, list[tuple[float, float]]] = {}
            for p in points:
                minute_pts.setdefault(p.ts // 60 * 60, []).append((p.ts, p.value))
            for minute, pts in minute_pts.items():
                values = [v for _, v in pts]
                last_ts, last = max(pts)
                rows.append(
                    RollupRow(
                        sid,
                        key.node,
                        key.name,
                        labels,
                        minute,
                        len(values),
                        min(values),
                        max(values),
                        sum(values) / len(values),
                        last,
                        last_ts,
                    )
                )
            self._previous_marks[key] = done
            self._rolled[key] = max(minute_pts)
        return rows

    def write(self, rows: list[RollupRow]) -> None:
        if not rows:
            return
        table = MetricRollup.__table__  # type: ignore[attr-defined]
        with self.engine.begin() as conn:
            ins = (postgresql if conn.dialect.name == "postgresql" else sqlite).insert(table)
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
            for i in range(0, len(rows), 500):
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
                        for r in rows[i : i + 500]
                    ],
                )
        self.metrics.rollup_rows.inc(len(rows))

    def prune(self) -> None:
        cutoff = utcnow() - timedelta(days=self.settings.rollup_retention_days)
        table = MetricRollup.__table__  # type: ignore[attr-defined]
        with self.engine.begin() as conn:
            conn.execute(sa.delete(table).where(table.c.minute < cutoff))
        stale_before = self._clock() - self.settings.window_seconds
        if self.store.drop_older_than(stale_before):
            live = set(self.store.keys())
            self._rolled = {k: v for k, v in self._rolled.items() if k in live}

    def run_once(self) -> int:
        rows = self.compute()
        try:
            self.write(rows)
        except Exception:
            # Un-mark so the next pass retries these minutes.
            for key, done in self._previous_marks.items():
                if done == float("-inf"):
                    self._rolled.pop(key, None)
                else:
                    self._rolled[key] = done
            raise
        self.prune()
        return len(rows)

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
