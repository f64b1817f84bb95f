"""The policy tick's own cost: the lease is written once a third of the way through it, not on
every tick (a tick was mostly one fsync'd lease write queued behind ingest commits, and
overran the demo's 0.5 s interval), and the first, cold tick runs before the server serves.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from app.core import migrate
from app.core.config import Settings
from app.core.db import make_engine
from app.core.lease import LEASE_NAME
from app.main import create_app
from app.models._types import utcnow
from app.scheduler import PolicyScheduler
from app.series.store import SeriesStore

pytestmark = pytest.mark.timeout(60)


def _scheduler(tmp_path: Path, lease_seconds: float) -> tuple[PolicyScheduler, list[str]]:
    url = f"sqlite:///{tmp_path / 'rlguard.db'}"
    migrate.upgrade(url)
    engine = make_engine(url)
    lease_writes: list[str] = []

    @sa.event.listens_for(engine, "before_cursor_execute")
    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "scheduler_lease" in statement and statement.lstrip().upper().startswith(
            ("UPDATE", "INSERT")
        ):
            lease_writes.append(statement.split()[0])

    sched = PolicyScheduler(
        engine=engine,
        store=SeriesStore(window_seconds=60, max_points=10),
        participants=list,
        dispatcher=None,
        lease_seconds=lease_seconds,
    )
    return sched, lease_writes


def _expires_at(engine: Engine) -> datetime:
    with engine.connect() as conn:
        value = conn.execute(
            sa.text("SELECT expires_at FROM scheduler_lease WHERE name = :n"), {"n": LEASE_NAME}
        ).scalar_one()
    parsed = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed


def test_back_to_back_ticks_write_the_lease_once(tmp_path: Path) -> None:
    sched, writes = _scheduler(tmp_path, lease_seconds=30.0)
    for _ in range(20):
        assert sched.tick() is not None
    assert writes == ["UPDATE", "INSERT"]  # the first tick took it; 19 ticks wrote nothing


def test_the_holder_renews_in_time_and_never_acts_on_an_expired_lease(tmp_path: Path) -> None:
    lease = 1.5
    sched, writes = _scheduler(tmp_path, lease_seconds=lease)
    ticks = 0
    started = time.monotonic()
    while time.monotonic() - started < 2 * lease:  # ticking as the interval job would, faster
        assert sched.tick() is not None
        ticks += 1
        assert sched.is_leader()
        # whenever it acts as the holder, the row says it holds the lease
        assert _expires_at(sched.engine) > utcnow()
        time.sleep(0.02)
    renewals = writes.count("UPDATE")
    assert renewals >= 3 and renewals <= ticks // 2, (renewals, ticks)


def test_the_first_tick_has_run_when_the_server_starts_serving(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'rlguard.db'}"
    migrate.upgrade(url)
    app = create_app(Settings(dev=True, database_url=url, data_dir=tmp_path / "data"))  # type: ignore[call-arg]

    async def ticked_before_serving() -> bool:
        async with app.router.lifespan_context(app):
            sched: PolicyScheduler = app.state.policy_scheduler
            return sched.last_tick is not None

    assert asyncio.run(ticked_before_serving())  # the cold tick ran during start-up


@pytest.mark.parametrize("dry_run", [False, True])
def test_the_server_tick_plans_under_the_global_dry_run_setting(
    tmp_path: Path, dry_run: bool
) -> None:
    url = f"sqlite:///{tmp_path / 'rlguard.db'}"
    migrate.upgrade(url)
    app = create_app(
        Settings(
            dev=True,
            database_url=url,
            data_dir=tmp_path / "data",  # type: ignore[call-arg]
            automation={"dry_run": dry_run},
        )
    )

    async def scheduler_dry_run() -> bool:
        async with app.router.lifespan_context(app):
            sched: PolicyScheduler = app.state.policy_scheduler
            return sched.dry_run

    assert asyncio.run(scheduler_dry_run()) is dry_run


def test_the_server_tick_takes_turns_with_ingest_and_its_jobs_are_named(tmp_path: Path) -> None:
    from apscheduler.util import get_callable_name

    url = f"sqlite:///{tmp_path / 'rlguard.db'}"
    migrate.upgrade(url)
    app = create_app(Settings(dev=True, database_url=url, data_dir=tmp_path / "data"))  # type: ignore[call-arg]

    async def wiring() -> tuple[bool, list[str]]:
        async with app.router.lifespan_context(app):
            sched: PolicyScheduler = app.state.policy_scheduler
            shared = (
                sched.write_turns is not None and sched.write_turns is app.state.ingest.write_turns
            )
            assert sched._scheduler is not None  # noqa: SLF001
            return shared, sorted(job.name for job in sched._scheduler.get_jobs())  # noqa: SLF001

    shared, names = asyncio.run(wiring())
    assert shared  # SQLite: the tick's incident writes let ingest's commits go between them
    # APScheduler's "skipped: maximum number of running instances" warning names the job.
    assert "tick" in names and "dispatch" in names
    assert get_callable_name(PolicyScheduler._safe(lambda: None)) == "<lambda>"  # noqa: SLF001
