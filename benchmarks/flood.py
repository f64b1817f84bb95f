"""One node token floods the server; another node's ingest, the server's memory and the policy
tick must not notice much (issue 41, item 2). Baseline: the same node's ingest in the same run,
in windows without the flood.

    .venv/bin/python benchmarks/flood.py                  # 60 s idle, 60 s of flood, alternating
    .venv/bin/python benchmarks/flood.py --seconds 8 --rounds 2   # smoke
    .venv/bin/python benchmarks/flood.py --database-url postgresql+psycopg://postgres@127.0.0.1/test

Starts ``uvicorn app.main:create_app_from_env`` (policy scheduler on, default quotas and rate
limits) on a fresh SQLite database (or the given one, migrated), then runs ``--rounds`` pairs
of alternating windows (pooled by kind):

* ``idle``: the calm node posts an 8-GPU agent batch (500 samples, 8 training processes)
  ``--calm-rate`` times a second; its request latency is the baseline;
* ``flood``: the same, while the flooding node posts as fast as its token's rate limit allows
  (``hardening.ingest_requests_per_second``) what it likes: 5,000 samples of new series
  (new metric names), 5,000 new GPU ids of one metric, and 240 exited processes of 15 new jobs,
  in turn; what the quotas refuse it is told (422, 429) and goes on.

Prints the calm node's p50/p99 of each kind (and each window's p99), the ratio flood/idle
(target <= 2.0), the server's RSS (idle, peak, end; target: peak under idle + ``--rss-bound-mib``), policy ticks
skipped (APScheduler's own warnings in the server's log; target 0), the flooder's answers by
status, the quota refusals and the incidents open, from ``/metrics``.
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing as mp
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.ingest import (  # noqa: E402
    free_port,
    make_body,
    process_cpu_seconds,
    wait_ready,
)

TS_PLACEHOLDER = b"1000000000.5"
# APScheduler's warnings when the tick job overran its interval (one instance at a time) or
# started too late: each is a tick that did not run on time, for every node.
SKIPPED_TICK = re.compile(r"(skipped: maximum number of running instances|was missed by)")
TICK_JOB = 'job "tick '


def calm_client(port: int, token: str, node: str, rate: float, stop_at: float, q: mp.Queue) -> None:
    """An ordinary agent: one batch every 1/rate s, 8 processes of one job reporting TRAIN."""
    prefix, suffix = make_body(node, f"agent-{node}")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    seq, latencies, errors = int(time.time() * 1000), [], Counter()
    next_at = time.perf_counter()
    while time.time() < stop_at:
        now = time.time()
        body = (prefix + str(seq).encode() + suffix).replace(TS_PLACEHOLDER, repr(now).encode())
        doc = orjson.loads(body)
        doc["participants"] = [
            {
                "job": "calm-job",
                "role": "trainer",
                "rank": r,
                "phase": "TRAIN",
                "step": 10,
                "ts": now,
            }
            for r in range(8)
        ]
        t0 = time.perf_counter()
        conn.request("POST", "/api/v1/ingest", orjson.dumps(doc), headers)
        resp = conn.getresponse()
        resp.read()
        latencies.append((now, time.perf_counter() - t0))
        if resp.status != 200:
            errors[resp.status] += 1
        seq += 1
        next_at += 1.0 / rate
        time.sleep(max(0.0, next_at - time.perf_counter()))
    q.put(("calm", latencies, dict(errors)))


def flood_bodies(node: str, i: int) -> dict:
    """The flooder's i-th batch: new series, new label values or new jobs, in turn."""
    now = time.time()
    doc: dict = {"agent_id": f"agent-{node}", "node": node, "seq": i, "sent_at": now}
    kind = i % 3
    if kind == 0:  # 5,000 new series: new metric names, 8 GPUs each
        doc["samples"] = [
            {"name": f"flood_m{i}_{m}", "value": 1.0, "ts": now, "labels": {"gpu": str(g)}}
            for m in range(625)
            for g in range(8)
        ]
    elif kind == 1:  # 5,000 new GPU ids of one metric
        doc["samples"] = [
            {
                "name": "gpu_utilization_ratio",
                "value": 0.5,
                "ts": now,
                "labels": {"gpu": f"{i}-{g}"},
            }
            for g in range(5000)
        ]
    else:  # 240 exited processes in 15 new jobs: an incident each, were it not for the budget
        doc["samples"] = []
        doc["participants"] = [
            {
                "job": f"flood-{i}-{j}",
                "role": "rollout",
                "rank": r,
                "phase": "EXITED",
                "step": 3,
                "ts": now,
            }
            for j in range(15)
            for r in range(16)
        ]
    return doc


