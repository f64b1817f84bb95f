"""Hang forensics in ``restart_role``: the adapter asks the node's launcher (a real
:class:`~recovery.supervision.Supervisor`, through the real launcher hook executable) for the
process's stacks, records them while the hung process is still there, then asks for the
restart. Every way the capture fails ends in a recorded reason, and the restart still runs."""

from __future__ import annotations

import os
import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.actions.machine import ActionSnapshot
from app.tasks import recovery_adapters as ra
from recovery.supervision import Child, RestartBudget, Supervisor, hook
from recovery.supervision.stacks import find_py_spy

pytestmark = pytest.mark.timeout(90)

CHILD = (
    "import time\ndef stuck_in_a_collective():\n    while True:\n        time.sleep(0.05)\n"
    "stuck_in_a_collective()\n"
)
# py-spy is a dependency of the project (pyproject.toml): missing, these tests fail, not skip.
PY_SPY = find_py_spy() or "py-spy (not installed: reinstall the project)"
OPTS = {"timeout_seconds": 10, "max_bytes": 65536}


class Node:
    """A launcher running one trainer process, its loop in a thread, and what was recorded."""

    def __init__(self, run_root: Path, py_spy: str | None, code: str = CHILD) -> None:
        self.sup = Supervisor(
            run_root / "j",
            "j",
            [Child("trainer", 0)],
            command=lambda child: [sys.executable, "-c", code],
            budget=RestartBudget(max_restarts=5, backoff=0, backoff_max=0),
            timeout=80,
            py_spy=py_spy,
        )
        self.recorded: list[tuple[list[dict[str, Any]], int | None, bool]] = []
        launcher = run_root / "hook"
        hook.write_hook(launcher, module="integrations.launch", run_root=run_root)
        self.ctx = ra.ActionContext(
            run_root=run_root,
            launcher=str(launcher),
            launcher_timeout=60,
            attach_stacks=self.attach,
        )
        self.thread = threading.Thread(target=self.sup.loop, daemon=True)

    def attach(self, action: ActionSnapshot, captures: list[dict[str, Any]]) -> bool:
        # What the incident gets, and whether the captured process was still the live one then.
        child = self.sup.children[0]
        alive = child.proc is not None and child.proc.poll() is None
        self.recorded.append((captures, child.last_pid, alive))
        return True

    def pid(self) -> int:
        proc = self.sup.children[0].proc
        assert proc is not None
        return proc.pid


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Any]:
    nodes: list[Node] = []

    def make(py_spy: str | None, code: str = CHILD) -> Node:
        n = Node(tmp_path, py_spy, code)
        n.sup.start()
        n.thread.start()
        nodes.append(n)
        return n

    yield make
    for n in nodes:
        n.sup.stop()
        n.thread.join(10)
        n.sup.close()


def _restart(n: Node, **params: Any) -> dict[str, Any]:
    a = ActionSnapshot(
        3,
        9,
        "restart_role",
        "j",
        "n0",
        {"role": "trainer", "rank": 0, **params},
        1,
        "inc9/s0/restart_role:j",
    )
    return ra.restart_role(n.ctx, a)


def _wait_readable(n: Node) -> None:
    from recovery.supervision.stacks import capture_stacks
    from tests.harness import wait_for

    wait_for(
        lambda: "stuck_in_a_collective" in capture_stacks(n.pid(), py_spy=PY_SPY).text,
        20,
        "the trainer to run its code",
    )


def test_the_stacks_are_recorded_from_the_hung_process_before_it_is_restarted(node) -> None:
    n = node(PY_SPY)
    _wait_readable(n)
    hung = n.pid()
    result = _restart(n, capture_stacks=OPTS)
    [(captures, pid_then, alive_then)] = n.recorded
    assert (pid_then, alive_then) == (hung, True)  # recorded before the restart killed it
    [c] = captures
    assert c["ok"] and c["pid"] == hung and (c["role"], c["rank"]) == ("trainer", 0)
    assert "stuck_in_a_collective" in c["text"]
    assert n.pid() != hung  # then restarted
    assert result["exit"] == 0 and '"restarted": ["trainer-0"]' in result["stdout"]
    assert result["stacks"]["attached"] is True
    assert result["stacks"]["processes"][0]["ok"] is True
    # The launcher's timeline: the capture, then the restart.
    kinds = [e["kind"] for e in _events(n) if e["kind"] in ("stacks_captured", "restart")]
    assert kinds == ["stacks_captured", "restart"]


def test_a_restart_without_forensics_asks_for_no_stacks(node) -> None:
    n = node(PY_SPY)
    result = _restart(n)
    assert n.recorded == [] and "stacks" not in result
    assert [e["action"] for e in _events(n) if e["kind"] == "hook_request"] == ["restart_role"]


