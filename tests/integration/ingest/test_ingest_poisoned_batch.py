"""One batch must never stop ingest (issue 17 item 1), on real SQLite and PostgreSQL.

Before: a participant ``ts`` of -1e300 passed validation, its write raised OverflowError, the
group committer retried the whole group forever, every batch of every node got 503 and
``/readyz`` still said 200."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from app.ingest.dedupe import DedupeWindow
from app.ingest.pipeline import IngestResult
from app.ingest.validation import IngestRejected, ValidBatch
from recovery.protocol.samples import ParticipantReport
from tests.harness import Api, auth, batch, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def post(api: Api, token: str, body: dict):  # type: ignore[no-untyped-def]
    return api.client.post("/api/v1/ingest", json=body, headers=auth(token))


def assert_accepted_within_1s(api: Api, token: str, node: str, seq: int) -> None:
    started = time.monotonic()
    r = post(api, token, batch(node, seq, n=2))
    elapsed = time.monotonic() - started
    assert r.status_code == 200 and r.json() == {"accepted": 2, "duplicate": False}, r.text
    assert elapsed < 1.0, f"a normal batch took {elapsed:.2f} s"


def metric(api: Api, line_start: str) -> float:
    for line in api.client.get("/metrics").text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_participant_ts_minus_1e300_is_refused_and_ingest_goes_on(
    make_ingest_api: Callable[..., Api],
) -> None:
    api = make_ingest_api()
    bad, good = api.node_token("n-bad"), api.node_token("n-good")
    part = {"job": "j1", "role": "trainer", "rank": 0, "phase": "TRAIN", "step": 1, "ts": -1e300}
    for seq in range(2):  # the exact batch from the probe, and its retry
        r = post(api, bad, batch("n-bad", seq, participants=[part]))
        assert r.status_code == 422, r.text
        assert "participants.0.ts" in r.json()["detail"]
        assert_accepted_within_1s(api, good, "n-good", seq)
    assert api.client.get("/readyz").status_code == 200
    assert metric(api, "rlguard_ingest_commit_failures_total") == 0


def _valid(node: str, seq: int, *, ts: float, step: int = 1) -> ValidBatch:
    """A batch as validation would hand it on; the poisoned ones could never pass it today."""
    part = ParticipantReport(f"job-{node}", "trainer", 0, "TRAIN", step, ts)
    return ValidBatch("agent-1", node, seq, time.time(), [], [part], {"torch": "2.13.0"})


def _apply_together(api: Api, batches: list[ValidBatch]) -> list[object]:
    """Apply ``batches`` on the app's loop in one go: all are queued before the committer runs,
    so they share one group commit."""
    service = api.app.state.ingest  # type: ignore[attr-defined]

    async def apply_all() -> list[object]:
        return await asyncio.gather(*(service.apply(b) for b in batches), return_exceptions=True)

    return api.client._portal.call(apply_all)  # noqa: SLF001 - the app's own event loop


def _cursor(api: Api, node: str) -> DedupeWindow | None:
    with api.engine.connect() as conn:
        row = conn.execute(
            sa.text("SELECT high_seq, window_mask FROM ingest_cursor WHERE node_name = :n"),
            {"n": node},
        ).first()
    return None if row is None else DedupeWindow(row[0], row[1])


def test_a_group_with_poisoned_batches_commits_the_others(
    make_ingest_api: Callable[..., Api], database_url: str
) -> None:
    api = make_ingest_api()
    nodes = [f"n{i}" for i in range(8)]
    tokens = {n: api.node_token(n) for n in nodes}
    now = time.time()
    batches = [_valid(n, 0, ts=now) for n in nodes]
    # OverflowError in Python on both backends; PostgreSQL also refuses a step over its INTEGER
    # (SQLite's INTEGER holds it, so there it is a valid batch).
    poisoned = {"n2": _valid("n2", 0, ts=-1e300)}
    if database_url.startswith("postgresql"):
        poisoned["n5"] = _valid("n5", 0, ts=now, step=2**40)
    batches = [poisoned.get(b.node, b) for b in batches]
    failures_before = metric(api, "rlguard_ingest_commit_failures_total")

    results = dict(zip(nodes, _apply_together(api, batches), strict=True))

    assert metric(api, "rlguard_ingest_commit_failures_total") == failures_before + 1  # one group
    for node, result in results.items():
        if node in poisoned:
            assert isinstance(result, IngestRejected), result
            assert result.status_code == 422
            assert str(result).startswith("participants: the database cannot store this batch")
            assert _cursor(api, node) is None
        else:
            assert result == IngestResult(accepted=0, duplicate=False), (node, result)
            window = _cursor(api, node)
            assert window is not None and window.seen(0)
    with api.engine.connect() as conn:
        jobs = {r[0] for r in conn.execute(sa.text("SELECT job_name FROM participant"))}
    assert jobs == {f"job-{n}" for n in nodes if n not in poisoned}
    rejected = metric(api, 'rlguard_ingest_batches_rejected_total{reason="participants"}')
    assert rejected == len(poisoned)
    service = api.app.state.ingest  # type: ignore[attr-defined]
    assert service.commits_failing_for() is None
    assert api.client.get("/readyz").status_code == 200

    # The refused seq was released: its retry is refused again (never "duplicate"), the agent's
    # next batch is applied, and the database never records the refused seq as applied.
    # (Alone: in a group with a newer report of the same participant, the -1e300 report is
    # superseded before it is written, and that group commits.)
    assert isinstance(_apply_together(api, [poisoned["n2"]])[0], IngestRejected)
    assert _apply_together(api, [_valid("n2", 1, ts=now)]) == [IngestResult(0, False)]
    window = _cursor(api, "n2")
    assert window is not None and window.seen(1) and not window.seen(0)
    assert_accepted_within_1s(api, tokens["n0"], "n0", 1)


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_readyz_is_503_while_commits_fail_and_200_once_they_succeed(
    make_ingest_api: Callable[..., Api], database_url: str
) -> None:
    """A real fault in the ingest writes only (a trigger raising a connection-class error, as a
    failing server does), so the readiness ping itself still passes."""
    api = make_ingest_api(ingest={"commit_timeout_seconds": 1})
    token = api.node_token("n1")
    assert post(api, token, batch("n1", 0)).status_code == 200
    assert api.client.get("/readyz").status_code == 200
    engine = sa.create_engine(database_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "CREATE FUNCTION rlg_fault() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                    "RAISE EXCEPTION 'injected fault' USING ERRCODE = '08006'; END $$"
                )
            )
            conn.execute(
                sa.text(
                    "CREATE TRIGGER rlg_fault BEFORE INSERT OR UPDATE ON ingest_cursor "
                    "FOR EACH ROW EXECUTE FUNCTION rlg_fault()"
                )
            )
        r = post(api, token, batch("n1", 1))
        assert r.status_code == 503 and "retry the same seq" in r.json()["detail"]
        ready = api.client.get("/readyz")
        assert ready.status_code == 503, ready.text
        assert "group commits failing" in ready.json()["ingest"]
        with engine.begin() as conn:
            conn.execute(sa.text("DROP TRIGGER rlg_fault ON ingest_cursor"))
        wait_for(lambda: api.client.get("/readyz").status_code == 200, 15, "readyz back to 200")
    finally:
        engine.dispose()
    # Nothing acknowledged or queued was lost: the retry is answered once it is durable.
    assert post(api, token, batch("n1", 1)).json() == {"accepted": 0, "duplicate": True}
    assert metric(api, "rlguard_ingest_batches_rejected_total") == 0