I_PLACEHOLDER = 987654321  # stands for the batch number in a template (names, seq)


def flood_templates(node: str) -> list[tuple[bytes, bytes]]:
    """One serialized body per kind, made once: a request only replaces the batch number and
    the time in it (in C), so the flooding client spends its CPU on sending, not on building
    400 KB of JSON per request on the machine the server shares."""
    out = []
    for kind in range(3):
        doc = flood_bodies(node, I_PLACEHOLDER - (I_PLACEHOLDER % 3) + kind)
        text = orjson.dumps(doc).replace(repr(doc["sent_at"]).encode(), TS_PLACEHOLDER)
        number = str(I_PLACEHOLDER - (I_PLACEHOLDER % 3) + kind).encode()
        out.append((text, number))
    return out


def flood_client(port: int, token: str, node: str, rps: float, stop_at: float, q: mp.Queue) -> None:
    templates = flood_templates(node)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    answers: Counter = Counter()
    timed = []
    i = 0
    next_at = time.perf_counter()
    while time.time() < stop_at:
        text, number = templates[i % 3]
        now = time.time()
        body = text.replace(number, str(i).encode()).replace(TS_PLACEHOLDER, repr(now).encode())
        t0 = time.perf_counter()
        conn.request("POST", "/api/v1/ingest", body, headers)
        resp = conn.getresponse()
        resp.read()
        answers[resp.status] += 1
        timed.append((now, time.perf_counter() - t0, resp.status, i % 3))
        i += 1
        next_at += 1.0 / rps
        time.sleep(max(0.0, next_at - time.perf_counter()))
    q.put(("flood", timed, dict(answers)))


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def skipped_ticks(log: Path) -> int:
    text = log.read_text(errors="replace")
    return sum(1 for ln in text.splitlines() if TICK_JOB in ln and SKIPPED_TICK.search(ln))


def scrape(port: int) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name in ("rlguard_ingest_quota_refusals", "rlguard_incidents_open"):
            for s in fam.samples:
                if s.name.endswith("_created"):
                    continue
                tag = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[f"{fam.name}{{{tag}}}"] = s.value
    return out


def p99(sorted_values: list[float]) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * 0.99))]


FLOOD_KINDS = ("5,000 new series", "5,000 new GPU ids", "240 exited processes")


def _slowest(
    calm: list[tuple[float, float]], flood: list[tuple[float, float, int, int]], count: int = 4
) -> list[str]:
    """The calm node's slowest requests, each with the flooder's requests that were in the
    server at the same time (where a p99 comes from)."""
    out = []
    for start, took in sorted(calm, key=lambda x: -x[1])[:count]:
        beside = [
            f"{status} {FLOOD_KINDS[kind]} ({f_took * 1000:.0f} ms)"
            for f_start, f_took, status, kind in flood
            if f_start < start + took and start < f_start + f_took
        ]
        out.append(
            f"{took * 1000:.1f} ms; flooder's requests beside it: {', '.join(beside) or 'none'}"
        )
    return out


