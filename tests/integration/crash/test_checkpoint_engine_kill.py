"""kill -9 real checkpoint writers at random moments; what ``latest()`` returns must always load
and equal what was saved for its version, and a committed checkpoint never goes missing."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recovery.checkpoint import atomic
from recovery.checkpoint.engine import MARKER, CheckpointEngine
from tests.harness import spawn
from tests.harness.training_state import assert_same
from tests.integration.checkpoint._kill_state import STEPS_PER_WRITER, make_state, table_of

REPO = Path(__file__).resolve().parents[3]
KILLS = 105

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def zygote() -> subprocess.Popen[str]:
    proc = spawn(
        [sys.executable, "-m", "tests.integration.checkpoint._writer_zygote"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    yield proc
    try:
        assert proc.stdin is not None
        proc.stdin.write("exit\n")
        proc.stdin.flush()
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def _ask(proc: subprocess.Popen[str], line: str) -> list[str]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    answer = proc.stdout.readline().split()
    assert answer, f"zygote died answering {line!r}"
    return answer


@pytest.mark.timeout(180)
def test_kill_9_writer_at_random_moments(tmp_path: Path, zygote: subprocess.Popen[str]) -> None:
    rng = random.Random(20261129)
    root = tmp_path / "ckpt"
    reader = CheckpointEngine(root)
    mirror = tmp_path / "ckpt-mirror"
    best_seq = best_mirror_seq = mirror_loads = 0
    hit_mid_write = 0
    loads = 0
    for kill in range(KILLS):
        io = "direct" if kill % 2 else "buffered"  # both write paths get killed
        _, pid = _ask(zygote, f"fork {root} {kill * STEPS_PER_WRITER} {io}")
        time.sleep(rng.uniform(0.01, 0.12))
        os.kill(int(pid), signal.SIGKILL)
        _, _, status = _ask(zygote, f"reap {pid}")
        assert os.WIFSIGNALED(int(status)) and os.WTERMSIG(int(status)) == signal.SIGKILL, (
            f"writer {pid} was not killed by us (status {status}): it must have crashed"
        )

        leftovers = [p for p in root.iterdir() if p.name.startswith(atomic.TMP_PREFIX)]
        unmarked = [p for p in reader.list_committed() if not (p / MARKER).exists()]
        hit_mid_write += bool(leftovers or unmarked)

        info = reader.latest()
        if info is None:
            assert best_seq == 0, "a committed checkpoint disappeared"
            continue
        assert info.seq >= best_seq, f"latest went back from seq {best_seq} to {info.seq}"
        best_seq = info.seq
        step = info.version.training_step
        assert info.weight_versions == table_of(step)
        assert_same(make_state(step), reader.load(info))
        loads += 1
        # The background mirror ("remote" copy) is crash-safe the same way.
        mirrored = reader.latest(root=mirror)
        if mirrored is not None:
            assert mirrored.seq >= best_mirror_seq, "the mirror went back"
            best_mirror_seq = mirrored.seq
            assert_same(make_state(mirrored.version.training_step), reader.load(mirrored))
            mirror_loads += 1

    print(
        f"{KILLS} kills, {hit_mid_write} left an uncommitted write behind, {loads} verified "
        f"loads, {mirror_loads} verified mirror loads"
    )
    assert loads >= KILLS * 0.8 and mirror_loads >= KILLS * 0.5
    # The kills must really land during writes, or the test proves nothing.
    assert hit_mid_write >= KILLS * 0.3
