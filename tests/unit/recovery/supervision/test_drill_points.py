"""Injection points a process declares for itself (recovery.drill_points): the generic launcher
uses a point the running process declared instead of refusing, keeps today's refusal for a
process that declared none (or whose declaration is an earlier process's), and the request is
taken once, by the process it was meant for. RLGuard's TRL callback declares ``oom`` and fires
it as a CUDA-OOM error the launcher's exit-cause catalogue names ``cuda_oom`` (no TRL run)."""

from __future__ import annotations

import errno
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import pytest

from recovery import drill_points
from recovery.supervision import Child, Supervisor, requests
from recovery.supervision.events import read_events
from recovery.supervision.exit_causes import load_catalogue

pytestmark = pytest.mark.timeout(60)

GENERIC_OOM = "cannot inject oom: rlguard launch cannot make the next step of a generic command"


def _sup(tmp_path: Path) -> Supervisor:
    return Supervisor(
        tmp_path,
        "job",
        [Child("trainer", 0)],
        command=lambda child: [sys.executable, "-c", "import time; time.sleep(60)"],
        timeout=30,
    )


def _ask(sup: Supervisor, fault: str, key: str = "drill-1", **extra: Any) -> dict[str, Any] | None:
    body = {
        "action": "inject_fault",
        "key": key,
        "role": "trainer",
        "rank": None,
        "extra": {"drill": key, "fault": fault, **extra},
    }
    return sup.carry_out(requests.Request(sup.run_dir / f"{key}.json", body))


def test_a_declared_oom_point_is_used_and_fires_once_in_its_process(tmp_path: Path) -> None:
    sup = _sup(tmp_path)
    sup.start()
    try:
        child = sup.children[0]
        assert child.proc is not None
        pid = child.proc.pid
        drill_points.declare(tmp_path, "trainer", 0, {"oom": "its next step raises"}, pid=pid)
        plan = _ask(sup, "oom", key="drill-0", dry_run=True)
        assert plan is not None and plan["ok"] is True and plan["dry_run"] is True, plan
        assert not list((tmp_path / drill_points.DIRNAME).glob("*.request"))  # nothing asked
        answer = _ask(sup, "oom")
        assert answer is not None and answer["ok"] is True, answer
        assert answer["target_pid"] == pid and answer["injection_point"] == "declared"
        assert answer["what"] == (
            f"trainer-0 (pid {pid}), its own injection point: its next step raises"
        )
        assert child.proc.poll() is None  # the launcher touched nothing but the request
        # Fired once, by the process it was meant for.
        assert drill_points.take(tmp_path, "trainer", 0, "oom", pid=pid) == {
            "pid": pid,
            "drill": "drill-1",
        }
        assert drill_points.take(tmp_path, "trainer", 0, "oom", pid=pid) is None
        assert not list((tmp_path / drill_points.DIRNAME).glob("*.request*"))
        # It declared oom only: disk-full keeps the generic refusal.
        refused = _ask(sup, "disk-full", key="drill-2")
        assert refused is not None and refused["ok"] is False
        assert "cannot inject disk-full: rlguard launch cannot make" in refused["error"]
        kinds = [e["kind"] for e in read_events(tmp_path / "events.jsonl")]
        assert "drill_injected" in kinds
    finally:
        sup.close()


@pytest.mark.parametrize("declared_pid", [None, 1])  # none, or an earlier process's
def test_without_a_declaration_of_the_running_process_oom_is_refused_as_today(
    tmp_path: Path, declared_pid: int | None
) -> None:
    sup = _sup(tmp_path)
    sup.start()
    try:
        if declared_pid is not None:
            drill_points.declare(tmp_path, "trainer", 0, {"oom": "x"}, pid=declared_pid)
        answer = _ask(sup, "oom")
        assert answer is not None and answer["ok"] is False, answer
        assert answer["error"].startswith(GENERIC_OOM), answer
        assert not list((tmp_path / drill_points.DIRNAME).glob("*.request"))
    finally:
        sup.close()


def test_a_request_left_for_an_earlier_process_is_discarded_not_fired(tmp_path: Path) -> None:
    drill_points.request(tmp_path, "trainer", 0, "oom", pid=12345, drill="d")
    assert drill_points.take(tmp_path, "trainer", 0, "oom", pid=999) is None
    assert drill_points.take(tmp_path, "trainer", 0, "oom", pid=12345) is None  # gone
    assert drill_points.declared_points(tmp_path, "trainer", 0, 1) == {}  # nothing declared


def test_the_trl_callback_declares_oom_and_raises_a_cuda_oom_once(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    callback_mod = pytest.importorskip("integrations.trl.callback")
    cb = callback_mod.RLGuardCallback(tmp_path, role="trainer", rank=0)
    try:
        points = drill_points.declared_points(tmp_path, "trainer", 0, os.getpid())
        assert points == {
            "oom": callback_mod.DRILL_OOM_POINT,
            "disk-full": callback_mod.DRILL_DISK_FULL_POINT,
        }
        cb.on_pre_optimizer_step(None, None, None)  # nothing asked: nothing raised
        drill_points.request(tmp_path, "trainer", 0, "oom", pid=os.getpid(), drill="7")
        with pytest.raises(torch.OutOfMemoryError) as raised:
            cb.on_pre_optimizer_step(None, None, None)
        cb.on_pre_optimizer_step(None, None, None)  # taken: once
        # What the process prints when it dies of it is what the launcher's catalogue names.
        lines = "".join(traceback.format_exception(raised.value)).splitlines()
        cause = load_catalogue().match(lines, exit_signal=None)
        assert cause is not None and cause.cause == "cuda_oom", lines
        assert "rlguard drill 7" in str(raised.value)
    finally:
        cb.reporter.close()


def test_the_trl_callback_fails_the_next_checkpoint_save_with_enospc_once(tmp_path: Path) -> None:
    callback_mod = pytest.importorskip("integrations.trl.callback")
    from transformers import TrainerControl, TrainerState

    cb = callback_mod.RLGuardCallback(tmp_path, role="trainer", rank=0)
    state = TrainerState()
    state.global_step = 5
    try:
        cb.on_step_end(None, state, TrainerControl())  # nothing asked: nothing raised
        drill_points.request(tmp_path, "trainer", 0, "disk-full", pid=os.getpid(), drill="8")
        with pytest.raises(OSError) as raised:
            cb.on_step_end(None, state, TrainerControl())
        assert raised.value.errno == errno.ENOSPC
        assert "checkpoint-5 was not written" in str(raised.value)
        cb.on_step_end(None, state, TrainerControl())  # taken: once
        # The launcher's catalogue names the exit from what the process prints as it dies.
        lines = "".join(traceback.format_exception(raised.value)).splitlines()
        cause = load_catalogue().match(lines, exit_signal=None)
        assert cause is not None and cause.cause == "disk_full", lines
    finally:
        cb.reporter.close()