def window(
    port: int,
    server_pid: int,
    tokens: dict[str, str],
    args: argparse.Namespace,
    seconds: float,
    *,
    flood: bool,
) -> dict:
    """One window: the calm node alone, or beside the flooder. Raw figures; see ``summary``."""
    stop_at = time.time() + seconds
    q: mp.Queue = mp.Queue()
    procs = [
        mp.Process(
            target=calm_client, args=(port, tokens["calm"], "calm", args.calm_rate, stop_at, q)
        )
    ]
    if flood:
        procs.append(
            mp.Process(
                target=flood_client,
                args=(port, tokens["flood"], "flood", args.flood_rps, stop_at, q),
            )
        )
    cpu0, t0 = process_cpu_seconds(server_pid), time.monotonic()
    for p in procs:
        p.start()
    peak = rss_mib(server_pid)
    while any(p.is_alive() for p in procs) and time.time() < stop_at + 120:
        peak = max(peak, rss_mib(server_pid))
        time.sleep(0.25)
    cpu = process_cpu_seconds(server_pid) - cpu0
    results = {name: (lat, answers) for name, lat, answers in (q.get(timeout=120) for _ in procs)}
    for p in procs:
        p.join(30)
    return {
        "calm": results["calm"][0],
        "calm_errors": Counter(results["calm"][1]),
        "flood": results.get("flood", ([], {}))[0],
        "flood_answers": Counter(results.get("flood", ([], {}))[1]),
        "rss_peak_mib": peak,
        "cpu_s": cpu,
        "wall_s": time.monotonic() - t0,
    }


def summary(windows: list[dict]) -> dict:
    """The windows of one kind pooled: the calm node's latencies, the flooder's answers."""
    timed = [x for w in windows for x in w["calm"]]
    flood = [x for w in windows for x in w["flood"]]
    lat = sorted(x for _, x in timed)
    errors: Counter = Counter()
    answers: Counter = Counter()
    for w in windows:
        errors.update(w["calm_errors"])
        answers.update(w["flood_answers"])
    return {
        "slowest": _slowest(timed, flood),
        "p50_ms": statistics.median(lat) * 1000,
        "p99_ms": p99(lat) * 1000,
        "per_window_p99_ms": [p99(sorted(x for _, x in w["calm"])) * 1000 for w in windows],
        "requests": len(lat),
        "calm_errors": dict(errors),
        "flood_answers": answers,
        "rss_peak_mib": max(w["rss_peak_mib"] for w in windows),
        "server_busy": sum(w["cpu_s"] for w in windows) / sum(w["wall_s"] for w in windows),
    }


