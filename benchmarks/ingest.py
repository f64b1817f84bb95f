"""Ingest throughput and latency against a real uvicorn server, with a baseline in the same run.

    .venv/bin/python benchmarks/ingest.py                 # 4 clients, 2 rounds of 8 s per endpoint
    .venv/bin/python benchmarks/ingest.py --clients 8 --seconds 20 --rounds 3
    .venv/bin/python benchmarks/ingest.py --postgres postgresql+psycopg://postgres@127.0.0.1/postgres
    .venv/bin/python benchmarks/ingest.py --database-url postgresql+psycopg://postgres@127.0.0.1/test
    .venv/bin/python benchmarks/ingest.py --database-url postgresql+psycopg://... \
        --redis-url redis://127.0.0.1:6379/0          # also the shared (Redis) window mode

Starts ``uvicorn app.main:create_app_from_env`` in a subprocess on a fresh SQLite database (or the
given one, which must be empty or migrated), with the bench-only baseline endpoint enabled. N
client processes (one node and agent each) post 500-sample batches over keep-alive connections
for a bounded time, alternating rounds between:

* ``baseline``: ``POST /bench/baseline-ingest``: only ``orjson.loads`` + ``list.extend`` (the
  framework's ceiling), and
* ``ingest``: ``POST /api/v1/ingest``: token check, validation, dedupe, series store, durable
  group commit.

Prints samples/s and p50/p99 request latency for each and the ratio ingest/baseline, per
backend, and the server's CPU time per request (user + system, every thread, from
``/proc/<pid>/stat``) with how busy it kept a core: when the server is busy 1.00 in both phases,
the ratio is the inverse of the CPU-per-request ratio, and that figure swings less with other
load on a shared machine than the throughput does. Targets (issue 24): SQLite ratio >= 1.0 and
ingest p99 <= 25 ms at 4 clients; PostgreSQL (``--postgres``: a fresh database on that server, in
the same run) ratio >= 0.7 (docs/performance.md says why this design does not reach them).

With ``--redis-url``, a second server on the same database runs with the shared window
(``RLGUARD_SERIES__SHARED_WINDOW=true``: a Redis claim per batch, one pipelined stream append per
commit group) and its own agents; its ``ingest-redis`` rounds alternate with the others, and the
ratio ingest-redis/ingest (the in-memory window of the same run) is printed.
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing as mp
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

METRICS_PER_GPU = 62  # x 8 GPUs = 496 samples, + 4 node-level = 500


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


TS_PLACEHOLDER = b"1000000000.5"


def make_body(node: str, agent: str) -> tuple[bytes, bytes]:
    """(prefix, suffix); a request body is prefix + seq + suffix with the placeholder timestamps
    replaced by the current time, so every series sees increasing timestamps, as from an agent."""
    samples = [
        {
            "name": f"gpu_metric_{m}",
            "value": float(m * 1.5 + g),
            "ts": 1000000000.5,
            "labels": {"gpu": str(g)},
        }
        for g in range(8)
        for m in range(METRICS_PER_GPU)
    ]
    samples += [
        {"name": f"node_metric_{i}", "value": float(i), "ts": 1000000000.5, "labels": {}}
        for i in range(4)
    ]
    assert len(samples) == 500
    doc = orjson.dumps(
        {"agent_id": agent, "node": node, "seq": 0, "sent_at": 1000000000.5, "samples": samples}
    )
    assert doc.count(TS_PLACEHOLDER) == 501
    prefix, _, suffix = doc.partition(b'"seq":0,')
    return prefix + b'"seq":', b"," + suffix


def client(
    port: int, path: str, token: str, node: str, seconds: float, seq0: int, queue: mp.Queue
) -> None:
    prefix, suffix = make_body(node, f"agent-{node}")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    latencies: list[float] = []
    samples = 0
    errors = 0
    seq = seq0
    deadline = time.perf_counter() + seconds
    started = time.perf_counter()
    while time.perf_counter() < deadline:
        now = repr(time.time()).encode()
        body = (prefix + str(seq).encode() + suffix).replace(TS_PLACEHOLDER, now)
        t0 = time.perf_counter()
        conn.request("POST", path, body, headers)
        resp = conn.getresponse()
        data = resp.read()
        latencies.append(time.perf_counter() - t0)
        if resp.status == 200:
            samples += orjson.loads(data)["accepted"]
        else:
            errors += 1
        seq += 1
    elapsed = time.perf_counter() - started
    conn.close()
    queue.put((node, latencies, samples, errors, elapsed, seq))


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid``, every thread of it (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_phase(
    port: int,
    path: str,
    tokens: list[tuple[str, str]],
    seconds: float,
    seqs: list[int],
    server_pid: int | None = None,
) -> dict:
    queue: mp.Queue = mp.Queue()
    cpu0 = process_cpu_seconds(server_pid) if server_pid else 0.0
    procs = [
        mp.Process(target=client, args=(port, path, tok, node, seconds, seqs[i], queue))
        for i, (node, tok) in enumerate(tokens)
    ]
    for p in procs:
        p.start()
    results = [queue.get(timeout=seconds + 120) for _ in procs]
    server_cpu = process_cpu_seconds(server_pid) - cpu0 if server_pid else float("nan")
    for p in procs:
        p.join(30)
    final_seq = {r[0]: r[5] for r in results}
    lat = sorted(x for r in results for x in r[1])
    samples = sum(r[2] for r in results)
    errors = sum(r[3] for r in results)
    elapsed = max(r[4] for r in results)
    next_seqs = [final_seq[node] for node, _tok in tokens]
    return {
        "samples_per_s": samples / elapsed,
        "requests": len(lat),
        "errors": errors,
        "p50_ms": statistics.median(lat) * 1000 if lat else float("nan"),
        "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000 if lat else float("nan"),
        "latencies": lat,
        "next_seqs": next_seqs,
        "server_cpu_s": server_cpu,
        "elapsed_s": elapsed,
    }


def server_metrics(port: int) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith("rlguard_ingest_commit"):
            continue
        for s in fam.samples:
            if not s.labels:
                out[s.name] = s.value
            elif set(s.labels) == {"path"}:  # rlguard_ingest_commits_total{path=inline|loop|thread}
                out[f"{s.name}_{s.labels['path']}"] = s.value
    return out


def forget_baseline(port: int) -> None:
    """Empty the baseline's sink: the next rounds must not carry its heap (bench.py)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/bench/forget-baseline")
    status = conn.getresponse().status
    conn.close()
    if status != 204:
        raise SystemExit(f"/bench/forget-baseline answered {status}")


