"""Node-agent overhead: CPU seconds per minute and RSS of the agent at 1 Hz with 8 simulated GPUs and
64 heartbeat files, against a baseline measured in the same run.

    .venv/bin/python benchmarks/agent_overhead.py                  # 60 s measurement (default)
    .venv/bin/python benchmarks/agent_overhead.py --duration 15    # quick smoke run
    .venv/bin/python benchmarks/agent_overhead.py --real-gpus      # on a GPU machine: real NVML
    .venv/bin/python benchmarks/agent_overhead.py --dump-real-nvml # one real collector round
    .venv/bin/python benchmarks/agent_overhead.py --gpu-source dcgm-exporter --engines 2

Three processes run side by side for the same wall-clock window:

- the agent (``python -m agents --simulate-gpus 8 --interval 1``), delivering to a local HTTP sink
  that answers like the ingest endpoint (the sink's own cost is not the agent's, so it is not the
  real server);
- the baseline: the same collectors (simulated NVML with 8 GPUs, the heartbeat/state-log reader)
  in a 1 Hz loop that only samples: no spool, no HTTP;
- a writer that rewrites the 64 heartbeat files every 2 s through ``HeartbeatReporter`` (like 64
  training processes) and appends to ``state_log.jsonl``.

With ``--gpu-source dcgm-exporter`` the GPUs come from a local HTTP server serving a
dcgm-exporter 4.5.3-4.8.2 page for ``--gpus`` GPUs (the recorded page of the tests, repeated per
GPU) and the agent scrapes it every round instead of calling NVML; ``--engines 1|2`` adds a vLLM
and an SGLang engine (recorded pages, ``/health`` and ``/metrics``) probed and scraped every
round. The baseline then runs the same scraping collectors.

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


EXPOSITIONS = REPO / "tests" / "unit" / "agents" / "collectors" / "expositions"
ENGINE_KINDS = ("vllm", "sglang")


def dcgm_page(gpus: int) -> str:
    """The recorded dcgm-exporter page, its GPU 0 lines repeated for ``gpus`` GPUs."""
    out: list[str] = []
    for line in (EXPOSITIONS / "dcgm_exporter_4.5.3-4.8.2.txt").read_text().splitlines():
        if line.startswith("#"):
            out.append(line)
        elif 'gpu="0",' in line:
            for i in range(gpus):
                out.append(
                    line.replace('gpu="0",', f'gpu="{i}",')
                    .replace('device="nvidia0"', f'device="nvidia{i}"')
                    .replace("2f1c3b4d5e60", f"2f1c3b4d{i:04x}")
                )
    return "\n".join(out) + "\n"


def run_pages(port_file: Path, gpus: int) -> None:
    pages = {"/dcgm/metrics": dcgm_page(gpus).encode()}
    for kind in ENGINE_KINDS:
        pages[f"/{kind}/health"] = b""
        pages[f"/{kind}/metrics"] = (EXPOSITIONS / f"{kind}.txt").read_bytes()

    class Pages(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = pages.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("content-type", "text/plain; version=0.0.4")
            self.send_header("content-length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Pages)
    port_file.write_text(str(server.server_address[1]))
    server.serve_forever()


def engine_specs(pages_url: str, engines: int) -> list[str]:
    """The ``--engine`` values for the first ``engines`` engines of the pages server."""
    return [
        f"{kind}={pages_url}/{kind},role=rollout,rank={rank}"
        for rank, kind in enumerate(ENGINE_KINDS[:engines])
    ]


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


def run_baseline(
    run_dir: Path, gpus: int, interval: float, pages_url: str | None, dcgm: bool, engines: int
) -> None:
    sys.path.insert(0, str(REPO))
    from agents.collectors.dcgm import DcgmExporterCollector
    from agents.collectors.engines import EngineCollector, EngineSpec
    from agents.collectors.job import JobCollector
    from agents.collectors.nvml import NvmlCollector
    from agents.fake_nvml import FakeNVML

    gpu_source: NvmlCollector | DcgmExporterCollector
    if dcgm and pages_url is not None:
        gpu_source = DcgmExporterCollector(f"{pages_url}/dcgm/metrics")
    elif gpus > 0:
        gpu_source = NvmlCollector(FakeNVML(gpus), simulated=True)
    else:
        import pynvml

        gpu_source = NvmlCollector(pynvml)
    gpu_source.start()
    specs = engine_specs(pages_url, engines) if pages_url is not None else []
    engine_collector = EngineCollector([EngineSpec.parse(s) for s in specs], default_job="bench")
    jobs = JobCollector(run_dir)
    next_round = time.monotonic()
    while True:
        samples = gpu_source.collect()
        job_samples, _participants = jobs.collect()
        samples.extend(job_samples)
        samples.extend(engine_collector.collect())
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
    parser.add_argument(
        "--gpu-source",
        choices=["simulated", "dcgm-exporter"],
        default="simulated",
        help="simulated NVML (default) or a local dcgm-exporter page with --gpus GPUs",
    )
    parser.add_argument(
        "--engines",
        type=int,
        choices=[0, 1, 2],
        default=0,
        help="inference engines (vLLM, then SGLang) the agent probes and scrapes (default 0)",
    )
    parser.add_argument(
        "--role", choices=["sink", "writer", "baseline", "pages"], help=argparse.SUPPRESS
    )
    parser.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--pages-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dump_real_nvml:
        return dump_real_nvml()
    gpus = 0 if args.real_gpus else args.gpus
    if args.role == "sink":
        return run_sink(args.dir)
    if args.role == "writer":
        return run_writer(args.dir, args.heartbeats)
    if args.role == "baseline":
        dcgm = args.gpu_source == "dcgm-exporter"
        return run_baseline(args.dir, gpus, args.interval, args.pages_url, dcgm, args.engines)
    if args.role == "pages":
        return run_pages(args.dir, args.gpus)
    scraped = args.gpu_source == "dcgm-exporter" or args.engines > 0

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
            pages_url: str | None = None
            if scraped:
                pages_file = root / "pages-port"
                procs.append(
                    subprocess.Popen(
                        [*me, "--role", "pages", "--dir", str(pages_file), "--gpus", str(gpus)]
                    )
                )
                while not pages_file.exists() or not pages_file.read_text():
                    if time.monotonic() > deadline:
                        raise SystemExit("the pages server did not start")
                    time.sleep(0.05)
                pages_url = f"http://127.0.0.1:{pages_file.read_text()}"
            if args.gpu_source == "dcgm-exporter":
                gpu_args = [
                    "--gpu-source",
                    "dcgm-exporter",
                    "--dcgm-url",
                    f"{pages_url}/dcgm/metrics",
                ]
            else:
                gpu_args = ["--simulate-gpus", str(gpus)]
            for spec in engine_specs(pages_url, args.engines) if pages_url else []:
                gpu_args += ["--engine", spec]
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
                    *gpu_args,
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
                    "--engines",
                    str(args.engines),
                    "--gpu-source",
                    args.gpu_source,
                    *(["--pages-url", pages_url] if pages_url else []),
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
    if args.gpu_source == "dcgm-exporter":
        source = f"{gpus} GPUs scraped from a dcgm-exporter page"
    else:
        source = "real NVML GPUs" if args.real_gpus else f"{gpus} simulated GPUs"
    print(
        f"agent overhead: {source}, {args.engines} inference engine(s) scraped, "
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
