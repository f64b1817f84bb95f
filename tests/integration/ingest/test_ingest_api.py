"""POST /api/v1/ingest against a real app on SQLite and PostgreSQL: contract, bad input, scoping."""

from __future__ import annotations

import json
import math
import time

import orjson
import pytest
import sqlalchemy as sa
from sqlmodel import Session, select

from app.models import IngestCursor, Job, Node, Participant
from app.series.store import SeriesKey
from tests.harness import Api, auth, batch, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def post(api: Api, token: str | None, body: object, raw: bytes | None = None, **headers: str):
    h = dict(headers)
    if token is not None:
        h.update(auth(token))
    content = raw if raw is not None else json.dumps(body).encode()
    return api.client.post("/api/v1/ingest", content=content, headers=h)


def db_state(api: Api) -> dict[str, object]:
    with Session(api.engine) as s:
        return {
            "cursors": [
                (c.node_name, c.agent_id, c.high_seq, c.window_mask)
                for c in s.exec(select(IngestCursor)).all()
            ],
            "participants": [
                (p.job_name, p.role, p.rank, p.phase, p.step)
                for p in s.exec(select(Participant)).all()
            ],
            "jobs": [j.name for j in s.exec(select(Job)).all()],
            "nodes": [
                (n.name, n.last_seen_at, n.fingerprint_hash) for n in s.exec(select(Node)).all()
            ],
        }


def store_state(api: Api) -> list[tuple[SeriesKey, list]]:
    store = api.app.state.series_store  # type: ignore[attr-defined]
    return [(k, store.since(k, 0)) for k in sorted(store.keys(), key=repr)]


def test_accepts_batch_and_persists_effects(api: Api) -> None:
    token = api.node_token("node-a")
    now = time.time()
    body = batch(
        "node-a",
        0,
        n=4,
        participants=[
            {"job": "grpo-1", "role": "trainer", "rank": 0, "phase": "TRAIN", "step": 7, "ts": now},
            {
                "job": "grpo-1",
                "role": "rollout",
                "rank": 3,
                "phase": "ROLLOUT",
                "step": 7,
                "ts": now,
            },
        ],
        fingerprint={"torch": "2.13.0", "driver": "550.1"},
    )
    r = post(api, token, body)
    assert r.status_code == 200, r.text
    assert r.json() == {"accepted": 4, "duplicate": False}
    store = api.app.state.series_store  # type: ignore[attr-defined]
    key = SeriesKey.of("node-a", "gpu_util", {"gpu": "1"})
    assert [p.value for p in store.since(key, 0)] == [1.0, 3.0]
    state = db_state(api)
    assert state["cursors"] == [("node-a", "agent-1", 0, 1)]
    assert sorted(state["participants"]) == [
        ("grpo-1", "rollout", 3, "ROLLOUT", 7),
        ("grpo-1", "trainer", 0, "TRAIN", 7),
    ]
    assert state["jobs"] == ["grpo-1"]
    ((name, seen, fp_hash),) = state["nodes"]
    assert name == "node-a" and seen is not None and fp_hash is not None
    # the in-process view the policy engine reads
    parts = api.app.state.ingest.participants()  # type: ignore[attr-defined]
    assert {(p.job, p.role, p.rank, p.node) for p in parts} == {
        ("grpo-1", "trainer", 0, "node-a"),
        ("grpo-1", "rollout", 3, "node-a"),
    }


def test_duplicate_seq_is_acknowledged_but_not_applied_twice(api: Api) -> None:
    token = api.node_token("node-a")
    body = batch("node-a", 5, n=3)
    assert post(api, token, body).json() == {"accepted": 3, "duplicate": False}
    before = store_state(api)
    again = post(api, token, body)
    assert again.status_code == 200
    assert again.json() == {"accepted": 0, "duplicate": True}
    assert store_state(api) == before
    # an older seq inside the window is still new; a repeat of it is a duplicate
    assert post(api, token, batch("node-a", 3, n=1)).json()["duplicate"] is False
    assert post(api, token, batch("node-a", 3, n=1)).json()["duplicate"] is True
    # other agents and other nodes have their own sequence spaces
    assert post(api, token, batch("node-a", 5, agent="agent-2")).json()["duplicate"] is False
    other = api.node_token("node-b")
    assert post(api, other, batch("node-b", 5)).json()["duplicate"] is False
    m = api.client.get("/metrics").text
    assert 'rlguard_ingest_batches_total{result="duplicate"} 2.0' in m