def _ms_list(values: list[float]) -> str:
    return ", ".join(f"{v:.1f}" for v in values) + " ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--seconds",
        type=float,
        default=60.0,
        help="idle seconds and flood seconds, each in all (split over --rounds)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=6,
        help="alternating idle and flood windows of seconds/rounds each",
    )
    ap.add_argument("--calm-rate", type=float, default=10.0, help="calm node's batches per second")
    ap.add_argument(
        "--flood-rps",
        type=float,
        default=19.0,
        help="flooder's requests per second (default: under the 20/s token limit)",
    )
    ap.add_argument(
        "--rss-bound-mib",
        type=float,
        default=256.0,
        help="the flood may add at most this much to the server's idle RSS",
    )
    ap.add_argument("--database-url", default=None)
    ap.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for the server, e.g. RLGUARD_NODE_QUOTAS__MAX_SERIES=2000",
    )
    args = ap.parse_args()

    from sqlmodel import Session

    from app.auth.tokens import create_node_token
    from app.core import migrate
    from app.core.db import make_engine

    with tempfile.TemporaryDirectory(prefix="rlguard-flood-") as tmp_dir:
        tmp = Path(tmp_dir)
        url = args.database_url or f"sqlite:///{tmp / 'rlguard.db'}"
        migrate.upgrade(url)
        engine = make_engine(url)
        run = os.getpid()
        tokens: dict[str, str] = {}
        with Session(engine) as s:
            for role in ("calm", "flood"):
                _t, plain = create_node_token(s, node=role, actor="benchmark")
                tokens[role] = plain
            s.commit()
        engine.dispose()
        port = free_port()
        log = tmp / "server.log"
        env = {
            **os.environ,
            "RLGUARD_DATABASE_URL": url,
            "RLGUARD_DATA_DIR": str(tmp),
            "RLGUARD_DEV": "1",
            "RLGUARD_LOG_LEVEL": "warning",
            **dict(item.split("=", 1) for item in args.server_env),
        }
        with log.open("wb") as log_file:
            server = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "app.main:create_app_from_env",
                    "--factory",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--no-access-log",
                    "--log-level",
                    "warning",
                ],
                env=env,
                cwd=ROOT,
                start_new_session=True,
                stdout=log_file,
                stderr=log_file,
            )
        try:
            wait_ready(port, server)
            print(f"== flood from one node token ({url.split(':', 1)[0]}, run {run})")
            print(
                f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs "
                "(latencies mean little when it is well above the CPU count)"
            )
            window(port, server.pid, tokens, args, 3.0, flood=False)  # the calm node's series exist
            idle_rss = rss_mib(server.pid)
            # Idle and flood windows alternate and each kind is pooled: this VM's own noise
            # drifts over a minute (an idle p99 moved between 6 and 42 ms from run to run), and
            # one idle minute then one flood minute compared two different hosts as often as
            # two different loads.
            windows: dict[bool, list[dict]] = {False: [], True: []}
            skipped = {False: 0, True: 0}
            for _ in range(args.rounds):
                for flooding in (False, True):
                    before = skipped_ticks(log)
                    windows[flooding].append(
                        window(
                            port,
                            server.pid,
                            tokens,
                            args,
                            args.seconds / args.rounds,
                            flood=flooding,
                        )
                    )
                    skipped[flooding] += skipped_ticks(log) - before
            idle, flood = summary(windows[False]), summary(windows[True])
            skipped_idle, skipped_flood = skipped[False], skipped[True]
            end_rss = rss_mib(server.pid)
            metrics = scrape(port)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
        ratio = flood["p99_ms"] / idle["p99_ms"]
        print(
            f"calm node, idle : p50 {idle['p50_ms']:.1f} ms, p99 {idle['p99_ms']:.1f} ms "
            f"({idle['requests']} requests, errors {idle['calm_errors'] or 0})"
        )
        print(
            f"calm node, flood: p50 {flood['p50_ms']:.1f} ms, p99 {flood['p99_ms']:.1f} ms "
            f"({flood['requests']} requests, errors {flood['calm_errors'] or 0})"
        )
        print(
            f"ratio p99 flood/idle: {ratio:.2f}x (target <= 2.0: "
            f"{'met' if ratio <= 2.0 else 'NOT met'})"
        )
        print(f"p99 per window, idle : {_ms_list(idle['per_window_p99_ms'])}")
        print(f"p99 per window, flood: {_ms_list(flood['per_window_p99_ms'])}")
        growth = flood["rss_peak_mib"] - idle_rss
        print(
            f"server RSS: idle {idle_rss:.0f} MiB, peak during flood {flood['rss_peak_mib']:.0f} "
            f"MiB, end {end_rss:.0f} MiB; growth {growth:.0f} MiB (bound {args.rss_bound_mib:g}: "
            f"{'met' if growth <= args.rss_bound_mib else 'NOT met'})"
        )
        print(
            f"server CPU (all threads, cores busy): idle {idle['server_busy']:.2f}, "
            f"flood {flood['server_busy']:.2f}"
        )
        print(f"policy ticks skipped: idle {skipped_idle}, flood {skipped_flood} (target 0)")
        print(f"flooder's answers: {dict(sorted(flood['flood_answers'].items()))}")
        for name, ph in (("idle", idle), ("flood", flood)):
            print(f"calm node's slowest requests, {name}:")
            for line in ph["slowest"]:
                print(f"  {line}")
        for name, value in sorted(metrics.items()):
            print(f"  {name} {value:g}")


if __name__ == "__main__":
    main()
