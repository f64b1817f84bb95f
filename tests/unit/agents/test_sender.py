"""Sender outcomes against a scripted HTTP transport (httpx.MockTransport at the HTTP boundary)."""

from __future__ import annotations

import gzip
import logging
import random
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson
import pytest

from agents.sender import Outcome, Sender, backoff_delay
from agents.spool import Spool


def batch(n: int = 3, name: str = "gpu_power_watts") -> dict:
    return {
        "agent_id": "a1",
        "node": "n1",
        "samples": [
            {"name": name, "value": 1.0, "ts": 5.0, "labels": {"gpu": str(i)}} for i in range(n)
        ],
        "participants": [],
        "fingerprint": None,
    }


class Server:
    """Answers from a script of (status, json) pairs; records what it received."""

    def __init__(
        self, script: list[tuple[int, object]] | Callable[[httpx.Request], httpx.Response]
    ) -> None:
        self.script = script
        self.received: list[dict] = []
        self.encodings: list[str | None] = []
        self.auth: list[str | None] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        raw = request.content
        enc = request.headers.get("content-encoding")
        self.encodings.append(enc)
        self.auth.append(request.headers.get("authorization"))
        if callable(self.script):
            return self.script(request)
        status, payload = self.script.pop(0)
        if status == 0:
            raise httpx.ConnectError("connection refused", request=request)
        if status < 300:
            self.received.append(orjson.loads(gzip.decompress(raw) if enc == "gzip" else raw))
        return httpx.Response(status, json=payload)


def make(tmp_path: Path, server: Server, **kw: object) -> tuple[Spool, Sender]:
    spool = Spool(tmp_path, node="n1", max_bytes=10**9)
    sender = Sender(
        spool,
        url="http://rlguard.test/",
        token="tok-secret",
        transport=httpx.MockTransport(server),
        clock=lambda: 1234.5,
        **kw,  # type: ignore[arg-type]
    )
    return spool, sender


def test_ack_removes_batch_and_stamps_sent_at(tmp_path: Path) -> None:
    server = Server([(200, {"accepted": 3, "duplicate": False})])
    spool, sender = make(tmp_path, server)
    seq = spool.append(batch())
    assert sender.deliver_one(wait=0) is Outcome.ACKED
    assert server.received[0]["seq"] == seq
    assert server.received[0]["sent_at"] == 1234.5
    assert set(server.received[0]) == {
        "agent_id",
        "node",
        "seq",
        "sent_at",
        "samples",
        "participants",
        "fingerprint",
    }
    assert server.auth == ["Bearer tok-secret"]
    assert spool.stats().batches == 0 and spool.stats().acked_samples == 3
    assert sender.stats.last_send_ok == 1234.5


@pytest.mark.parametrize("status", [0, 429, 500, 502, 503])
def test_transient_failures_keep_the_batch_and_order(tmp_path: Path, status: int) -> None:
    server = Server(
        [
            (status, {"detail": "busy"}),
            (200, {"accepted": 3, "duplicate": False}),
            (200, {"accepted": 3, "duplicate": False}),
        ]
    )
    spool, sender = make(tmp_path, server)
    first = spool.append(batch())
    second = spool.append(batch())
    assert sender.deliver_one(wait=0) is Outcome.RETRY
    assert spool.stats().batches == 2
    assert sender.stats.send_failures == 1
    assert sender.deliver_one(wait=0) is Outcome.ACKED
    assert sender.deliver_one(wait=0) is Outcome.ACKED
    assert [b["seq"] for b in server.received] == [first, second]
    assert spool.stats().dropped == {"spool_full": 0, "rejected": 0}


def test_duplicate_answer_counts_as_delivered(tmp_path: Path) -> None:
    server = Server([(200, {"accepted": 0, "duplicate": True})])
    spool, sender = make(tmp_path, server)
    spool.append(batch())
    assert sender.deliver_one(wait=0) is Outcome.ACKED
    assert sender.stats.duplicates == 1 and spool.stats().batches == 0