def _bad_cases(now: float) -> list[tuple[str, object, int, str]]:
    good = batch("node-a", 1)
    s0 = good["samples"][0]

    def with_sample(**kw: object) -> dict:
        b = batch("node-a", 1)
        b["samples"][0] = {**s0, **kw}
        return b

    def without(field: str) -> dict:
        b = batch("node-a", 1)
        b.pop(field)
        return b

    cases: list[tuple[str, object, int, str]] = [
        ("wrong type seq", {**good, "seq": "1"}, 422, "seq"),
        ("negative seq", {**good, "seq": -1}, 422, "seq"),
        ("bool seq", {**good, "seq": True}, 422, "seq"),
        ("missing node", without("node"), 422, "node"),
        ("missing samples", without("samples"), 422, "samples"),
        ("samples not a list", {**good, "samples": {"a": 1}}, 422, "samples"),
        ("unknown top-level field", {**good, "extra": 1}, 422, "extra"),
        ("value is a string", with_sample(value="1.5"), 422, "samples[0].value"),
        ("value is bool", with_sample(value=True), 422, "samples[0].value"),
        ("value is null", with_sample(value=None), 422, "samples[0].value"),
        ("ts is a string", with_sample(ts="now"), 422, "samples[0].ts"),
        ("ts negative", with_sample(ts=-5.0), 422, "samples[0].ts"),
        ("ts far in the future", with_sample(ts=now + 86400), 422, "samples[0].ts"),
        ("bad metric name", with_sample(name="gpu-util"), 422, "samples[0].name"),
        ("metric name starts with digit", with_sample(name="0abc"), 422, "samples[0].name"),
        ("metric name not a string", with_sample(name=5), 422, "samples[0].name"),
        ("too long name", with_sample(name="a" * 201), 422, "samples[0].name"),
        ("label value not a string", with_sample(labels={"gpu": 0}), 422, "labels.gpu"),
        ("bad label name", with_sample(labels={"gpu-id": "0"}), 422, "label name"),
        (
            "too many labels",
            with_sample(labels={f"l{i}": "x" for i in range(17)}),
            422,
            "17 labels",
        ),
        ("label value too long", with_sample(labels={"gpu": "x" * 129}), 422, "labels.gpu"),
        ("labels not an object", with_sample(labels=["gpu", "0"]), 422, "samples[0].labels"),
        ("unknown sample field", with_sample(unit="%"), 422, "unit"),
        ("sample not an object", {**good, "samples": [1]}, 422, "samples[0]"),
        ("too many samples", {**good, "samples": [s0] * 5001}, 422, "samples"),
        (
            "participant bad rank",
            {
                **good,
                "participants": [
                    {
                        "job": "j",
                        "role": "trainer",
                        "rank": -1,
                        "phase": "TRAIN",
                        "step": 0,
                        "ts": now,
                    }
                ],
            },
            422,
            "participants.0.rank",
        ),
        (
            "participant bad phase",
            {
                **good,
                "participants": [
                    {
                        "job": "j",
                        "role": "trainer",
                        "rank": 0,
                        "phase": "TR AIN",
                        "step": 0,
                        "ts": now,
                    }
                ],
            },
            422,
            "phase",
        ),
        (
            "participant from the future",
            {
                **good,
                "participants": [
                    {
                        "job": "j",
                        "role": "trainer",
                        "rank": 0,
                        "phase": "TRAIN",
                        "step": 0,
                        "ts": now + 86400,
                    }
                ],
            },
            422,
            "participants[0].ts",
        ),
        (
            "fingerprint value not a string",
            {**good, "fingerprint": {"torch": 2}},
            422,
            "fingerprint",
        ),
        ("body is a list", [good], 422, "JSON object"),
    ]
    # a valid first sample followed by a bad one: the good one must not be applied either
    mixed = batch("node-a", 1, n=3)
    mixed["samples"][2]["value"] = "bad"
    cases.append(("bad sample after good ones", mixed, 422, "samples[2].value"))
    return cases


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_every_bad_input_is_refused_whole_and_changes_nothing(api: Api) -> None:
    token = api.node_token("node-a")
    assert post(api, token, batch("node-a", 0)).status_code == 200
    before_db, before_store = db_state(api), store_state(api)
    now = time.time()
    for label, body, status, needle in _bad_cases(now):
        r = post(api, token, body)
        assert r.status_code == status, (label, r.status_code, r.text)
        assert needle in r.json()["detail"], (label, r.json())
    raw_cases = [
        ("malformed JSON", b'{"agent_id": "a",', 400, "not valid JSON"),
        (
            "NaN literal",
            orjson.dumps(batch("node-a", 1)).replace(b'"value":0.0', b'"value":NaN'),
            400,
            "NaN",
        ),
        (
            "Infinity literal",
            orjson.dumps(batch("node-a", 1)).replace(b'"value":0.0', b'"value":Infinity'),
            400,
            "finite",
        ),
        (
            "overflowing float",
            orjson.dumps(batch("node-a", 1)).replace(b'"value":0.0', b'"value":1e999'),
            400,
            "finite",
        ),
        (
            "overflowing int",
            orjson.dumps(batch("node-a", 1)).replace(b'"value":0.0', b'"value":1' + b"0" * 400),
            400,
            "finite",
        ),
        ("empty body", b"", 400, "not valid JSON"),
    ]
    for label, raw, status, needle in raw_cases:
        assert (
            b"NaN" in raw
            or b"Infinity" in raw
            or b"1e999" in raw
            or b"0" * 400 in raw
            or label in ("malformed JSON", "empty body")
        ), label
        r = post(api, token, None, raw=raw)
        assert r.status_code == status, (label, r.text)
        assert needle in r.json()["detail"], (label, r.json())
    assert db_state(api) == before_db
    assert store_state(api) == before_store
    # seq 1 was never applied by any of the refused batches: it is still new
    ok = post(api, token, batch("node-a", 1))
    assert ok.json() == {"accepted": 3, "duplicate": False}
    assert math.isfinite(float(ok.json()["accepted"]))
    m = api.client.get("/metrics").text
    assert 'rlguard_ingest_rejections_total{reason="bad_json"} 6.0' in m


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_oversized_body_is_413(migrated_url: str, make_api) -> None:  # type: ignore[no-untyped-def]
    api = make_api(migrated_url, ingest={"max_body_bytes": 2000})
    token = api.node_token("node-a")
    big = batch("node-a", 0, n=50)
    r = post(api, token, big)
    assert r.status_code == 413 and r.headers["connection"] == "close"  # the body unread
    assert "limit of 2000" in r.json()["detail"]

    # no Content-Length (chunked): refused while streaming
    async def chunks():  # type: ignore[no-untyped-def]
        data = orjson.dumps(big)
        for i in range(0, len(data), 500):
            yield data[i : i + 500]

    r = api.client.post("/api/v1/ingest", content=chunks(), headers=auth(token))
    assert r.status_code == 413 and r.headers["connection"] == "close"
    assert store_state(api) == []
    assert post(api, token, batch("node-a", 0, n=2)).status_code == 200


