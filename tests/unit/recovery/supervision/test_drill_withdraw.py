"""A drill request its requester gave up on is withdrawn, and the launcher never injects it:
withdrawn before the launcher read it, withdrawn after it read it but before it acted (the
race: both claim the request by creating one file once, so one wins), and a request found
after its ``expires_at`` (the requester could not withdraw it) refused as stale. A request the
launcher took first is not withdrawn: its answer comes back instead. Through the hook's own
command line (``withdraw``), on real request files and a real supervisor."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from recovery.supervision import Child, Supervisor, requests
from recovery.supervision.events import read_events
from recovery.supervision.hook import main as hook_main

pytestmark = pytest.mark.timeout(60)
JOB = "job"


def _sup(root: Path) -> Supervisor:
    return Supervisor(
        root / JOB,
        JOB,
        [Child("trainer", 0)],
        command=lambda child: [sys.executable, "-c", "import time; time.sleep(60)"],
        timeout=30,
    )


def _leave(root: Path, key: str, **extra: Any) -> None:
    """Leave an inject_fault request that nobody answers within the wait (the hook's exit 3)."""
    body = {
        "action": "inject_fault",
        "role": "trainer",
        "rank": None,
        "extra": {"fault": "kill", "drill": key, **extra},
    }
    with pytest.raises(requests.LauncherTimeout):
        requests.submit(root / JOB, body, key=key, timeout=0.1)


def _hook(root: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any]:
    code = hook_main([*args, f"--job={JOB}"], prog="hook", default_run_root=str(root))
    out = capsys.readouterr().out.strip().splitlines()
    return code, json.loads(out[-1]) if out else None


def _alive(sup: Supervisor) -> bool:
    c = sup.children[0]
    return c.proc is not None and c.proc.poll() is None


def _injected(root: Path) -> list[dict[str, Any]]:
    return [e for e in read_events(root / JOB / "events.jsonl") if e["kind"] == "drill_injected"]


def test_a_withdrawn_request_is_removed_and_never_injected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sup = _sup(tmp_path)
    sup.start()
    try:
        _leave(tmp_path, "drill-1")
        assert len(requests.pending(sup.run_dir)) == 1
        code, answer = _hook(
            tmp_path,
            capsys,
            "withdraw",
            "--idempotency-key=drill-1",
            '--extra={"why": "gave up after 60 s"}',
        )
        assert code == 0 and answer == {"withdrawn": True}
        assert requests.pending(sup.run_dir) == []  # gone from the launcher's directory
        sup.handle_requests()
        assert _alive(sup) and _injected(tmp_path) == []
        # The same key asked again gets the withdrawal, and nothing is written for the launcher.
        again = requests.submit(sup.run_dir, {"action": "inject_fault"}, key="drill-1", timeout=1)
        assert again["ok"] is False and again["withdrawn"] is True
        assert again["error"] == "gave up after 60 s" and requests.pending(sup.run_dir) == []
        # Withdrawing twice is still withdrawn.
        assert _hook(tmp_path, capsys, "withdraw", "--idempotency-key=drill-1") == (
            0,
            {"withdrawn": True},
        )
    finally:
        sup.close()


def test_a_request_the_launcher_read_but_had_not_acted_on_is_not_injected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sup = _sup(tmp_path)
    sup.start()
    try:
        _leave(tmp_path, "drill-2")
        [read] = requests.pending(sup.run_dir)  # the launcher read it ...
        assert _hook(tmp_path, capsys, "withdraw", "--idempotency-key=drill-2")[0] == 0
        answer = sup.carry_out(read)  # ... and acts on it after the withdrawal
        assert answer is not None and answer["ok"] is False and answer["withdrawn"] is True
        assert "withdrawn by its requester" in answer["error"]
        assert _alive(sup) and _injected(tmp_path) == []
    finally:
        sup.close()


def test_a_request_the_launcher_took_first_is_not_withdrawn_and_its_answer_comes_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sup = _sup(tmp_path)
    sup.start()
    try:
        _leave(tmp_path, "drill-3")
        sup.handle_requests()  # injected and answered
        assert len(_injected(tmp_path)) == 1
        code, body = _hook(tmp_path, capsys, "withdraw", "--idempotency-key=drill-3")
        assert code == 1 and body["withdrawn"] is False
        assert body["answer"]["ok"] is True and body["answer"]["fault"] == "kill"
    finally:
        sup.close()


def test_a_stale_request_is_refused_and_nothing_injected(tmp_path: Path) -> None:
    sup = _sup(tmp_path)
    sup.start()
    try:
        _leave(tmp_path, "drill-4", expires_at=time.time() - 5)
        [req] = requests.pending(sup.run_dir)
        answer = sup.carry_out(req)
        assert answer is not None and answer["ok"] is False
        assert "the request expired" in answer["error"] and "not injected" in answer["error"]
        assert _alive(sup) and _injected(tmp_path) == []
    finally:
        sup.close()


@pytest.mark.parametrize("expires", ["soon", True])
def test_a_bad_expiry_is_refused_naming_it(tmp_path: Path, expires: Any) -> None:
    sup = _sup(tmp_path)
    sup.start()
    try:
        _leave(tmp_path, "drill-5", expires_at=expires)
        [req] = requests.pending(sup.run_dir)
        answer = sup.carry_out(req)
        assert answer is not None and answer["ok"] is False
        assert answer["error"] == f"expires_at must be epoch seconds, got {expires!r}"
        assert _alive(sup) and _injected(tmp_path) == []
    finally:
        sup.close()


def test_the_hook_refuses_drill_figures_without_a_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / JOB).mkdir()
    with pytest.raises(SystemExit) as exc:
        hook_main(
            ["drill_figures", f"--job={JOB}", "--idempotency-key=k", '--extra={"since": "x"}'],
            prog="hook",
            default_run_root=str(tmp_path),
        )
    assert exc.value.code == 2
    assert "drill_figures needs --extra='{\"since\": EPOCH_SECONDS}', got {'since': 'x'}" in (
        capsys.readouterr().err
    )


def test_an_armed_drill_whose_request_expired_is_refused_when_checked_not_injected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from recovery.report import HeartbeatReporter
    from recovery.supervision import drills

    sup = _sup(tmp_path)
    sup.start()
    try:
        trainer = sup.children[0]
        assert trainer.proc is not None
        beat = HeartbeatReporter(sup.run_dir, "trainer", 0, job=JOB, pid=trainer.proc.pid)
        beat.update(phase="TRAIN", step=3, force=True)
        now = time.time()
        _leave(tmp_path, "drill-6", at_step=5, expires_at=now + 60)
        [req] = requests.pending(sup.run_dir)
        assert sup.carry_out(req) is None  # armed for step 5
        beat.update(phase="TRAIN", step=5, force=True)
        # The step came only after the requester gave up (its clock, read by the launcher).
        monkeypatch.setattr(drills.time, "time", lambda: now + 120)
        sup.drills.fire_due(sup)
        done = json.loads(req.path.with_suffix(".done").read_text())
        assert done["ok"] is False and "the request expired 60 s ago" in done["error"]
        assert _alive(sup) and _injected(tmp_path) == []
    finally:
        monkeypatch.undo()
        sup.close()
