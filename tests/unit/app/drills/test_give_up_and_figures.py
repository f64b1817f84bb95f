"""The node worker's side of a drill, against the real launcher hook (``recovery.supervision.
hook``) on real request files:

* a launcher that does not answer within the give-up time: the drill is refused *and* its
  request is withdrawn from the run directory (a launcher that wakes up later finds nothing to
  inject); a launcher that answered just before the worker gave up: its answer is the drill's;
* when a drill is over, the node counts the generations its fault made the job do again (the
  reference job's rollout WAL, TRL's generation log) from the injection on, or says why there
  is no number, and the drill ends with the follow-up's outcome.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.core import migrate
from app.core.db import make_engine
from app.drills.figures import HookSetup, finish_drill, generations_text
from app.drills.launcher import Next, ask_launcher
from app.models.drill import Drill, DrillStatus
from recovery.supervision import requests
from recovery.supervision.events import append_event
from recovery.supervision.requests import request_name

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[4]
JOB = "j"


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    migrate.upgrade(url)
    eng = make_engine(url)
    yield eng
    eng.dispose()


@pytest.fixture
def run_root(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    requests.announce(root / JOB)  # a launcher "runs" (this process) but never answers
    return root


@pytest.fixture
def setup(tmp_path: Path, run_root: Path) -> HookSetup:
    hook = tmp_path / "hook"
    hook.write_text(
        f"#!/bin/sh\ncd {ROOT}\nexec {sys.executable} -c 'import sys; "
        "from recovery.supervision.hook import main; "
        f'sys.exit(main(sys.argv[1:], prog="hook", default_run_root="{run_root}"))\' "$@"\n'
    )
    hook.chmod(0o755)
    return HookSetup(str(hook), wait_seconds=0.2)


def _add(engine: Engine, **kw: Any) -> int:
    base: dict[str, Any] = dict(
        job=JOB,
        role="trainer",
        rank=0,
        node="n1",
        fault="kill",
        requested_by="user:op",
        requested_at=datetime.now(UTC),
    )
    base.update(kw)
    with Session(engine) as s:
        row = Drill(**base)
        s.add(row)
        s.commit()
        assert row.id is not None
        return row.id


def _get(engine: Engine, drill_id: int) -> Drill:
    with Session(engine, expire_on_commit=False) as s:
        row = s.get(Drill, drill_id)
        assert row is not None
        return row


def _request(run_root: Path, drill_id: int) -> Path:
    return requests.requests_dir(run_root / JOB) / f"{request_name(f'drill-{drill_id}')}.json"


def test_a_drill_given_up_is_refused_and_its_request_withdrawn(
    engine: Engine, setup: HookSetup, run_root: Path
) -> None:
    now = datetime.now(UTC)
    drill_id = _add(engine, requested_at=now)
    # Asked within the give-up time: the request waits in the launcher's directory.
    assert ask_launcher(engine, drill_id, setup, now=now) is Next.ASK_AGAIN
    req = _request(run_root, drill_id)
    body = json.loads(req.read_text())
    assert body["extra"]["expires_at"] == pytest.approx(now.timestamp() + 60, abs=0.01)
    # Asked after it: refused, and the request is gone (withdrawn, answered as such).
    assert ask_launcher(engine, drill_id, setup, now=now + timedelta(seconds=61)) is Next.DONE
    row = _get(engine, drill_id)
    assert row.status == DrillStatus.refused.value
    assert row.reason == "the launcher did not answer within 60 s: the request was withdrawn"
    assert not req.exists() and requests.pending(run_root / JOB) == []
    done = json.loads(req.with_suffix(".done").read_text())
    assert done["withdrawn"] is True and done["ok"] is False


def test_an_answer_that_came_just_before_the_give_up_is_the_drills(
    engine: Engine, setup: HookSetup, run_root: Path
) -> None:
    now = datetime.now(UTC)
    drill_id = _add(engine, requested_at=now)
    assert ask_launcher(engine, drill_id, setup, now=now) is Next.ASK_AGAIN
    [req] = requests.pending(run_root / JOB)
    # The launcher took it and answered after the hook's last wait, before the withdrawal.
    assert requests.claim(req) is None
    requests.answer(
        req,
        {
            "ok": True,
            "fault": "kill",
            "what": "SIGKILL trainer-0 (pid 42)",
            "target_pid": 42,
            "injected_at": now.timestamp() + 1,
            "step": 7,
        },
    )
    assert ask_launcher(engine, drill_id, setup, now=now + timedelta(seconds=61)) is Next.FOLLOW
    row = _get(engine, drill_id)
    assert row.status == DrillStatus.injected.value and row.target_pid == 42
    assert row.step_at_injection == 7


def test_a_request_the_launcher_took_but_did_not_answer_is_waited_for_then_refused_as_unknown(
    engine: Engine, setup: HookSetup, run_root: Path
) -> None:
    now = datetime.now(UTC)
    drill_id = _add(engine, requested_at=now)
    assert ask_launcher(engine, drill_id, setup, now=now) is Next.ASK_AGAIN
    [req] = requests.pending(run_root / JOB)
    assert requests.claim(req) is None  # taken: injecting now (or it stopped right then)
    # Not withdrawn: its answer is waited for a while longer ...
    assert ask_launcher(engine, drill_id, setup, now=now + timedelta(seconds=61)) is Next.ASK_AGAIN
    assert _get(engine, drill_id).status == DrillStatus.requested.value
    # ... then the drill is refused, saying that the fault may be in.
    assert ask_launcher(engine, drill_id, setup, now=now + timedelta(seconds=121)) is Next.DONE
    row = _get(engine, drill_id)
    assert row.status == DrillStatus.refused.value
    assert row.reason == (
        "the launcher did not answer within 60 s; the launcher took the request "
        "and never answered: whether it injected the fault is unknown, check "
        "the process"
    )


def _over(engine: Engine, run_root: Path, *, outcome: str = "recovered") -> int:
    injected = datetime.now(UTC) - timedelta(seconds=30)
    return _add(
        engine,
        status=DrillStatus.injected.value,
        injected_at=injected,
        report={
            "outcome": outcome,
            "recovered": outcome == "recovered",
            "generations_note": "counted on the node when the drill is over",
            "state": "recovered: the job made a new step; counting the generations "
            "redone on node n1",
        },
    )


def _event(run_root: Path, kind: str, ago: float, **fields: Any) -> None:
    path = run_root / JOB / "events.jsonl"
    append_event(path, kind, **fields)
    lines = path.read_text().splitlines()
    last = json.loads(lines[-1])
    last["ts"] -= ago
    path.write_text("\n".join([*lines[:-1], json.dumps(last)]) + "\n")


def test_the_reference_jobs_rollouts_lost_mid_batch_are_counted_from_the_injection_on(
    engine: Engine, setup: HookSetup, run_root: Path
) -> None:
    (run_root / JOB / "wal").mkdir()
    _event(run_root, "lost_rollout", 120, samples=8)  # before the drill: not its
    _event(run_root, "lost_rollout", 10, samples=16)
    _event(run_root, "batch_start", 9)
    drill_id = _over(engine, run_root)
    assert finish_drill(engine, drill_id, setup, now=datetime.now(UTC)) is True
    row = _get(engine, drill_id)
    assert row.status == "recovered" and row.finished_at is not None
    rep = row.report
    assert rep["generations_redone"] == 16 and rep["unit"] == "rollouts"
    assert rep["batches_redone"] == 1 and "outcome" not in rep and "generations_note" not in rep
    assert rep["state"] == "recovered: the job made a new step"
    assert generations_text(rep) == "16 rollouts"
    # Ended once: a second delivery of the task changes nothing.
    assert finish_drill(engine, drill_id, setup, now=datetime.now(UTC)) is False


def test_trls_logged_generations_redone_and_reused_are_counted(
    engine: Engine, setup: HookSetup, run_root: Path
) -> None:
    (run_root / JOB / "generations").mkdir()
    _event(run_root, "generation_redone", 5, step=3, index=0)
    _event(run_root, "generation_redone", 4, step=4, index=0)
    _event(run_root, "generation_reused", 3, step=5, index=0)
    drill_id = _over(engine, run_root, outcome="unrecovered")
    assert finish_drill(engine, drill_id, setup, now=datetime.now(UTC)) is True
    row = _get(engine, drill_id)
    assert row.status == "unrecovered"
    assert (row.report["generations_redone"], row.report["generations_reused"]) == (2, 1)
    assert generations_text(row.report) == "2 batches (1 logged batch reused instead)"
    assert generations_text({"generations_redone": 1, "unit": "rollouts"}) == "1 rollout"


def test_a_job_that_records_no_generations_says_why_there_is_no_number(
    engine: Engine, setup: HookSetup, run_root: Path
) -> None:
    drill_id = _over(engine, run_root)
    assert finish_drill(engine, drill_id, setup, now=datetime.now(UTC)) is True
    rep = _get(engine, drill_id).report
    assert rep["generations_redone"] is None
    assert rep["generations_note"].startswith("not measured: the job records no generations")


def test_a_hook_that_cannot_count_or_no_hook_says_so(engine: Engine, tmp_path: Path) -> None:
    other = tmp_path / "ray-hook"
    other.write_text(
        "#!/bin/sh\necho \"usage: ray-hook: invalid choice: 'drill_figures'\" >&2\nexit 2\n"
    )
    other.chmod(0o755)
    first, second = _over(engine, tmp_path), _over(engine, tmp_path)
    assert finish_drill(engine, first, HookSetup(str(other)), now=datetime.now(UTC))
    assert finish_drill(engine, second, HookSetup(None), now=datetime.now(UTC))
    assert _get(engine, first).report["generations_note"] == (
        "not measured: the node's launcher hook cannot count them (usage: ray-hook: invalid "
        "choice: 'drill_figures')"
    )
    assert _get(engine, second).report["generations_note"] == (
        "not measured: the worker of node 'n1' has no launcher hook to count them"
    )
    assert os.path.exists(tmp_path / "db.sqlite")


def test_only_a_drill_that_is_over_and_not_yet_counted_waits_for_its_node(
    engine: Engine, run_root: Path, setup: HookSetup
) -> None:
    from app.drills.follow import awaiting_figures

    over = _over(engine, run_root)
    following = _add(engine, status=DrillStatus.injected.value, report={"recovered": False})
    refused = _add(engine, status=DrillStatus.refused.value)
    with Session(engine) as s:
        assert awaiting_figures(s, over) == "n1"
        assert awaiting_figures(s, following) is None
        assert awaiting_figures(s, refused) is None
    assert finish_drill(engine, over, setup, now=datetime.now(UTC))
    with Session(engine) as s:
        assert awaiting_figures(s, over) is None  # counted and ended


def test_a_count_the_broker_refuses_ends_the_drill_uncounted_saying_why(
    engine: Engine, run_root: Path, redis_url: str
) -> None:
    """The follow-up hands the count to the node's worker; when the broker refuses the task the
    drill ends there, with its outcome and why it has no count (it stayed ``injected``). A task
    the broker takes leaves the drill waiting for its node."""
    import uuid

    import redis
    from celery import Celery

    from app.drills.figures import request_figures

    down = Celery(broker="redis://127.0.0.1:1/0")  # nothing listens on port 1
    down.conf.broker_connection_retry = False
    refused = _over(engine, run_root, outcome="unrecovered")
    assert request_figures(down, engine, refused, "n1", now=datetime.now(UTC)) is False
    row = _get(engine, refused)
    assert row.status == "unrecovered" and row.finished_at is not None
    assert "outcome" not in row.report and row.report["generations_redone"] is None
    note = row.report["generations_note"]
    assert note.startswith(
        "not measured: the count could not be sent to the worker of node 'n1' ("
    ), note
    assert "counting the generations" not in row.report["state"]

    node = f"figures-{uuid.uuid4().hex[:8]}"
    up = Celery(broker=redis_url)
    sent = _over(engine, run_root)
    try:
        assert request_figures(up, engine, sent, node, now=datetime.now(UTC)) is True
        assert redis.Redis.from_url(redis_url).llen(f"node.{node}") == 1
    finally:
        redis.Redis.from_url(redis_url).delete(f"node.{node}")
        up.close()
    assert _get(engine, sent).status == DrillStatus.injected.value  # its node ends it