def test_token_scoping(api: Api) -> None:
    token_a = api.node_token("node-a")
    api.node_token("node-b")
    user = api.user_token("olga", "admin")  # type: ignore[arg-type]
    body_b = batch("node-b", 0)
    r = post(api, None, body_b)
    assert r.status_code == 401 and "Authorization" in r.json()["detail"]
    assert r.headers["www-authenticate"] == "Bearer"
    r = post(api, "rlgn_not-a-real-token", body_b)
    assert r.status_code == 401
    r = post(api, token_a, body_b)
    assert r.status_code == 403
    assert "'node-b'" in r.json()["detail"] and "'node-a'" in r.json()["detail"]
    r = post(api, user, body_b)
    assert r.status_code == 403 and "user token" in r.json()["detail"]
    r = api.client.post(
        "/api/v1/ingest", content=orjson.dumps(body_b), headers={"Authorization": "Basic abc"}
    )
    assert r.status_code == 401
    assert store_state(api) == []
    assert db_state(api)["cursors"] == []


def test_revoked_token_stops_ingest(api: Api) -> None:
    admin = api.user_token("root", "admin")  # type: ignore[arg-type]
    created = api.client.post("/api/v1/tokens", json={"node": "node-r"}, headers=auth(admin))
    assert created.status_code == 201
    token, token_id = created.json()["token"], created.json()["info"]["id"]
    assert post(api, token, batch("node-r", 0)).status_code == 200
    assert api.client.delete(f"/api/v1/tokens/{token_id}", headers=auth(admin)).status_code == 200
    r = post(api, token, batch("node-r", 1))
    assert r.status_code == 401