def wait_ready(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("server did not become ready")


def start_server(port: int, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
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
    )


# What issue 24 asks of each backend: the ratio against the baseline of the same run, and (SQLite)
# the ingest p99 at 4 clients.
TARGETS = {"sqlite": (1.0, 25.0), "postgresql": (0.7, None)}


def create_pg_database(server_url: str) -> str:
    """A fresh database on the PostgreSQL server of ``server_url``; its URL."""
    import uuid

    import sqlalchemy as sa

    name = f"rlguard_bench_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()
    return f"{server_url.rpartition('/')[0]}/{name}"


def drop_pg_database(server_url: str, url: str) -> None:
    import sqlalchemy as sa

    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(
                sa.text(f'DROP DATABASE IF EXISTS "{url.rpartition("/")[2]}" WITH (FORCE)')
            )
    finally:
        admin.dispose()


def measure(url: str, args: argparse.Namespace, tmp: Path) -> tuple[float, float]:
    """One backend: a server on ``url``, baseline and ingest rounds alternating; prints the
    figures and returns (ratio ingest/baseline, ingest p99 ms)."""
    from sqlmodel import Session

    from app.auth.tokens import create_node_token
    from app.core import migrate
    from app.core.db import make_engine

    migrate.upgrade(url)
    engine = make_engine(url)
    run_id = os.getpid()
    tokens = []
    shared_tokens = []
    with Session(engine) as s:
        for i in range(args.clients):
            node = f"bench-{run_id}-{i}"
            _t, plain = create_node_token(s, node=node, actor="benchmark")
            tokens.append((node, plain))
            if args.redis_url:
                node = f"bench-{run_id}-shared-{i}"
                _t, plain = create_node_token(s, node=node, actor="benchmark")
                shared_tokens.append((node, plain))
        s.commit()
    engine.dispose()

    port = free_port()
    env = {
        **os.environ,
        "RLGUARD_DATABASE_URL": url,
        "RLGUARD_DATA_DIR": str(tmp),
        "RLGUARD_DEV": "1",
        "RLGUARD_BENCH_ENDPOINTS": "1",
        "RLGUARD_LOG_LEVEL": "warning",
        "RLGUARD_SQLITE_SYNCHRONOUS": args.sqlite_synchronous,
        # The clients post as fast as they can; the per-token rate limit (20/s) would measure
        # the limiter, not the ingest path.
        "RLGUARD_HARDENING__INGEST_REQUESTS_PER_SECOND": "1000000",
        "RLGUARD_HARDENING__INGEST_BURST": "1000000",
        # Likewise each node's share of the loop's CPU time (app/ingest/cpu_share.py: 2% of a
        # core by default): a client posting back to back is in debt after ~100 batches and
        # gets 429s (on a quiet machine; a loaded one sent too few to notice, so the smoke test
        # passed in CI and failed on a quiet host). One whole core: the loop never owes.
        "RLGUARD_NODE_QUOTAS__INGEST_CPU_SHARE": "1",
        "RLGUARD_NODE_QUOTAS__INGEST_CPU_BURST_SECONDS": "10",
    }
    server = start_server(port, env)
    shared: subprocess.Popen | None = None
    shared_port = free_port()
    if args.redis_url:
        shared = start_server(
            shared_port,
            {**env, "RLGUARD_REDIS_URL": args.redis_url, "RLGUARD_SERIES__SHARED_WINDOW": "true"},
        )
    try:
        wait_ready(port, server)
        if shared is not None:
            wait_ready(shared_port, shared)
        backend = url.split(":", 1)[0].split("+", 1)[0]
        described = backend
        if backend == "sqlite":
            described += f" (synchronous={args.sqlite_synchronous})"
        load = os.getloadavg()[0]
        print(f"== {backend}")
        print(
            f"load average before: {load:.2f} on {os.cpu_count()} CPUs "
            "(latencies mean little when it is well above the CPU count)"
        )
        print(
            f"server: uvicorn, 1 process, {described}; {args.clients} clients x 500-sample "
            f"batches; {args.rounds} rounds x {args.seconds:g} s per endpoint"
        )
        run_phase(port, "/bench/baseline-ingest", tokens, 1.0, [0] * args.clients)  # warm-up
        seqs = [0] * args.clients
        shared_seqs = [0] * args.clients
        results: dict[str, list[dict]] = {"baseline": [], "ingest": []}
        if shared is not None:
            results["ingest-redis"] = []
        for _ in range(args.rounds):
            results["baseline"].append(
                run_phase(
                    port,
                    "/bench/baseline-ingest",
                    tokens,
                    args.seconds,
                    [0] * args.clients,
                    server.pid,
                )
            )
            forget_baseline(port)
            r = run_phase(port, "/api/v1/ingest", tokens, args.seconds, seqs, server.pid)
            seqs = r["next_seqs"]
            results["ingest"].append(r)
            if shared is not None:
                r = run_phase(
                    shared_port,
                    "/api/v1/ingest",
                    shared_tokens,
                    args.seconds,
                    shared_seqs,
                    shared.pid,
                )
                shared_seqs = r["next_seqs"]
                results["ingest-redis"].append(r)
        summary = {}
        for name, rs in results.items():
            sps = statistics.mean(r["samples_per_s"] for r in rs)
            pooled = sorted(x for r in rs for x in r["latencies"])  # all rounds' requests
            p50 = statistics.median(pooled) * 1000
            p99 = pooled[min(len(pooled) - 1, int(len(pooled) * 0.99))] * 1000
            errors = sum(r["errors"] for r in rs)
            reqs = sum(r["requests"] for r in rs)
            summary[name] = (sps, p99)
            cpu = sum(r["server_cpu_s"] for r in rs)
            busy = cpu / sum(r["elapsed_s"] for r in rs)
            print(
                f"{name:12s} {sps:12,.0f} samples/s  p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  "
                f"({reqs} requests, {errors} errors)\n"
                f"{'':12s} server CPU {cpu / reqs * 1e6:6.0f} us per request, "
                f"busy {busy:.2f} of a core"
            )
        commit = server_metrics(port)
        if commit.get("rlguard_ingest_commit_duration_seconds_count"):
            n = commit["rlguard_ingest_commit_duration_seconds_count"]
            print(
                f"group commits: {n:.0f}, mean {commit['rlguard_ingest_commit_duration_seconds_sum'] / n * 1000:.2f} ms, "
                f"mean {commit['rlguard_ingest_commit_group_batches_sum'] / n:.2f} batches per commit; "
                f"{commit.get('rlguard_ingest_commits_total_inline', 0):.0f} committed inline on "
                f"the event loop (SQLite), {commit.get('rlguard_ingest_commits_total_loop', 0):.0f} "
                f"awaited on it (PostgreSQL), "
                f"{commit.get('rlguard_ingest_commits_total_thread', 0):.0f} on a thread"
            )
        ratio = summary["ingest"][0] / summary["baseline"][0]
        want_ratio, want_p99 = TARGETS.get(backend, (1.0, None))
        ok = ratio >= want_ratio and (want_p99 is None or summary["ingest"][1] <= want_p99)
        target = f">= {want_ratio:.2f}" + (
            f", ingest p99 <= {want_p99:g} ms" if want_p99 is not None else ""
        )
        print(
            f"ratio ingest/baseline = {ratio:.2f}  (target {target}: {'met' if ok else 'NOT met'})"
        )
        if shared is not None:
            print(
                f"ratio ingest-redis/ingest = {summary['ingest-redis'][0] / summary['ingest'][0]:.2f}"
                "  (shared Redis window vs in-memory window, same run and database)"
            )
        return ratio, summary["ingest"][1]
    finally:
        for proc in (server, shared):
            if proc is None:
                continue
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        if args.redis_url:
            from app.series.backend import forget_shared_window

            forget_shared_window(args.redis_url, url)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=8.0, help="per round and endpoint")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--database-url",
        default=None,
        help="run on this database (empty or migrated) instead of a fresh SQLite file",
    )
    ap.add_argument(
        "--postgres",
        metavar="SERVER_URL",
        default=None,
        help="also measure PostgreSQL, on a fresh database created (and dropped) on this server, "
        "e.g. postgresql+psycopg://postgres@127.0.0.1/postgres",
    )
    ap.add_argument("--redis-url", default=None, help="also measure the shared (Redis) window mode")
    ap.add_argument(
        "--sqlite-synchronous",
        default="FULL",
        choices=["NORMAL", "FULL"],
        help="FULL (the default setting) fsyncs every group commit: acknowledged batches "
        "survive power loss; NORMAL survives a process crash only",
    )
    args = ap.parse_args()
    if args.clients < 1 or args.seconds <= 0 or args.rounds < 1:
        ap.error("--clients, --seconds and --rounds must be positive")

    tmp = Path(tempfile.mkdtemp(prefix="rlguard-bench-"))
    measure(args.database_url or f"sqlite:///{tmp / 'bench.db'}", args, tmp / "data")
    if args.postgres:
        url = create_pg_database(args.postgres)
        try:
            measure(url, args, tmp / "data-pg")
        finally:
            drop_pg_database(args.postgres, url)


if __name__ == "__main__":
    main()
