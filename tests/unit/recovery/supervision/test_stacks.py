"""``py-spy dump`` of real Python processes: running, busy, SIGSTOPped, gone; and every way a
capture fails (no py-spy, ptrace denied, a dump that hangs) ends in a reason, within its time."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from recovery.supervision.stacks import capture_stacks, find_py_spy, truncate
from tests.harness import wait_for

pytestmark = pytest.mark.timeout(60)

SLEEPER = "import time\ndef parked_in_sleep():\n    while True:\n        time.sleep(0.05)\nparked_in_sleep()\n"
SPINNER = "def spinning_without_progress():\n    x = 0\n    while True:\n        x += 1\nspinning_without_progress()\n"
# py-spy is a dependency of the project (pyproject.toml): missing, these tests fail, not skip.
PY_SPY = find_py_spy() or "py-spy (not installed: reinstall the project)"


@pytest.fixture
def start() -> Iterator[object]:
    procs: list[subprocess.Popen[bytes]] = []

    def run(code: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-c", code])
        procs.append(proc)
        # py-spy reads an initialised interpreter: wait until a dump shows the test's code.
        wait_for(
            lambda: "<module>" in capture_stacks(proc.pid, py_spy=PY_SPY, timeout=5).text,
            10,
            "the interpreter to run the test's code",
        )
        return proc

    yield run
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait(10)


def test_a_sleeping_and_a_busy_process_show_the_function_they_are_in(start) -> None:
    sleeper, spinner = start(SLEEPER), start(SPINNER)
    parked = capture_stacks(sleeper.pid, py_spy=PY_SPY)
    busy = capture_stacks(spinner.pid, py_spy=PY_SPY)
    assert parked.ok and "parked_in_sleep" in parked.text and not parked.nonblocking
    assert busy.ok and "spinning_without_progress" in busy.text
    assert parked.pid == sleeper.pid and parked.reason == "" and parked.captured_at > 0


def test_a_sigstopped_process_is_read_without_pausing_it_again(start) -> None:
    sleeper = start(SLEEPER)
    os.kill(sleeper.pid, signal.SIGSTOP)
    wait_for(
        lambda: Path(f"/proc/{sleeper.pid}/stat").read_text().rpartition(")")[2].split()[0] == "T",
        10,
        "the process to stop",
    )
    got = capture_stacks(sleeper.pid, py_spy=PY_SPY)
    assert got.ok, got.reason
    assert got.nonblocking and "parked_in_sleep" in got.text
    assert Path(f"/proc/{sleeper.pid}/stat").read_text().rpartition(")")[2].split()[0] == "T"


def test_a_process_that_is_gone_has_a_reason() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(10)
    got = capture_stacks(proc.pid, py_spy=PY_SPY)
    assert (got.ok, got.text) == (False, "")
    assert got.reason == f"process {proc.pid} is gone"


def test_no_py_spy_is_a_reason_not_an_error(start, tmp_path: Path) -> None:
    sleeper = start(SLEEPER)
    missing = capture_stacks(sleeper.pid, py_spy=None)
    assert not missing.ok and "py-spy is not installed" in missing.reason
    wrong = capture_stacks(sleeper.pid, py_spy=str(tmp_path / "py-spy"))
    assert not wrong.ok and wrong.reason.startswith(f"cannot run py-spy {tmp_path / 'py-spy'}")


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="denying ptrace needs root to drop to another user (setpriv)",
)
def test_ptrace_denied_says_which_capability_is_missing(start, tmp_path: Path) -> None:
    sleeper = start(SLEEPER)
    # The real py-spy, run as nobody against a root process: the kernel refuses ptrace.
    denied = tmp_path / "py-spy-as-nobody"
    denied.write_text(
        f'#!/bin/sh\nexec setpriv --reuid=65534 --regid=65534 --clear-groups {PY_SPY} "$@"\n'
    )
    denied.chmod(0o755)
    got = capture_stacks(sleeper.pid, py_spy=str(denied))
    assert not got.ok and got.text == ""
    assert got.reason.startswith("ptrace denied (py-spy needs CAP_SYS_PTRACE")
    assert "Permission Denied" in got.reason


def test_a_dump_that_hangs_is_cut_at_the_timeout(start, tmp_path: Path) -> None:
    sleeper = start(SLEEPER)
    stuck = tmp_path / "py-spy-stuck"
    stuck.write_text("#!/bin/sh\nexec sleep 30\n")  # a py-spy stuck in the kernel, say
    stuck.chmod(0o755)
    began = time.monotonic()
    got = capture_stacks(sleeper.pid, py_spy=str(stuck), timeout=0.5)
    assert time.monotonic() - began < 5
    assert not got.ok and got.reason == "py-spy did not finish within 0.5s"


def test_a_long_dump_is_cut_with_a_marker_within_the_bound(start) -> None:
    spinner = start(SPINNER)
    whole = capture_stacks(spinner.pid, py_spy=PY_SPY)
    assert whole.ok and not whole.truncated
    small = capture_stacks(spinner.pid, py_spy=PY_SPY, max_bytes=80)
    assert small.truncated and len(small.text.encode()) <= 80
    assert "[... truncated by RLGuard:" in small.text


def test_truncate_counts_bytes_and_never_cuts_a_character() -> None:
    text = "é" * 100  # 200 bytes of UTF-8
    assert truncate(text, 200) == (text, False)
    cut, was_cut = truncate(text, 120)
    assert was_cut and len(cut.encode("utf-8")) <= 120
    head = cut.split("\n[... truncated")[0]
    assert head and set(head) == {"é"}
    assert cut.endswith(f"{200 - len(head.encode())} more bytes ...]\n")
