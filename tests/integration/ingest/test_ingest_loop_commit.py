"""PostgreSQL group commits awaited on the event loop (app.ingest.commit.postgres_loop): used for
postgresql+psycopg, durable when answered, back after the server drops the connection, off by
setting, never for SQLite or the shared window, and bad input refused by name."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import sqlalchemy as sa
from pydantic import ValidationError

from app.core import migrate
from app.core.config import Settings
from app.ingest.commit import Committer, choose_committer
from app.ingest.commit.postgres_loop import (
    APPLICATION_NAME,
    LoopPostgresCommitter,
    supports_loop_commits,
)
from app.ingest.commit.thread import ThreadCommitter
from app.models import IngestCursor
from app.series.backend import LocalSeriesBackend
from tests.harness import Api, auth, batch, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _cursors(api: Api) -> list[tuple[str, int]]:
    t = IngestCursor.__table__  # type: ignore[attr-defined]
    with api.engine.connect() as conn:
        return sorted((r[0], r[1]) for r in conn.execute(sa.select(t.c.node_name, t.c.high_seq)))


def _post(api: Api, token: str, seq: int):  # type: ignore[no-untyped-def]
    return api.client.post("/api/v1/ingest", json=batch("node-a", seq, n=4), headers=auth(token))


def _commits(api: Api, path: str) -> float:
    text = api.client.get("/metrics").text
    line = f'rlguard_ingest_commits_total{{path="{path}"}}'
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith(line))


def _chosen(settings: Settings) -> Committer:
    return choose_committer(settings, sa.create_engine(settings.db_url), LocalSeriesBackend())


@pytest.fixture
def pg_api(postgres_url: str, make_api: Callable[..., Api]) -> Api:
    migrate.upgrade(postgres_url)
    return make_api(postgres_url, ingest={"commit_timeout_seconds": 30})


def test_postgres_commits_are_awaited_on_the_loop_and_durable_when_answered(
    pg_api: Api,
) -> None:
    committer = pg_api.app.state.ingest.committer
    assert isinstance(committer, LoopPostgresCommitter)
    token = pg_api.node_token("node-a")
    for seq in range(3):
        assert _post(pg_api, token, seq).json() == {"accepted": 4, "duplicate": False}
        assert _cursors(pg_api) == [("node-a", seq)]  # committed before the answer
    assert committer.commits == 3
    assert _commits(pg_api, "loop") == 3 and _commits(pg_api, "thread") == 0
    assert _post(pg_api, token, 1).json() == {"accepted": 0, "duplicate": True}


def test_a_connection_the_server_dropped_is_replaced_and_nothing_acknowledged_is_lost(
    pg_api: Api,
) -> None:
    token = pg_api.node_token("node-a")
    assert _post(pg_api, token, 0).status_code == 200

    def committer_backends() -> list[int]:
        with pg_api.engine.connect() as conn:
            return list(
                conn.execute(
                    # Another test's server on another xdist worker has a committer too: the
                    # view is cluster-wide, so only this test's database counts.
                    sa.text(
                        "SELECT pid FROM pg_stat_activity"
                        " WHERE application_name = :n AND datname = current_database()"
                    ),
                    {"n": APPLICATION_NAME},
                ).scalars()
            )

    (pid,) = committer_backends()  # one connection, held between commits
    with pg_api.engine.connect() as conn:  # what a PostgreSQL restart or failover does to it
        assert conn.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar()
    wait_for(lambda: pid not in committer_backends(), timeout=20, what="the backend to go")
    # The next group fails on the dead connection, is retried on a new one, and only then is
    # its request answered.
    assert _post(pg_api, token, 1).json() == {"accepted": 4, "duplicate": False}
    assert _cursors(pg_api) == [("node-a", 1)]
    (new_pid,) = committer_backends()
    assert new_pid != pid
    assert _post(pg_api, token, 2).json() == {"accepted": 4, "duplicate": False}
    assert _cursors(pg_api) == [("node-a", 2)]


def test_used_only_for_postgres_with_psycopg_and_not_when_turned_off(
    postgres_url: str, sqlite_url: str
) -> None:
    assert supports_loop_commits(postgres_url)
    assert not supports_loop_commits(sqlite_url)
    assert not supports_loop_commits("postgresql+psycopg2://u@h/db")
    assert isinstance(_chosen(Settings(dev=True, database_url=postgres_url)), LoopPostgresCommitter)
    assert not isinstance(
        _chosen(Settings(dev=True, database_url=sqlite_url)), LoopPostgresCommitter
    )
    off = Settings(
        dev=True,
        database_url=postgres_url,
        ingest={"postgres_commits_on_loop": False},  # type: ignore[arg-type]
    )
    assert isinstance(_chosen(off), ThreadCommitter)


def test_turned_off_commits_go_to_the_thread(
    postgres_url: str, make_api: Callable[..., Api]
) -> None:
    migrate.upgrade(postgres_url)
    api = make_api(postgres_url, ingest={"postgres_commits_on_loop": False})
    assert isinstance(api.app.state.ingest.committer, ThreadCommitter)
    token = api.node_token("node-a")
    assert _post(api, token, 0).json() == {"accepted": 4, "duplicate": False}
    assert _commits(api, "thread") == 1 and _commits(api, "loop") == 0


def test_a_url_it_cannot_serve_is_refused_without_showing_the_password() -> None:
    with pytest.raises(ValueError, match="postgresql\\+psycopg URL") as info:
        thread = ThreadCommitter(sa.create_engine("sqlite://"), LocalSeriesBackend())
        LoopPostgresCommitter("postgresql+psycopg2://rlguard:s3cret@db/rlguard", thread)
    assert "s3cret" not in str(info.value) and "***" in str(info.value)


@pytest.mark.parametrize("bad", ["sometimes", 2, None])
def test_bad_setting_is_refused_by_name(bad: object) -> None:
    with pytest.raises(ValidationError, match="postgres_commits_on_loop"):
        Settings(dev=True, ingest={"postgres_commits_on_loop": bad})  # type: ignore[arg-type]
