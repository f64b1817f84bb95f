"""Time from a restart request to the restarted process's first heartbeat, with and without a
warm standby (``rlguard launch --standby``).

For each way, one launcher runs ``benchmarks/_standby_script.py`` (imports torch, transformers
and trl, then reports TRAIN); ``--rounds`` times the script is killed with kill -9, the launcher
writes EXITED, and the benchmark asks for ``restart_role`` through the launcher hook, as RLGuard's
worker does. Measured per round: the hook call → the new process's first heartbeat of its own
(phase TRAIN, its pid). The cold way starts Python and imports everything again; the warm way
hands the command to a standby that imported them ahead (``--preload torch,transformers,trl``)
and runs the script in-process. Prints the median of each way and warm / cold.

    .venv/bin/python benchmarks/launch_standby.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "_standby_script.py"
sys.path.insert(0, str(ROOT))

from recovery.report import heartbeat_path, read_heartbeat  # noqa: E402
from recovery.supervision.events import read_events  # noqa: E402


def _beat(run_dir: Path) -> dict[str, Any]:
    return read_heartbeat(heartbeat_path(run_dir, "trainer", 0)) or {}


def _wait(pred: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.01)


def _preload() -> str:
    import importlib.util

    return ",".join(m for m in ("torch", "transformers", "trl") if importlib.util.find_spec(m))


def run_way(workdir: Path, warm: bool, rounds: int) -> list[float]:
    run_dir = workdir / ("warm" if warm else "cold")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_DISABLE_TELEMETRY": "1"}
    extra = ["--standby", "--preload", _preload()] if warm else []
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "integrations.launch",
            "--run-dir",
            str(run_dir),
            "--role",
            "trainer",
            "--backoff",
            "0",
            *extra,
            "--",
            sys.executable,
            str(SCRIPT),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    times = []
    try:
        for r in range(rounds):
            _wait(lambda: _beat(run_dir).get("phase") == "TRAIN", 300, "the script to train")
            if warm:
                _wait(
                    lambda r=r: (
                        len(
                            [
                                e
                                for e in read_events(run_dir / "events.jsonl")
                                if e["kind"] == "standby_ready"
                            ]
                        )
                        > r
                    ),
                    300,
                    "a warm standby",
                )
            os.kill(int(_beat(run_dir)["pid"]), signal.SIGKILL)
            _wait(lambda: _beat(run_dir).get("phase") == "EXITED", 30, "the exit")
            asked = time.monotonic()
            hook = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "integrations.launch",
                    "hook",
                    "restart_role",
                    "--job",
                    run_dir.name,
                    "--run-root",
                    str(workdir),
                    "--role",
                    "trainer",
                    "--idempotency-key",
                    f"bench/{r}",
                ],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            )
            if not json.loads(hook.stdout)["ok"]:
                raise SystemExit(f"the launcher refused the restart: {hook.stdout}")
            pid = _spawned_pid(run_dir, r + 2)
            _wait(
                lambda pid=pid: (
                    _beat(run_dir).get("pid") == pid and _beat(run_dir).get("phase") == "TRAIN"
                ),
                300,
                "the restarted script's first heartbeat",
            )
            times.append(time.monotonic() - asked)
            print(f"  {'warm' if warm else 'cold'} round {r + 1}: {times[-1]:.2f} s", flush=True)
        (run_dir / "stop").touch()
        launcher.wait(60)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait(10)
    return times


def _spawned_pid(run_dir: Path, start: int) -> int:
    spawns = [e for e in read_events(run_dir / "events.jsonl") if e["kind"] == "spawn"]
    return int(spawns[start - 1]["child_pid"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    print(f"preloaded by the standby: {_preload() or '(none installed)'}")
    with tempfile.TemporaryDirectory(prefix="rlguard-standby-") as tmp:
        cold = run_way(Path(tmp), warm=False, rounds=args.rounds)
        warm = run_way(Path(tmp), warm=True, rounds=args.rounds)
    c, w = statistics.median(cold), statistics.median(warm)
    print(
        f"restart request -> first heartbeat, median of {args.rounds}: "
        f"cold {c:.2f} s, warm standby {w:.2f} s, warm / cold = {w / c:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
