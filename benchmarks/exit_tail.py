"""Exit causes cost the job nothing: a child writing as fast as it can, and the launcher's memory.

    .venv/bin/python benchmarks/exit_tail.py                 # 100 MB, 3 rounds each
    .venv/bin/python benchmarks/exit_tail.py --mb 10 --rounds 1   # smoke run

A child process writes ``--mb`` MB of log lines to its stdout as fast as it can, timing itself,
then fails with PyTorch's CUDA OOM message. Two ways, alternating, ``--rounds`` times each:

* baseline: the child started by this script with its stdout and stderr appended to a file
  (what any launcher that logs to a file does, RLGuard's before exit causes);
* rlguard: the same child under ``rlguard launch`` (``python -m integrations.launch``) with the
  exit-cause catalogue: its output goes to its log file, and when it fails the launcher reads
  the bounded tail and matches it.

Prints the child's own throughput in each (median MB/s) and their ratio (target: rlguard >=
0.95 x baseline, i.e. not slowed by more than 5 %), the cause the launcher found, and the
launcher's peak memory (VmHWM) after a child printed ``--mb`` MB against one that printed
1 MB (target: flat, the difference under 8 MB: the tail is a 64 KiB window, never the log).
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
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = textwrap.dedent(
    """
    import os, sys, time
    total = int(sys.argv[1]); out = sys.argv[2]
    line = b"INFO step metrics: loss=0.4213 reward=0.118 kl=0.0021 lr=1e-06 tokens=65536\\n"
    chunk = line * 512
    t0 = time.perf_counter(); written = 0
    while written < total:
        os.write(1, chunk); written += len(chunk)
    dt = time.perf_counter() - t0
    with open(out, "w") as f:
        f.write(str(written / dt / 1e6))
    sys.stderr.write("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\\n")
    sys.exit(1)
    """
)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLGUARD_")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def baseline(work: Path, nbytes: int) -> float:
    script, result = work / "child.py", work / "base.mbps"
    with open(work / "base.log", "ab") as log:
        subprocess.run(
            [sys.executable, str(script), str(nbytes), str(result)],
            stdout=log,
            stderr=log,
            check=False,
            timeout=600,
        )
    return float(result.read_text())


def _vm_hwm_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def under_launcher(work: Path, nbytes: int, name: str) -> tuple[float, int, str | None]:
    """(child MB/s, launcher VmHWM in kB once it handled the exit, the cause it found)."""
    script, result, run_dir = work / "child.py", work / f"{name}.mbps", work / name
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "integrations.launch",
            "--run-dir",
            str(run_dir),
            "--role",
            "trainer",
            "--",
            sys.executable,
            str(script),
            str(nbytes),
            str(result),
        ],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    beat = run_dir / "heartbeat" / "trainer-0.json"
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            events = run_dir / "events.jsonl"
            if events.exists() and '"child_exit"' in events.read_text():
                break
            if proc.poll() is not None:
                raise RuntimeError(f"launcher exited {proc.returncode}")
            time.sleep(0.05)
        hwm = _vm_hwm_kb(proc.pid)
        cause = json.loads(beat.read_text()).get("exit_cause", {}).get("cause")
        return float(result.read_text()), hwm, cause
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    nbytes = args.mb * 1024 * 1024
    with tempfile.TemporaryDirectory(prefix="rlguard-exit-tail-") as tmp:
        work = Path(tmp)
        (work / "child.py").write_text(CHILD)
        base, ours, causes = [], [], set()
        for i in range(args.rounds):
            base.append(baseline(work, nbytes))
            mbps, _, cause = under_launcher(work, nbytes, f"run{i}")
            ours.append(mbps)
            causes.add(cause)
        _, small, _ = under_launcher(work, 1024 * 1024, "small")
        _, big, _ = under_launcher(work, nbytes, "big")
    b, o = statistics.median(base), statistics.median(ours)
    print(
        f"child throughput, baseline (stdout to a file): median {b:,.0f} MB/s "
        f"({', '.join(f'{x:,.0f}' for x in base)})"
    )
    print(
        f"child throughput, under rlguard launch:        median {o:,.0f} MB/s "
        f"({', '.join(f'{x:,.0f}' for x in ours)})"
    )
    print(f"ratio rlguard / baseline: {o / b:.3f} (target >= 0.95)")
    print(f"cause found: {sorted(str(c) for c in causes)}")
    print(
        f"launcher peak memory (VmHWM): {small / 1024:.1f} MiB after 1 MB of child output, "
        f"{big / 1024:.1f} MiB after {args.mb} MB (difference {(big - small) / 1024:+.1f} MiB; "
        f"target under 8 MiB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