@pytest.mark.parametrize("status", [400, 401, 403, 413, 422])
def test_other_4xx_drops_the_batch_with_the_servers_reason(
    tmp_path: Path, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    server = Server(
        [
            (status, {"detail": "samples[0].value: must be finite, got nan"}),
            (200, {"accepted": 2, "duplicate": False}),
        ]
    )
    spool, sender = make(tmp_path, server)
    spool.append(batch(4))
    spool.append(batch(2))
    with caplog.at_level(logging.ERROR, logger="rlguard.agent.sender"):
        assert sender.deliver_one(wait=0) is Outcome.REJECTED
    assert any(
        "must be finite" in r.getMessage() and f"HTTP {status}" in r.getMessage()
        for r in caplog.records
    )
    assert all("tok-secret" not in r.getMessage() for r in caplog.records)
    st = spool.stats()
    assert st.dropped["rejected"] == 4 and st.batches == 1
    assert sender.deliver_one(wait=0) is Outcome.ACKED


def test_unreadable_2xx_answer_is_retried(tmp_path: Path) -> None:
    server = Server(lambda r: httpx.Response(200, content=b"<html>proxy</html>"))
    spool, sender = make(tmp_path, server)
    spool.append(batch())
    assert sender.deliver_one(wait=0) is Outcome.RETRY
    assert spool.stats().batches == 1


def test_large_bodies_are_gzipped(tmp_path: Path) -> None:
    server = Server([(200, {"accepted": 1, "duplicate": False})] * 2)
    spool, sender = make(tmp_path, server, gzip_min_bytes=2000)
    spool.append(batch(1))
    spool.append(batch(200))
    sender.deliver_one(wait=0)
    sender.deliver_one(wait=0)
    assert server.encodings == [None, "gzip"]
    assert len(server.received[1]["samples"]) == 200


def test_server_refusing_gzip_gets_plain_bodies_from_then_on(tmp_path: Path) -> None:
    def no_gzip(request: httpx.Request) -> httpx.Response:
        if request.headers.get("content-encoding") == "gzip":
            return httpx.Response(400, json={"detail": "body is not valid JSON"})
        return httpx.Response(200, json={"accepted": 1, "duplicate": False})

    server = Server(no_gzip)
    spool, sender = make(tmp_path, server, gzip_min_bytes=100)
    spool.append(batch(20))
    spool.append(batch(20))
    assert sender.deliver_one(wait=0) is Outcome.ACKED
    assert sender.deliver_one(wait=0) is Outcome.ACKED
    assert server.encodings == ["gzip", None, None]
    assert spool.stats().dropped["rejected"] == 0


def test_backoff_grows_exponentially_with_jitter_and_is_capped() -> None:
    rng = random.Random(1)
    for attempt in range(1, 12):
        ceiling = min(15.0, 0.5 * 2 ** (attempt - 1))
        delays = [backoff_delay(attempt, 0.5, 15.0, rng) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 1  # jittered


def test_thread_delivers_and_backs_off(tmp_path: Path) -> None:
    import time

    calls: list[float] = []

    def flaky(request: httpx.Request) -> httpx.Response:
        calls.append(time.monotonic())
        if len(calls) <= 3:
            return httpx.Response(503, json={"detail": "not durable yet"})
        return httpx.Response(200, json={"accepted": 3, "duplicate": False})

    spool, sender = make(tmp_path, Server(flaky), backoff_base=0.05, backoff_max=1.0)
    spool.append(batch())
    sender.start()
    deadline = time.monotonic() + 10
    while spool.stats().batches and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sender.stop(timeout=3)
    assert spool.stats().batches == 0
    gaps = [b - a for a, b in zip(calls, calls[1:], strict=False)]
    assert gaps[0] >= 0.025 and gaps[2] >= 0.1  # waited, and longer each time
