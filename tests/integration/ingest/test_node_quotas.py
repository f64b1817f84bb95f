"""Per-node quotas through the real app on SQLite and PostgreSQL: a batch over a limit gets the
4xx that names the limit and its setting, nothing of it is stored (samples, rows, seq), the
corrected resend under the same seq is applied, other nodes are unaffected, and the refusals
are counted per node in /metrics."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from sqlmodel import Session, select

from app.auth.users import create_user
from app.core.config import NodeQuotaSettings
from app.models import IngestCursor, Job, Participant, Role
from app.series.store import SeriesKey
from tests.harness import Api, auth, batch, wait_for
from tests.harness.dashboard import PASSWORD, login

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def quota_api(make_api: Callable[..., Api], url: str, **limits: float) -> Api:
    return make_api(url, node_quotas=NodeQuotaSettings(**limits))  # type: ignore[arg-type]


def gpu_batch(node: str, seq: int, gpus: range, **extra: object) -> dict:
    now = time.time()
    body = batch(node, seq, n=0, **extra)
    body["samples"] = [
        {"name": "gpu_util", "value": 0.5, "ts": now, "labels": {"gpu": str(g)}} for g in gpus
    ]
    return body


def part(job: str, rank: int = 0, role: str = "trainer") -> dict:
    return {"job": job, "role": role, "rank": rank, "phase": "TRAIN", "step": 1, "ts": time.time()}


def post(api: Api, token: str, body: dict):  # type: ignore[no-untyped-def]
    return api.client.post("/api/v1/ingest", json=body, headers=auth(token))


def series_of(api: Api, node: str) -> set[SeriesKey]:
    return set(api.app.state.series_store.keys(node=node))  # type: ignore[attr-defined]


def high_seq(api: Api, node: str) -> int | None:
    with Session(api.engine) as s:
        row = s.exec(select(IngestCursor).where(IngestCursor.node_name == node)).first()
        return None if row is None else row.high_seq


def refusals(api: Api, node: str, quota: str) -> float:
    text = api.client.get("/metrics").text
    want = f'rlguard_ingest_quota_refusals_total{{node="{node}",quota="{quota}"}} '
    line = next((ln for ln in text.splitlines() if ln.startswith(want)), None)
    return 0.0 if line is None else float(line.split()[-1])


def test_series_over_the_node_limit(make_api: Callable[..., Api], migrated_url: str) -> None:
    api = quota_api(make_api, migrated_url, max_series=4)
    a, b = api.node_token("node-a"), api.node_token("node-b")
    assert post(api, a, gpu_batch("node-a", 0, range(3))).status_code == 200
    r = post(api, a, gpu_batch("node-a", 1, range(8)))
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert "node_quotas.max_series" in detail and "RLGUARD_NODE_QUOTAS__MAX_SERIES" in detail
    assert len(series_of(api, "node-a")) == 3  # nothing of the refused batch in the window
    assert high_seq(api, "node-a") == 0  # nor its seq
    # The corrected batch under the same seq is applied, not answered "duplicate".
    r = post(api, a, gpu_batch("node-a", 1, range(4)))
    assert r.json() == {"accepted": 4, "duplicate": False}
    assert high_seq(api, "node-a") == 1
    # Another node has its own quota.
    assert post(api, b, gpu_batch("node-b", 0, range(4))).status_code == 200
    assert refusals(api, "node-a", "max_series") == 1
    assert refusals(api, "node-b", "max_series") == 0


def test_label_values_over_the_limit(make_api: Callable[..., Api], migrated_url: str) -> None:
    api = quota_api(make_api, migrated_url, max_label_values=8)
    a = api.node_token("node-a")
    assert post(api, a, gpu_batch("node-a", 0, range(8))).status_code == 200
    r = post(api, a, gpu_batch("node-a", 1, range(100, 101)))
    assert r.status_code == 422
    assert "gpu_util{gpu}" in r.json()["detail"]
    assert "RLGUARD_NODE_QUOTAS__MAX_LABEL_VALUES" in r.json()["detail"]
    assert len(series_of(api, "node-a")) == 8 and high_seq(api, "node-a") == 0
    assert refusals(api, "node-a", "max_label_values") == 1


def test_jobs_and_participants_over_the_limit(
    make_api: Callable[..., Api], migrated_url: str
) -> None:
    api = quota_api(make_api, migrated_url, max_jobs=2, max_participants=3)
    a, b = api.node_token("node-a"), api.node_token("node-b")
    ok = gpu_batch("node-a", 0, range(1), participants=[part("j1"), part("j2")])
    assert post(api, a, ok).status_code == 200
    r = post(api, a, gpu_batch("node-a", 1, range(1, 2), participants=[part("j3")]))
    assert r.status_code == 422 and "RLGUARD_NODE_QUOTAS__MAX_JOBS" in r.json()["detail"]
    many = [part("j1", rank) for rank in range(1, 4)]
    r = post(api, a, gpu_batch("node-a", 1, range(1, 2), participants=many))
    assert r.status_code == 422 and "RLGUARD_NODE_QUOTAS__MAX_PARTICIPANTS" in r.json()["detail"]
    with Session(api.engine) as s:
        assert sorted(j.name for j in s.exec(select(Job)).all()) == ["j1", "j2"]
        assert len(s.exec(select(Participant)).all()) == 2
    ingest = api.app.state.ingest  # type: ignore[attr-defined]
    assert {p.job for p in ingest.participants()} == {"j1", "j2"}
    assert len(series_of(api, "node-a")) == 1 and high_seq(api, "node-a") == 0
    # node-b may run its own jobs, j3 included
    other = gpu_batch("node-b", 0, range(1), participants=[part("j3"), part("j4")])
    assert post(api, b, other).status_code == 200
    assert refusals(api, "node-a", "max_jobs") == 1
    assert refusals(api, "node-a", "max_participants") == 1


def test_new_series_rate_answers_429_and_the_retry_passes(
    make_api: Callable[..., Api], migrated_url: str
) -> None:
    api = quota_api(make_api, migrated_url, new_series_per_second=20, new_series_burst=10)
    a, b = api.node_token("node-a"), api.node_token("node-b")
    assert post(api, a, gpu_batch("node-a", 0, range(10))).status_code == 200
    r = post(api, a, gpu_batch("node-a", 1, range(10, 20)))
    assert r.status_code == 429, r.text
    assert r.headers["Retry-After"] == "1"
    assert "RLGUARD_NODE_QUOTAS__NEW_SERIES_PER_SECOND" in r.json()["detail"]
    assert len(series_of(api, "node-a")) == 10 and high_seq(api, "node-a") == 0
    assert post(api, b, gpu_batch("node-b", 0, range(10))).status_code == 200
    # A batch of known series costs nothing of the budget.
    assert post(api, a, gpu_batch("node-a", 1, range(10))).json()["duplicate"] is False
    # The same new series, resent as the agent does after Retry-After, pass once the budget
    # has refilled (each refused try changes nothing).
    wait_for(
        lambda: post(api, a, gpu_batch("node-a", 2, range(10, 20))).status_code == 200,
        timeout=10,
    )
    assert len(series_of(api, "node-a")) == 20
    # More new series than the bucket ever holds: 429 while the budget is short of them (the
    # validator stops counting there), 422 naming the burst once it is full.
    over = gpu_batch("node-a", 3, range(100, 111))
    r = wait_for(lambda: (r := post(api, a, over)).status_code == 422 and r, timeout=10)
    assert "RLGUARD_NODE_QUOTAS__NEW_SERIES_BURST" in r.json()["detail"]
    assert len(series_of(api, "node-a")) == 20 and high_seq(api, "node-a") == 2
    assert refusals(api, "node-a", "new_series_per_second") >= 1


def test_the_node_page_shows_use_limits_and_refusals(
    make_api: Callable[..., Api], migrated_url: str
) -> None:
    api = quota_api(make_api, migrated_url, max_series=4)
    a = api.node_token("node-a")
    assert post(api, a, gpu_batch("node-a", 0, range(3))).status_code == 200
    assert post(api, a, gpu_batch("node-a", 1, range(8))).status_code == 422
    with Session(api.engine) as s:
        create_user(s, name="vera", role=Role.viewer, password=PASSWORD, actor="test")
        s.commit()
    login(api.client, "vera")  # type: ignore[arg-type]
    page = api.client.get("/nodes/node-a").text
    partial = api.client.get("/ui/nodes/node-a/quotas").text
    for html in (page, partial):
        row = html.split('data-quota="RLGUARD_NODE_QUOTAS__MAX_SERIES"', 1)[1].split("</tr>")[0]
        cells = [c.split(">", 1)[1] for c in row.split("<td")[1:]]
        assert "3</td" in cells[1] and "4</td" in cells[2]  # used, limit
        assert '<span class="badge bad">1</span>' in cells[3]  # batches refused


def test_a_node_over_its_cpu_share_is_refused_before_its_body_is_read(
    make_api: Callable[..., Api], migrated_url: str
) -> None:
    api = quota_api(make_api, migrated_url, ingest_cpu_share=0.02, ingest_cpu_burst_seconds=0.01)
    a, b = api.node_token("node-a"), api.node_token("node-b")
    assert post(api, a, gpu_batch("node-a", 0, range(4))).status_code == 200
    quotas = api.app.state.ingest.quotas
    # What the batch took on the loop was charged to its node (the bucket as of that charge;
    # the usage shown refills it at 2% of a core, within milliseconds here).
    assert quotas._nodes["node-a"].cpu.tokens < 0.01  # noqa: SLF001
    # A batch that took 60 ms more than that: node-a owes >= 50 ms, >= 2.5 s at 2% of a core.
    quotas.charge_cpu("node-a", 0.06)
    # Not JSON at all: a 400 if it were read; the debt answers first.
    r = api.client.post("/api/v1/ingest", content=b"{not json", headers=auth(a))
    assert r.status_code == 429, r.text
    assert int(r.headers["Retry-After"]) >= 3
    # The unread body is not parsed to find the connection's next request: it is closed.
    assert r.headers["Connection"] == "close"
    detail = r.json()["detail"]
    assert "RLGUARD_NODE_QUOTAS__INGEST_CPU_SHARE" in detail and "body was not read" in detail
    r = post(api, a, gpu_batch("node-a", 1, range(4, 8)))
    assert r.status_code == 429, r.text
    assert len(series_of(api, "node-a")) == 4 and high_seq(api, "node-a") == 0
    # Another node has its own share.
    assert post(api, b, gpu_batch("node-b", 0, range(4))).status_code == 200
    assert refusals(api, "node-a", "ingest_cpu_share") == 2
    assert refusals(api, "node-b", "ingest_cpu_share") == 0
    # The agent's retry of the same batch passes once the debt is paid (each 429 costs nothing).
    wait_for(
        lambda: post(api, a, gpu_batch("node-a", 1, range(4, 8))).status_code == 200, timeout=20
    )
    assert len(series_of(api, "node-a")) == 8 and high_seq(api, "node-a") == 1
