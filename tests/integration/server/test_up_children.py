"""`rlguard up` never leaves its embedded worker behind (issue 17 item 9).

After SIGTERM to `up` (what systemd or `docker stop` sends) no child is left; after SIGKILL to
`up` its children stop on their own, within a bound, so that a restarted `up` does not run a
second worker set on the same queues.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.harness import free_port, wait_for

from ._procs import alive, clean_env, descendants, healthy, rlguard

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

# The embedded worker's warm shutdown after `up` is gone, or the supervisor's grace period
# (ORPHAN_GRACE_SECONDS, 10 s) before it kills the group, plus slack for a loaded machine.
CHILDREN_GONE_WITHIN = 25.0


def _start_up(tmp_path: Path):  # type: ignore[no-untyped-def]
    port = free_port()
    env = clean_env(
        RLGUARD_DATA_DIR=str(tmp_path / "data"),
        RLGUARD_RECOVERY_EMBEDDED_NODES="n1",
        RLGUARD_POLICY_SCHEDULER="0",
    )
    log = tmp_path / "up.log"
    return rlguard(["up", "--port", str(port)], env, log), f"http://127.0.0.1:{port}", log


def _ready_worker_tree(up_pid: int, log: Path) -> set[tuple[int, int]]:
    """The embedded worker and its pool process, once the worker says it is ready."""
    wait_for(
        lambda: "embedded@" in log.read_text() and " ready." in log.read_text(),
        60,
        "the embedded worker to be ready",
    )
    tree = descendants(up_pid)
    assert len(tree) >= 2, f"expected the worker and its pool process under up, found {tree}"
    return tree


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_no_child_of_up_outlives_it(tmp_path: Path, sig: signal.Signals) -> None:
    cm, url, log = _start_up(tmp_path)
    tree: set[tuple[int, int]] = set()
    with cm as up:
        try:
            healthy(url, up, log)
            tree = _ready_worker_tree(up.pid, log)
            os.kill(up.pid, sig)
            code = up.wait(30)
            if sig is signal.SIGTERM:
                # a clean exit: the `finally` that stops the children ran
                assert code == 128 + signal.SIGTERM, log.read_text()[-3000:]
                assert not alive(tree), f"left after up exited: {alive(tree)}"
            else:
                assert code == -signal.SIGKILL
                wait_for(
                    lambda: not alive(tree),
                    CHILDREN_GONE_WITHIN,
                    f"the children of the killed up ({sorted(tree)}) to stop",
                )
        finally:
            for pid, _ in alive(tree):
                os.kill(pid, signal.SIGKILL)
