"""Node-agent overhead: CPU seconds per minute and RSS of the agent at 1 Hz with 8 simulated GPUs and
64 heartbeat files, against a baseline measured in the same run.

    .venv/bin/python benchmarks/agent_overhead.py                  # 60 s measurement (default)
    .venv/bin/python benchmarks/agent_overhead.py --duration 15    # quick smoke run
    .venv/bin/python benchmarks/agent_overhead.py --real-gpus      # on a GPU machine: real NVML
    .venv/bin/python benchmarks/agent_overhead.py --dump-real-nvml # one real collector round

Three processes run side by side for the same wall-clock window:

- the agent (``python -m agents --simulate-gpus 8 --interval 1``), delivering to a local HTTP sink
  that answers like the ingest endpoint (the sink's own cost is not the agent's, so it is not the
  real server);
- the baseline: the same collectors (simulated NVML with 8 GPUs, the heartbeat/state-log reader)
  in a 1 Hz loop that only samples: no spool, no HTTP;
- a writer that rewrites the 64 heartbeat files every 2 s through ``HeartbeatReporter`` (like 64
  training processes) and appends to ``state_log.jsonl``.

CPU time is read from ``/proc/<pid>/stat`` (utime + stime) after a warm-up, RSS from
``/proc/<pid>/status`` (VmRSS at the end, VmHWM as the peak). Targets (issue 6): the agent under
2 % of one core (1.2 CPU s per minute) and under 80 MB RSS.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def rss_mb(pid: int) -> tuple[float, float]:
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


# -- helper processes (this file re-executes itself with a role) ------------------------------


def run_sink(port_file: Path) -> None:
    class Sink(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            answer = json.dumps({"accepted": body.count(b'"name"'), "duplicate": False}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    port_file.write_text(str(server.server_address[1]))
    server.serve_forever()


def run_writer(run_dir: Path, files: int) -> None:
    sys.path.insert(0, str(REPO))
    from recovery.report import HeartbeatReporter

    reporters = [
        HeartbeatReporter(
            run_dir, "rollout" if i % 2 else "trainer", i // 2, job="bench", interval=2.0
        )
        for i in range(files)
    ]
    step = 0
    log_path = run_dir / "state_log.jsonl"
    while True:
        step += 1
        for i, rep in enumerate(reporters):
            rep.update(
                phase="ROLLOUT", step=step, tokens=step * 1000 + i, pending=i % 7, scheduled=10
            )
        with log_path.open("a") as f:
            f.write(
                json.dumps({"ts": time.time(), "state": "ROLLOUT", "payload": {"step": step}})
                + "\n"
            )
        time.sleep(2.0)


def run_baseline(run_dir: Path, gpus: int, interval: float) -> None:
    sys.path.insert(0, str(REPO))
    from agents.collectors.job import JobCollector
    from agents.collectors.nvml import NvmlCollector
    from agents.fake_nvml import FakeNVML

    if gpus > 0:
        nvml = NvmlCollector(FakeNVML(gpus), simulated=True)
    else:
        import pynvml

        nvml = NvmlCollector(pynvml)
    nvml.start()
    jobs = JobCollector(run_dir)
    next_round = time.monotonic()
    while True:
        samples = nvml.collect()
        job_samples, _participants = jobs.collect()
        samples.extend(job_samples)
        next_round += interval
        time.sleep(max(0.0, next_round - time.monotonic()))


# -- the measurement ---------------------------------------------------------------------------


def dump_real_nvml() -> None:
    """One round of the NVML collector against this machine's real GPUs (the device check)."""
    sys.path.insert(0, str(REPO))
    import pynvml

    from agents.collectors.nvml import NvmlCollector

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    col = NvmlCollector(pynvml)
    if not col.start():
        print(f"NVML unavailable: {col.unavailable_reason}")
        return
    print(f"driver: {col.driver_versions()}; GPUs: {col.gpu_count}")
    col.collect()
    start = time.perf_counter()
    samples = col.collect()
    took = time.perf_counter() - start
    for s in sorted(samples, key=lambda s: (s["labels"].get("gpu", ""), s["name"])):
        labels = ",".join(f"{k}={v}" for k, v in sorted(s["labels"].items()))
        print(f"{s['name']:<40} {labels:<60} {s['value']:g}")
    print(f"{len(samples)} samples in {took * 1000:.2f} ms (second round)")
    col.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--duration", type=float, default=60.0, help="measured seconds (default 60)"
    )
    parser.add_argument(
        "--warmup", type=float, default=5.0, help="seconds before measuring (default 5)"
    )
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--heartbeats", type=int, default=64)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument(
        "--real-gpus",
        action="store_true",
        help="use this machine's NVML instead of simulated GPUs (agent and baseline)",
    )
    parser.add_argument(
        "--dump-real-nvml",
        action="store_true",
        help="print one round of the NVML collector on the real GPUs and exit",
    )
    parser.add_argument("--role", choices=["sink", "writer", "baseline"], help=argparse.SUPPRESS)
    parser.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dump_real_nvml:
        return dump_real_nvml()
    gpus = 0 if args.real_gpus else args.gpus
    if args.role == "sink":
        return run_sink(args.dir)
    if args.role == "writer":
        return run_writer(args.dir, args.heartbeats)
    if args.role == "baseline":
        return run_baseline(args.dir, gpus, args.interval)

    me = [sys.executable, str(Path(__file__).resolve())]
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="rlguard-agent-bench-") as tmp:
        root = Path(tmp)
        run_dir = root / "run"
        run_dir.mkdir()
        port_file = root / "port"
        try:
            procs.append(subprocess.Popen([*me, "--role", "sink", "--dir", str(port_file)]))
            procs.append(
                subprocess.Popen(
                    [
                        *me,
                        "--role",
                        "writer",
                        "--dir",
                        str(run_dir),
                        "--heartbeats",
                        str(args.heartbeats),
                    ]
                )
            )
            deadline = time.monotonic() + 30
            while not port_file.exists() or not port_file.read_text():
                if time.monotonic() > deadline:
                    raise SystemExit("the HTTP sink did not start")
                time.sleep(0.05)
            url = f"http://127.0.0.1:{port_file.read_text()}"
            agent = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "agents",
                    "--server",
                    url,
                    "--token",
                    "bench",
                    "--node",
                    "bench-node",
                    "--run-dir",
                    str(run_dir),
                    "--spool-dir",
                    str(root / "spool"),
                    "--simulate-gpus",
                    str(gpus),
                    "--interval",
                    str(args.interval),
                    "--log-level",
                    "WARNING",
                ],
                cwd=REPO,
            )
            procs.append(agent)
            baseline = subprocess.Popen(
                [
                    *me,
                    "--role",
                    "baseline",
                    "--dir",
                    str(run_dir),
                    "--gpus",
                    str(gpus),
                    "--interval",
                    str(args.interval),
                ]
            )
            procs.append(baseline)
            time.sleep(args.warmup)
            for p in procs:
                if p.poll() is not None:
                    raise SystemExit(f"a benchmark process exited early: {p.args}")
            start_wall = time.monotonic()
            start = {p.pid: cpu_seconds(p.pid) for p in (agent, baseline)}
            time.sleep(args.duration)
            wall = time.monotonic() - start_wall
            used = {p.pid: cpu_seconds(p.pid) - start[p.pid] for p in (agent, baseline)}
            rss = {p.pid: rss_mb(p.pid) for p in (agent, baseline)}
            status = json.loads((root / "spool" / "status.json").read_text())
        finally:
            # the agent first (its last delivery needs the sink), then the helpers
            for p in sorted(procs, key=lambda p: p.args[1:3] != ["-m", "agents"]):
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
                    if p.args[1:3] == ["-m", "agents"]:
                        try:
                            p.wait(10)
                        except subprocess.TimeoutExpired:
                            p.kill()
            for p in reversed(procs):
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)

    per_min = {pid: cpu / wall * 60 for pid, cpu in used.items()}
    a, b = agent.pid, baseline.pid
    print(
        f"agent overhead: {'real NVML GPUs' if args.real_gpus else f'{gpus} simulated GPUs'}, "
        f"{args.heartbeats} heartbeat files, "
        f"interval {args.interval} s, measured {wall:.1f} s after {args.warmup:.0f} s warm-up"
    )
    print(f"{'':28}{'CPU s/min':>10}{'% of a core':>13}{'RSS MB':>9}{'peak RSS MB':>13}")
    print(
        f"{'agent (sample+spool+send)':28}{per_min[a]:>10.3f}{per_min[a] / 60 * 100:>12.2f}%"
        f"{rss[a][0]:>9.1f}{rss[a][1]:>13.1f}"
    )
    print(
        f"{'baseline (sampling only)':28}{per_min[b]:>10.3f}{per_min[b] / 60 * 100:>12.2f}%"
        f"{rss[b][0]:>9.1f}{rss[b][1]:>13.1f}"
    )
    ratio = per_min[a] / per_min[b] if per_min[b] > 0 else float("inf")
    print(f"ratio agent/baseline: CPU {ratio:.2f}x, RSS {rss[a][0] / rss[b][0]:.2f}x")
    print(
        f"agent delivered {status['batches_sent']} batches, {status['acked_samples']} samples; "
        f"spool now {status['spool_batches']} batch(es); dropped {status['dropped']}"
    )
    cpu_ok = per_min[a] / 60 * 100 < 2.0
    rss_ok = rss[a][1] < 80.0
    print(
        f"target CPU < 2 % of one core: {'PASS' if cpu_ok else 'FAIL'}; "
        f"target RSS < 80 MB: {'PASS' if rss_ok else 'FAIL'}"
    )


if __name__ == "__main__":
    main()
