"""Slowloris against a real `rlguard server` (issue 41 item 4), and SIGTERM under it (item 2).
Baseline: ``/healthz`` answered in the same run before the attack.

    .venv/bin/python benchmarks/slowloris.py                    # 1,200 half-open connections
    .venv/bin/python benchmarks/slowloris.py --connections 200  # smoke

Starts ``rlguard server`` with its defaults (header timeout 10 s, 128 connections per client
address, concurrency limit 1000, policy scheduler on) on a fresh SQLite database, then:

* ``idle``: ``--probes`` GETs of ``/healthz``, each on a new connection from 127.0.0.2;
* ``attack``: ``--connections`` half-open connections from 127.0.0.1 (half a request line each,
  never finished), then the same probes from 127.0.0.2 and from 127.0.0.1 itself, and
  ``/readyz``, while they are held;
* ``stop``: SIGTERM while the attack is held, timed until the process is gone.

Prints the probes' status counts, p50, p99 and slowest in each phase and the ratio attack/idle
of the p50 (target: every probe 200, none slower than 1 s; before issue 41 they were 503 for
~10 s), how many of the attacker's connections the server kept (target: at most the cap) and
closed, its open descriptors, and the seconds SIGTERM took (target: under
``server.shutdown_deadline_seconds``, 25).
"""

from __future__ import annotations

import argparse
import http.client
import os
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.ingest import free_port, wait_ready  # noqa: E402

PARTIAL_REQUEST = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


def probe(port: int, source: str, path: str = "/healthz") -> tuple[int, float]:
    """Status (0: no answer) and seconds of one GET on a new connection from ``source``."""
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
    try:
        conn.request("GET", path)
        status = conn.getresponse().status
    except OSError:
        status = 0
    finally:
        conn.close()
    return status, time.perf_counter() - started


def probes(port: int, source: str, n: int) -> tuple[Counter[int], list[float]]:
    statuses: Counter[int] = Counter()
    took = []
    for _ in range(n):
        status, seconds = probe(port, source)
        statuses[status] += 1
        took.append(seconds)
    return statuses, took


def half_open(port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.connect(("127.0.0.1", port))
        try:
            s.sendall(PARTIAL_REQUEST)
        except OSError:
            pass  # already closed by the server
        socks.append(s)
    return socks


def still_open(socks: list[socket.socket]) -> int:
    sel = selectors.DefaultSelector()
    for s in socks:
        sel.register(s, selectors.EVENT_READ)
    ready = len(sel.select(timeout=0))
    sel.close()
    return len(socks) - ready


def quantiles(took: list[float]) -> str:
    q = statistics.quantiles(took, n=100, method="inclusive")
    return (
        f"p50 {q[49] * 1000:7.2f} ms  p99 {q[98] * 1000:7.2f} ms  "
        f"slowest {max(took) * 1000:7.2f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, default=1200)
    ap.add_argument("--probes", type=int, default=50)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="rlguard-slowloris-"))
    url = f"sqlite:///{work / 'rlguard.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLGUARD_")}
    env.update(
        RLGUARD_DEV="1",
        RLGUARD_DATA_DIR=str(work / "data"),
        RLGUARD_DATABASE_URL=url,
        PYTHONPATH=str(ROOT),
    )
    rlguard = str(Path(sys.executable).with_name("rlguard"))
    subprocess.run([rlguard, "db", "upgrade"], env=env, check=True, capture_output=True)
    port = free_port()
    log = (work / "server.log").open("wb")
    proc = subprocess.Popen(
        [rlguard, "server", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    socks: list[socket.socket] = []
    try:
        wait_ready(port, proc)
        idle_status, idle = probes(port, "127.0.0.2", args.probes)
        print(f"idle    /healthz from 127.0.0.2: {dict(idle_status)}  {quantiles(idle)}")

        started = time.perf_counter()
        socks = half_open(port, args.connections)
        opened = time.perf_counter() - started
        attack_status, attack = probes(port, "127.0.0.2", args.probes)
        same_status, same = probes(port, "127.0.0.1", args.probes)
        ready = probe(port, "127.0.0.2", "/readyz")[0]
        kept = still_open(socks)
        fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
        print(
            f"attack  {args.connections} half-open from 127.0.0.1 opened in {opened:.1f} s; "
            f"the server kept {kept}, closed {args.connections - kept}; its open fds: {fds}"
        )
        print(f"attack  /healthz from 127.0.0.2: {dict(attack_status)}  {quantiles(attack)}")
        print(f"attack  /healthz from 127.0.0.1: {dict(same_status)}  {quantiles(same)}")
        print(f"attack  /readyz from 127.0.0.2: {ready}")
        ratio = statistics.median(attack + same) / statistics.median(idle)
        print(f"ratio   attack/idle p50: {ratio:.2f}")

        started = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
            print(
                f"stop    SIGTERM under the attack: gone after {time.perf_counter() - started:.1f} s "
                f"(exit {proc.returncode})"
            )
        except subprocess.TimeoutExpired:
            print("stop    SIGTERM under the attack: still running after 60 s")
    finally:
        for s in socks:
            s.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


if __name__ == "__main__":
    main()
