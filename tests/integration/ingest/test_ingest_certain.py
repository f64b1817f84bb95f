"""Ingest's certain-fault notification (``app.ingest.certain``): a batch that carries a fault
needing no window (a launcher-seen exit, a Ray actor DEAD, a GPU fallen off the bus) is told to
the registered listener once, after the commit that makes it durable; repeats of the same fact,
healthy batches and replays are not. A real app on SQLite and PostgreSQL, batches posted through
``POST /api/v1/ingest``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlmodel import Session, select

from app.ingest.certain import CertainFaultWatch
from app.models import Participant
from recovery.protocol import metric_names as m
from tests.harness import Api, auth

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

NODE = "n0"
T0 = time.time() - 60  # stamps: a minute ago, plus one second per batch


class Listener:
    """Records, at each notification, the participants' phases the database holds then."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.calls: list[dict[tuple[str, int], str]] = []

    def __call__(self) -> None:
        with Session(self.api.engine) as s:
            rows = s.exec(select(Participant)).all()
        self.calls.append({(p.job_name, p.rank): p.phase for p in rows})


@pytest.fixture
def api(make_ingest_api: Callable[..., Api]) -> Api:
    return make_ingest_api()


def test_a_certain_fault_is_told_once_after_its_commit(api: Api) -> None:
    token = api.node_token(NODE)
    listener = Listener(api)
    api.app.state.ingest.watch_certain_faults(
        CertainFaultWatch(
            exited_phases=("EXITED", "RAY_DEAD"), fault_gauges=(m.GPU_LOST,), notify=listener
        )
    )
    seq = 0

    def post(*, phases: dict[int, str], gpu_lost: float | None = None, replay: bool = False) -> int:
        nonlocal seq
        seq += 0 if replay else 1
        body: dict[str, Any] = {
            "agent_id": "a",
            "node": NODE,
            "seq": seq,
            "sent_at": T0,
            "samples": []
            if gpu_lost is None
            else [{"name": m.GPU_LOST, "value": gpu_lost, "ts": T0 + seq, "labels": {"gpu": "0"}}],
            "participants": [
                {"job": "j", "role": "trainer", "rank": r, "phase": p, "step": 5, "ts": T0 + seq}
                for r, p in phases.items()
            ],
        }
        r = api.client.post("/api/v1/ingest", json=body, headers=auth(token))
        assert r.status_code == 200, r.text
        return len(listener.calls)

    # Healthy: nothing to tell.
    assert post(phases={0: "TRAIN", 1: "TRAIN"}, gpu_lost=0) == 0
    # The launcher saw rank 0 exit: told once, and the database already held the exit.
    assert post(phases={0: "EXITED", 1: "TRAIN"}, gpu_lost=0) == 1
    assert listener.calls[0][("j", 0)] == "EXITED"
    # Still exited in later batches, and a replay of the batch: nothing new.
    assert post(phases={0: "EXITED", 1: "TRAIN"}, gpu_lost=0) == 1
    assert post(phases={0: "EXITED", 1: "TRAIN"}, gpu_lost=0, replay=True) == 1
    # Ray reports rank 1's actor dead: told.
    assert post(phases={0: "EXITED", 1: "RAY_DEAD"}) == 2
    assert listener.calls[1][("j", 1)] == "RAY_DEAD"
    # The GPU falls off the bus: told when gpu_lost rises, not while it stays at 1.
    assert post(phases={}, gpu_lost=1) == 3
    assert post(phases={}, gpu_lost=1) == 3
    assert post(phases={}, gpu_lost=0) == 3
    assert post(phases={}, gpu_lost=1) == 4
    # Unregistered: ingest tells nobody.
    api.app.state.ingest.watch_certain_faults(None)
    assert post(phases={0: "TRAIN", 1: "TRAIN"}, gpu_lost=0) == 4
    assert post(phases={0: "EXITED", 1: "TRAIN"}) == 4


def test_a_failing_listener_never_fails_ingest(api: Api) -> None:
    token = api.node_token(NODE)

    def broken() -> None:
        raise RuntimeError("listener bug")

    api.app.state.ingest.watch_certain_faults(
        CertainFaultWatch(exited_phases=("EXITED",), fault_gauges=(), notify=broken)
    )
    body = {
        "agent_id": "a",
        "node": NODE,
        "seq": 1,
        "sent_at": T0,
        "samples": [],
        "participants": [
            {"job": "j", "role": "trainer", "rank": 0, "phase": "EXITED", "step": 5, "ts": T0}
        ],
    }
    r = api.client.post("/api/v1/ingest", json=body, headers=auth(token))
    assert r.status_code == 200 and r.json() == {"accepted": 0, "duplicate": False}, r.text
    with Session(api.engine) as s:
        assert [p.phase for p in s.exec(select(Participant)).all()] == ["EXITED"]