def test_revocation_from_another_process_applies_within_cache_ttl(
    migrated_url: str, make_api
) -> None:  # type: ignore[no-untyped-def]
    api = make_api(migrated_url, ingest={"token_cache_seconds": 0.3})
    token = api.node_token("node-a")
    assert post(api, token, batch("node-a", 0)).status_code == 200
    with api.engine.begin() as conn:  # what `rlguard token revoke` does, outside this process
        conn.execute(sa.text("UPDATE api_token SET revoked_at = CURRENT_TIMESTAMP"))
    time.sleep(0.4)  # the scenario: the token cache's 0.3 s entry expires
    assert post(api, token, batch("node-a", 1)).status_code == 401


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_commit_failure_answers_503_and_the_retry_is_acked_once_durable(
    migrated_url: str, make_api
) -> None:  # type: ignore[no-untyped-def]
    """Database refusing writes: the batch is in memory but not durable, so no ack (503); once
    the database is back, the retry is answered "duplicate" and the samples exist once."""
    import sqlite3

    api = make_api(migrated_url, ingest={"commit_timeout_seconds": 0.5})
    token = api.node_token("node-a")
    path = migrated_url.removeprefix("sqlite:///")
    blocker = sqlite3.connect(path, timeout=5, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # holds the write lock: every commit waits, then fails
    try:
        r = post(api, token, batch("node-a", 9, n=2))
        assert r.status_code == 503
        assert "retry the same seq" in r.json()["detail"]
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    r = wait_for(
        lambda: (got := post(api, token, batch("node-a", 9, n=2))).status_code == 200 and got,
        30,
        "the retried batch to be acknowledged",
        interval=0.2,
    )
    assert r.json() == {"accepted": 0, "duplicate": True}
    assert db_state(api)["cursors"] == [("node-a", "agent-1", 9, 1)]
    assert [len(pts) for _k, pts in store_state(api)] == [1, 1]
    m = api.client.get("/metrics").text
    assert 'rlguard_ingest_rejections_total{reason="not_durable"}' in m
    assert "rlguard_ingest_commit_failures_total" in m


def test_concurrent_batches_share_group_commits(api: Api) -> None:
    import concurrent.futures

    tokens = {f"node-{i}": api.node_token(f"node-{i}") for i in range(6)}

    def send(node: str, seq: int) -> int:
        return post(api, tokens[node], batch(node, seq, n=5)).json()["accepted"]

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futs = [pool.submit(send, node, seq) for seq in range(5) for node in tokens]
        assert sum(f.result() for f in futs) == 6 * 5 * 5
    state = db_state(api)
    assert sorted((c[0], c[2], c[3]) for c in state["cursors"]) == [
        (node, 4, 0b11111) for node in sorted(tokens)
    ]
    metrics = api.app.state.metrics  # type: ignore[attr-defined]
    samples = {
        s.name: s.value for m in metrics.ingest_commit_group_size.collect() for s in m.samples
    }
    assert samples["rlguard_ingest_commit_group_batches_sum"] == 30  # each batch committed once


def test_largest_valid_values_fit_the_columns(api: Api) -> None:
    """Every bound of the validator fits its column on this backend: a value the database
    refused after validation would fail the whole group commit for everyone."""
    node = "n" * 128
    token = api.node_token(node)
    now = time.time()
    body = batch(
        node,
        2**62,
        agent="a" * 128,
        n=1,
        participants=[
            {
                "job": "j" * 128,
                "role": "r" * 64,
                "rank": 1_000_000,
                "phase": "P" * 64,
                "step": 2**31 - 1,
                "ts": now,
            }
        ],
        fingerprint={"k" * 128: "v" * 512},
    )
    body["samples"][0].update(name="m" * 200, labels={"l" * 64: "x" * 128})
    r = post(api, token, body)
    assert r.status_code == 200, r.text
    with Session(api.engine) as s:
        (part,) = s.exec(select(Participant)).all()
        assert (part.role, part.step, part.rank) == ("r" * 64, 2**31 - 1, 1_000_000)
        (cursor,) = s.exec(select(IngestCursor)).all()
        assert cursor.high_seq == 2**62
    for too_big, needle in [({"role": "r" * 65}, "role"), ({"step": 2**31}, "step")]:
        p = {**body["participants"][0], **too_big}
        r = post(api, token, {**body, "seq": 1, "participants": [p]})
        assert r.status_code == 422 and needle in r.json()["detail"]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_gzip_bodies(migrated_url: str, make_api) -> None:  # type: ignore[no-untyped-def]
    import gzip

    api = make_api(migrated_url, ingest={"max_body_bytes": 20_000})
    token = api.node_token("node-a")
    h = {**auth(token), "Content-Encoding": "gzip"}
    ok = api.client.post(
        "/api/v1/ingest", content=gzip.compress(orjson.dumps(batch("node-a", 0, n=3))), headers=h
    )
    assert ok.json() == {"accepted": 3, "duplicate": False}
    bomb = gzip.compress(b'{"samples": [' + b" " * 5_000_000 + b"]}")  # small on the wire
    assert len(bomb) < 20_000
    r = api.client.post("/api/v1/ingest", content=bomb, headers=h)
    assert r.status_code == 413 and "decompressed" in r.json()["detail"]
    r = api.client.post("/api/v1/ingest", content=b"not gzip", headers=h)
    assert r.status_code == 400 and "gzip" in r.json()["detail"]
    r = api.client.post("/api/v1/ingest", content=gzip.compress(b"{}")[:-6], headers=h)
    assert r.status_code == 400
    r = api.client.post(
        "/api/v1/ingest", content=b"{}", headers={**auth(token), "Content-Encoding": "br"}
    )
    assert r.status_code == 415 and "'br'" in r.json()["detail"]
    assert db_state(api)["cursors"] == [("node-a", "agent-1", 0, 1)]


def test_dedupe_state_survives_restart_but_long_silent_agents_are_forgotten(
    migrated_url: str, make_api
) -> None:  # type: ignore[no-untyped-def]
    api = make_api(migrated_url)
    token = api.node_token("node-a")
    assert post(api, token, batch("node-a", 3, agent="fresh")).status_code == 200
    assert post(api, token, batch("node-a", 3, agent="stale")).status_code == 200
    from datetime import timedelta

    from app.models import utcnow

    with Session(api.engine) as s:
        stale = s.exec(select(IngestCursor).where(IngestCursor.agent_id == "stale")).one()
        stale.updated_at = utcnow() - timedelta(days=31)
        s.add(stale)
        s.commit()
    api.client.close()
    again = make_api(migrated_url)  # a restarted server on the same database
    assert post(again, token, batch("node-a", 3, agent="fresh")).json()["duplicate"] is True
    assert post(again, token, batch("node-a", 3, agent="stale")).json()["duplicate"] is False


def test_a_node_whose_clock_is_behind_has_its_stamps_moved_onto_the_server_clock(
    api: Api,
) -> None:
    """A node 30 s behind: its samples and heartbeats are stored on the server's clock (else
    they look 30 s stale to the detectors), and the offset is kept as a series of the node;
    the agent's accepted count is what it sent. A node on time is stored as sent."""
    store = api.app.state.series_store  # type: ignore[attr-defined]
    late, on_time = api.node_token("node-late"), api.node_token("node-ok")
    for seq in range(1, 4):  # corrected once three batches agree
        body = batch("node-late", seq, n=2)
        sent = body["sent_at"]
        for item in body["samples"]:
            item["ts"] -= 30.0
        body["sent_at"] -= 30.0
        body["participants"] = [
            {"job": "grpo-1", "role": "rollout", "rank": 0, "phase": "ROLLOUT", "step": 3,
             "ts": sent - 30.5}
        ]  # fmt: skip
        r = post(api, late, body)
        assert r.json() == {"accepted": 2, "duplicate": False}
    key = SeriesKey.of("node-late", "gpu_util", {"gpu": "0"})
    newest = store.since(key, 0)[-1]
    assert abs(newest.ts - (sent - 2)) < 1.0  # back on the server's clock (give or take the trip)
    offsets = store.since(SeriesKey.of("node-late", "agent_clock_offset_seconds", {}), 0)
    assert len(offsets) == 1 and 29.9 < offsets[0].value < 31.0
    [part] = [p for p in api.app.state.ingest.participants() if p.job == "grpo-1"]  # type: ignore[attr-defined]
    assert abs(part.ts - (sent - 0.5)) < 1.0

    for seq in range(1, 4):
        ok = batch("node-ok", seq, n=2)
        assert post(api, on_time, ok).json() == {"accepted": 2, "duplicate": False}
    kept = store.since(SeriesKey.of("node-ok", "gpu_util", {"gpu": "0"}), 0)[-1]
    assert kept.ts == ok["samples"][0]["ts"]  # exactly as sent
    assert store.since(SeriesKey.of("node-ok", "agent_clock_offset_seconds", {}), 0) == []
