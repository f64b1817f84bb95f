"""Real `rlguard up` / `rlguard server` processes for the server tests, and their process trees."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.harness import spawn, wait_for

ROOT = Path(__file__).resolve().parents[3]
RLGUARD = str(Path(sys.executable).with_name("rlguard"))

__all__ = ["ROOT", "RLGUARD", "rlguard", "descendants", "alive", "healthy"]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLGUARD_")}
    env.update(PYTHONPATH=str(ROOT), **extra)
    return env


@contextmanager
def rlguard(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run `rlguard ARGS` in a session of its own; whatever is left of it is killed at the end
    (its children have sessions of their own: they are killed by pid)."""
    with log.open("ab") as out:
        proc = spawn(
            [RLGUARD, *args],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    tree: set[Proc] = set()
    try:
        yield proc
    finally:
        tree = descendants(proc.pid) if proc.poll() is None else set()
        for pid in [proc.pid, *(p[0] for p in tree)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(10)


def healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    def up() -> bool:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            return httpx.get(url + "/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, timeout, f"{url}/healthz")


Proc = tuple[int, int]  # (pid, start time in clock ticks): a pid alone may be reused


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start time) of a live process, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    return int(fields[1]), fields[0], int(fields[19])


def descendants(pid: int) -> set[Proc]:
    """Every live process below ``pid`` (children, grandchildren...)."""
    parent_of: dict[int, tuple[int, int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None and st[1] != "Z":
                parent_of[int(entry.name)] = (st[0], st[2])
    found: set[Proc] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, (ppid, _) in parent_of.items() if ppid in frontier}
        found |= {(p, parent_of[p][1]) for p in frontier}
    return found


def alive(procs: set[Proc]) -> set[Proc]:
    """Those of ``procs`` still running (a zombie waiting for its reaper has stopped)."""
    left = set()
    for pid, started in procs:
        st = _stat(pid)
        if st is not None and st[2] == started and st[1] != "Z":
            left.add((pid, started))
    return left
