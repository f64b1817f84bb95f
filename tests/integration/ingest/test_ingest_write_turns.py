"""An ingest commit that finds SQLite's write lock taken by the policy tick waits for the
tick's current transaction and goes before its next one (app.core.write_turns); PostgreSQL has
no single write lock and no turns."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from tests.harness import Api, auth, batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_an_ingest_commit_finding_the_tick_writing_waits_for_its_turn(
    make_ingest_api: Callable[..., Api], database_url: str
) -> None:
    api = make_ingest_api()
    turns = api.app.state.ingest.write_turns  # type: ignore[attr-defined]
    if not database_url.startswith("sqlite"):
        assert turns is None
        return
    token = api.node_token("n1")
    assert (
        api.client.post("/api/v1/ingest", json=batch("n1", 0), headers=auth(token)).status_code
        == 200
    )
    answers: list[int] = []

    def post() -> None:
        r = api.client.post("/api/v1/ingest", json=batch("n1", 1), headers=auth(token))
        answers.append(r.status_code)

    writer = threading.Thread(target=post)
    with turns.background_write(), api.engine.connect() as tick:
        tick.exec_driver_sql("BEGIN IMMEDIATE")  # the tick's transaction holds the write lock
        writer.start()
        deadline = time.monotonic() + 10
        while turns.ingest_waiting == 0:  # the inline commit failed at once; the thread path
            assert time.monotonic() < deadline, "the ingest commit never asked for its turn"
            time.sleep(0.01)
        assert answers == []
        tick.exec_driver_sql("COMMIT")
    writer.join(10)  # answered once the tick's transaction ended
    assert answers == [200]
    assert turns.ingest_waiting == 0
    with api.engine.connect() as c:
        high = c.execute(
            sa.text("SELECT high_seq FROM ingest_cursor WHERE node_name = 'n1'")
        ).scalar_one()
    assert high == 1