def _events(n: Node) -> list[dict[str, Any]]:
    from recovery.supervision.events import read_events

    return read_events(n.sup.run_dir / "events.jsonl")


def _denied(tmp_path: Path) -> str:
    script = tmp_path / "py-spy-as-nobody"
    script.write_text(
        f'#!/bin/sh\nexec setpriv --reuid=65534 --regid=65534 --clear-groups {PY_SPY} "$@"\n'
    )
    script.chmod(0o755)
    return str(script)


CASES = {
    "py-spy missing": (lambda tmp: None, "py-spy is not installed"),
    "ptrace denied": (_denied, "ptrace denied (py-spy needs CAP_SYS_PTRACE"),
    "process gone": (lambda tmp: PY_SPY, "process gone: it exited (3) before the capture"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_failed_capture_is_recorded_with_its_reason_and_the_restart_runs(
    node, tmp_path: Path, case: str
) -> None:
    if case == "ptrace denied" and (os.geteuid() != 0 or shutil.which("setpriv") is None):
        pytest.skip("denying ptrace needs root to drop to another user (setpriv)")
    py_spy, reason = CASES[case]
    code = "import sys; sys.exit(3)" if case == "process gone" else CHILD
    n = node(py_spy(tmp_path), code)
    if case == "process gone":
        from tests.harness import wait_for

        wait_for(lambda: n.sup.children[0].reported_exit, 20, "the exit to be reported")
    first = n.pid()
    result = _restart(n, capture_stacks=OPTS)
    [(captures, _, _)] = n.recorded
    [c] = captures
    assert c["ok"] is False and c["text"] == ""
    assert c["reason"].startswith(reason), c["reason"]
    assert result["exit"] == 0 and n.pid() != first  # the restart ran all the same
    assert result["stacks"]["processes"] == [
        {"pid": c["pid"], "ok": False, "reason": c["reason"], "bytes": 0}
    ]


def test_a_launcher_that_gives_no_stacks_is_a_reason_and_the_restart_still_fails_alone(
    tmp_path: Path,
) -> None:
    # No launcher runs for the job: the capture records why, the restart fails on its own.
    (tmp_path / "j").mkdir()
    launcher = tmp_path / "hook"
    hook.write_hook(launcher, module="integrations.launch", run_root=tmp_path)
    seen: list[list[dict[str, Any]]] = []
    ctx = ra.ActionContext(
        run_root=tmp_path,
        launcher=str(launcher),
        launcher_timeout=30,
        attach_stacks=lambda a, c: seen.append(c) or True,
    )
    a = ActionSnapshot(
        3,
        9,
        "restart_role",
        "j",
        "n0",
        {"role": "trainer", "rank": 0, "capture_stacks": OPTS},
        1,
        "inc9/s0/r",
    )
    with pytest.raises(ra.ActionError, match="launcher exited 2"):
        ra.restart_role(ctx, a)
    [[c]] = seen
    assert c["ok"] is False and c["reason"].startswith(
        "the launcher gave no stacks: no running job"
    )


def test_safe_mode_of_a_hang_held_for_a_person_records_the_stacks_first(node) -> None:
    """A first-step hang escalates to SAFE_MODE + an approved restart_job: the stacks are taken
    as SAFE_MODE is entered, from the live process, which is left running (a person decides)."""
    from recovery.control import ControlMode, read_control

    n = node(PY_SPY)
    _wait_readable(n)
    hung = n.pid()
    a = ActionSnapshot(
        4,
        9,
        "enter_safe_mode",
        "j",
        "n0",
        {"reason": "train_hang", "role": "trainer", "rank": 0, "capture_stacks": OPTS},
        1,
        "inc9/s0/enter_safe_mode:j:n0:trainer:0",
    )
    result = ra.enter_safe_mode(n.ctx, a)
    [(captures, pid_then, alive_then)] = n.recorded
    assert (pid_then, alive_then) == (hung, True)
    [c] = captures
    assert c["ok"] and c["pid"] == hung and "stuck_in_a_collective" in c["text"]
    assert result["mode"] == ControlMode.SAFE_MODE.value and result["stacks"]["attached"] is True
    assert read_control(n.sup.run_dir).mode is ControlMode.SAFE_MODE
    assert n.pid() == hung  # not restarted: SAFE_MODE holds it for the approver


def test_plain_safe_mode_asks_the_launcher_for_nothing(node) -> None:
    n = node(PY_SPY)
    a = ActionSnapshot(
        4,
        9,
        "enter_safe_mode",
        "j",
        "n0",
        {"reason": "step_failed"},
        1,
        "inc9/s0/enter_safe_mode:j:n0",
    )
    result = ra.enter_safe_mode(n.ctx, a)
    assert n.recorded == [] and "stacks" not in result and result["already"] is False
    assert [e for e in _events(n) if e["kind"] == "hook_request"] == []
