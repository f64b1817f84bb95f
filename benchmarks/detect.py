"""Detection benchmarks: the policy tick's cost at cluster scale, and fault → task latency.

    .venv/bin/python benchmarks/detect.py                     # every part, short defaults
    .venv/bin/python benchmarks/detect.py --part tick --nodes 1000 --gpus 8 --ticks 20
    .venv/bin/python benchmarks/detect.py --part ingest-share --ticks 20
    .venv/bin/python benchmarks/detect.py --part latency --trials 30 --tick 1.0 --modes redis,embedded

Part ``tick``: an in-process SeriesStore filled like 1,000 nodes x 8 GPUs (every GPU metric of
docs/metrics.md the detectors read plus the job signals of 8 participants per node, with
history, and a few faults so detectors do real work), then ``PolicyEngine.tick`` timed over
warm ticks. Baseline in the same run: one bare pass over the store reading every series' latest
point with no allocation (the store's ring buffers read directly), the least any tick that
looks at every series must do; and the same tick without the detectors of issue 21 (Detection
v2, ``DETECTION_V2``), timed interleaved with the full one. Also timed: the participant read the
server does before each tick (8,000 views built), printed with read + tick. Target: tick <= 100 ms.

Part ``ingest-share``: the detectors' filters are standing questions that ingest answers as
samples arrive (``app.series.watch``), so part of the tick's old work is now paid in
``SeriesStore.extend``. Same store: one new sample for every series added per round, rounds
alternating between no policy engine and the server's one; prints both and their ratio.

Part ``latency``: a real ``rlguard server`` and ``rlguard worker`` (PostgreSQL + a Redis of its
own, and embedded SQLite + SQLAlchemy broker). Each trial posts one ingest batch that confirms
a fault and measures from the moment the server acknowledged that batch to the moment the
worker started the recovery task (``started_at`` of the action row), for two kinds of fault:

* the tick path: a new failed train step (a counter's rise, judged by the policy tick, which
  runs every ``--tick`` seconds). Target: p99 <= 1 s with Redis.
* the event path: a launcher-seen exit (the participant's phase becomes ``EXITED``), a fault
  that needs no window: the server ticks as soon as the batch is durable (``app.ingest.certain``,
  ``PolicyScheduler.nudge``). Target: p99 <= 150 ms.

Baseline in the same run: an outbox row sent straight to the broker by this process (broker +
worker claim only), the floor of both paths.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.core.gc_tuning import FreezeOnGrowth, freeze_startup_heap  # noqa: E402
from app.policy.detectors import default_detectors  # noqa: E402
from app.policy.engine import PolicyEngine  # noqa: E402
from app.policy.policy_file import default_policy  # noqa: E402
from app.policy.world import ParticipantView, World  # noqa: E402
from app.scheduler import participants_from_ingest  # noqa: E402
from app.series.backend import ParticipantHeartbeat  # noqa: E402
from app.series.store import SeriesKey, SeriesStore  # noqa: E402
from recovery.protocol import metric_names as m  # noqa: E402

GPU_METRICS = [
    m.GPU_UTILIZATION_RATIO,
    m.GPU_XID_CRITICAL_EVENTS_TOTAL,
    m.GPU_ECC_UNCORRECTED_TOTAL,
    m.GPU_REMAPPED_ROWS_FAILURE,
    m.GPU_THROTTLE_THERMAL,
    m.GPU_THROTTLE_POWER,
    m.GPU_LOST,
    "gpu_temperature_celsius",
    "gpu_power_watts",
    "gpu_memory_used_bytes",
]
JOB_METRICS = [
    m.ROLLOUT_PENDING_RATIO,
    m.ACTOR_SHARD_REBUILD_COUNT_5M,
    m.STATE_LOG_WRITE_LATENCY_MS,
    m.ROLLOUT_TOKENS_PER_SECOND,
    m.TRAIN_STEP,
    m.TRAIN_STEP_FAILURES_TOTAL,
    m.STATE_LOG_WRITE_ERRORS_TOTAL,
    m.PARTICIPANT_HEARTBEAT_AGE_SECONDS,
]

# Detectors added by issue 21 (Detection v2): the tick is also timed without them.
DETECTION_V2 = {"StragglerDetector", "EngineStalledDetector"}


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


# -- part 1: tick cost ---------------------------------------------------------------------------


def fill(
    store: SeriesStore, nodes: int, gpus: int, history: int, t0: float
) -> list[ParticipantView]:
    parts: list[ParticipantView] = []
    for n in range(nodes):
        node = f"node{n:04d}"
        job = f"job{n // 64}"
        samples = []
        for h in range(history):
            ts = t0 - history + h + 1
            for g in range(gpus):
                for name in GPU_METRICS:
                    value = 0.8 if name == m.GPU_UTILIZATION_RATIO else 0.0
                    if n == 7 and name == m.GPU_THROTTLE_THERMAL:
                        value = 1.0  # one throttling GPU
                    samples.append((SeriesKey.of(node, name, {"gpu": str(g)}), ts, value))
            for r in range(gpus):
                role = "trainer" if r < gpus // 2 else "rollout"
                labels = {"job": job, "role": role, "rank": str(n * gpus + r)}
                for name in JOB_METRICS:
                    value = 900.0 if name == m.ROLLOUT_TOKENS_PER_SECOND else 0.05
                    if n == 3 and name == m.STATE_LOG_WRITE_LATENCY_MS:
                        value = 500.0  # one slow state log
                    samples.append((SeriesKey.of(node, name, labels), ts, value))
        store.extend(samples)
        for r in range(gpus):
            role = "trainer" if r < gpus // 2 else "rollout"
            phase = "TRAIN" if role == "trainer" else "ROLLOUT"
            hb = t0 - (40 if n == 11 else 0.5)  # one silent participant
            parts.append(ParticipantView(job, role, n * gpus + r, node, phase, 20, hb))
    return parts


def bench_tick(nodes: int, gpus: int, history: int, ticks: int, arrivals: bool = False) -> None:
    t0 = 1_800_000_000.0
    # The server freezes its start-up heap and spaces out full collections once it has started
    # (app/main.py), before any sample arrives: the same here, before the fill.
    freeze_startup_heap()
    full_passes: list[float] = []  # when each full (oldest-generation) collection began
    gc.callbacks.append(
        lambda phase, info: (
            phase == "start" and info["generation"] == 2 and full_passes.append(time.perf_counter())
        )
    )
    store = SeriesStore(window_seconds=900, max_points=max(history, 10))
    started = time.perf_counter()
    parts = fill(store, nodes, gpus, history, t0)
    print(
        f"tick: {nodes} nodes x {gpus} GPUs: {len(store):,} series, {len(parts):,} participants "
        f"(filled in {time.perf_counter() - started:.1f}s); "
        f"{'a new sample for every series before each tick' if arrivals else 'nothing arrives between ticks'}"
    )
    seen = {f"node{n:04d}": t0 for n in range(nodes)}
    heap = FreezeOnGrowth()  # the server's scheduler freezes the grown store (app.core.gc_tuning)
    policy = default_policy()
    engine = PolicyEngine(policy)
    # The same tick without the detectors of issue 21 (Detection v2), measured interleaved with
    # the full tick in this run, so that a loaded machine weighs on both alike.
    older = PolicyEngine(
        policy,
        detectors=[d for d in default_detectors(policy) if type(d).__name__ not in DETECTION_V2],
    )
    base: list[float] = []
    cost: list[float] = []
    old_cost: list[float] = []
    read_cost: list[float] = []  # the server's participant read before each tick
    decisions = 0
    passes_before = len(full_passes)
    # With --arrivals every series gets one new sample (its value unchanged) before each tick,
    # untimed: what agents reporting every second (their default, and the tick's) bring. Without
    # it nothing arrives between ticks, the engine's cheapest case (what moved since the last
    # tick is found by identity and only that is re-judged).
    newest = [(key, ring.points[-1][1]) for key, ring in store._series.items()] if arrivals else []  # noqa: SLF001
    heartbeats: list[ParticipantHeartbeat] = []
    read_participants = participants_from_ingest(SimpleNamespace(participants=lambda: heartbeats))
    for i in range(ticks):
        now = t0 + 0.5 + i * (1.0 if arrivals else 0.01)
        if arrivals:
            store.extend([(key, now - 0.25, value) for key, value in newest])
            seen = dict.fromkeys(seen, now - 0.25)
            parts = [
                p if t0 - p.last_heartbeat_ts > 10 else replace(p, last_heartbeat_ts=now - 0.25)
                for p in parts
            ]  # the silent one stays silent
        s = time.perf_counter()
        for ring in list(store._series.values()):  # noqa: SLF001 - the floor: read each newest point
            if ring.points:
                ring.points[-1]  # noqa: B018
        base.append(time.perf_counter() - s)
        heartbeats = [
            ParticipantHeartbeat(
                p.job, p.role, p.rank, p.node, p.phase, p.step, p.last_heartbeat_ts
            )
            for p in parts
        ]
        s = time.perf_counter()
        read_participants()  # the server's tick reads them first (app.scheduler)
        read_cost.append(time.perf_counter() - s)
        world = World(now=now, store=store, participants=parts, node_last_seen=seen)
        s = time.perf_counter()
        decisions += len(engine.tick(world).decisions)
        heap.after_tick(len(store))  # as the server's scheduler does after each tick
        cost.append(time.perf_counter() - s)
        world = World(now=now, store=store, participants=parts, node_last_seen=seen)
        s = time.perf_counter()
        older.tick(world)
        old_cost.append(time.perf_counter() - s)
    warm = cost[2:] or cost
    old_warm = old_cost[2:] or old_cost
    print(
        f"tick: baseline (bare read of every series' newest point) p50 {pct(base, 50) * 1e3:.1f} ms"
    )
    print(
        f"tick: without the Detection v2 detectors ({', '.join(sorted(DETECTION_V2))}) p50 "
        f"{pct(old_warm, 50) * 1e3:.1f} ms  p99 {pct(old_warm, 99) * 1e3:.1f} ms"
    )
    print(
        f"tick: policy tick p50 {pct(warm, 50) * 1e3:.1f} ms  p99 {pct(warm, 99) * 1e3:.1f} ms  "
        f"max {max(warm) * 1e3:.1f} ms  ({decisions} decisions over {ticks} ticks)"
    )
    whole = [r + c for r, c in zip(read_cost[2:] or read_cost, warm, strict=False)]
    print(
        f"tick: the server's participant read before each tick ({len(parts):,}, "
        f"app.scheduler.participants_from_ingest) p50 {pct(read_cost, 50) * 1e3:.1f} ms; "
        f"read + tick p99 {pct(whole, 99) * 1e3:.1f} ms"
    )
    print(
        f"tick: ratio with/without the Detection v2 detectors p50 "
        f"{pct(warm, 50) / pct(old_warm, 50):.2f}x  p99 {pct(warm, 99) / pct(old_warm, 99):.2f}x"
    )
    print(
        f"tick: full GC passes during the {ticks} ticks (both engines and the baseline): "
        f"{len(full_passes) - passes_before}"
    )
    print(
        f"tick: ratio tick/baseline {pct(warm, 50) / pct(base, 50):.2f}x   target tick <= 100 ms: "
        f"{'MET' if pct(warm, 99) <= 0.1 else 'NOT MET'}"
    )


def bench_ingest_share(nodes: int, gpus: int, history: int, rounds: int) -> None:
    """What the tick's standing questions cost ingest (``app.series.watch``): the same
    store, one new sample for every series per round, added by ``SeriesStore.extend`` in rounds
    alternating between no policy engine registered (the baseline) and the server's one."""
    t0 = 1_800_000_000.0
    freeze_startup_heap()
    store = SeriesStore(window_seconds=900, max_points=max(history, 10))
    parts = fill(store, nodes, gpus, history, t0)
    newest = [(key, ring.points[-1][1]) for key, ring in store._series.items()]  # noqa: SLF001
    cost: dict[bool, list[float]] = {False: [], True: []}
    engine: PolicyEngine | None = None
    for i in range(2 * rounds):
        watched = i % 2 == 1
        if watched:  # the engine's first tick registers its questions (untimed)
            engine = PolicyEngine(default_policy())
            engine.tick(World(now=t0 + i, store=store, participants=parts))
        else:
            engine = None  # its questions go with it (held weakly by the store)
            gc.collect()
        batch = [(key, t0 + i + 1, value) for key, value in newest]
        s = time.perf_counter()
        store.extend(batch)
        cost[watched].append(time.perf_counter() - s)
    bare, watched_cost = pct(cost[False], 50), pct(cost[True], 50)
    print(
        f"ingest share: store.extend of {len(newest):,} samples (one per series), {rounds} rounds each: "
        f"no engine p50 {bare * 1e3:.1f} ms, with the engine's standing questions p50 "
        f"{watched_cost * 1e3:.1f} ms  ({(watched_cost - bare) / len(newest) * 1e6:.2f} us a sample); "
        f"ratio {watched_cost / bare:.2f}x"
    )


# -- part 2: fault -> task latency ---------------------------------------------------------------


class Stack:
    def __init__(self, mode: str, tick: float, workdir: Path) -> None:
        import yaml

        from app.core import migrate
        from app.policy.policy_file import DEFAULT_POLICY_PATH

        self.mode = mode
        self.dir = workdir / mode
        self.dir.mkdir()
        self.procs: list[subprocess.Popen[bytes]] = []
        policy = yaml.safe_load(DEFAULT_POLICY_PATH.read_text())
        policy["tick_seconds"] = tick
        # Every trial is an automatic action: the circuit breakers (60 a cluster in 10 min) would
        # stop automation part-way through a run, and the baseline's plans with it.
        for breaker in ("job_breaker", "cluster_breaker"):
            policy["guardrails"][breaker]["max_actions"] = 100_000
        (self.dir / "policy.yaml").write_text(yaml.safe_dump(policy))
        from app.policy.policy_file import load_policy

        self.policy = load_policy(
            self.dir / "policy.yaml"
        )  # the server's, for the baseline's plans
        self.port = _free_port()
        env = {
            **os.environ,
            "RLGUARD_DEV": "1",
            "RLGUARD_DATA_DIR": str(self.dir / "data"),
            "RLGUARD_RECOVERY_POLICY_FILE": str(self.dir / "policy.yaml"),
            "RLGUARD_RECOVERY_RUN_ROOT": str(self.dir / "runs"),
            "PYTHONPATH": str(ROOT),
            # restart_role succeeds at once (a failed one is retried, a second action per trial)
            "RLGUARD_RECOVERY_LAUNCHER": shutil.which("true") or "/bin/true",
        }
        env.pop("RLGUARD_REDIS_URL", None)
        self.admin_db: str | None = None
        if mode == "redis":
            rport = _free_port()
            self.procs.append(
                subprocess.Popen(
                    [
                        shutil.which("redis-server") or "redis-server",
                        "--port",
                        str(rport),
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                    ],
                    stdout=subprocess.DEVNULL,
                )
            )
            env["RLGUARD_REDIS_URL"] = f"redis://127.0.0.1:{rport}/0"
            import sqlalchemy as sa

            admin = os.environ.get(
                "RLGUARD_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
            )
            name = f"rlg_bench_{uuid.uuid4().hex[:8]}"
            eng = sa.create_engine(admin, isolation_level="AUTOCOMMIT")
            with eng.connect() as c:
                c.execute(sa.text(f'CREATE DATABASE "{name}"'))
            eng.dispose()
            self.admin_db = (admin, name)  # type: ignore[assignment]
            env["RLGUARD_DATABASE_URL"] = admin.rpartition("/")[0] + "/" + name
        else:
            env["RLGUARD_DATABASE_URL"] = f"sqlite:///{self.dir / 'rlguard.db'}"
        self.env = env
        self.url = env["RLGUARD_DATABASE_URL"]
        migrate.upgrade(self.url)
        from sqlmodel import Session

        from app.auth.tokens import create_node_token
        from app.core.db import make_engine

        self.engine = make_engine(self.url)
        with Session(self.engine) as s:
            self.token = create_node_token(s, node="n0", actor="bench")[1]
            s.commit()
        rl = str(Path(sys.executable).with_name("rlguard"))
        log = open(self.dir / "server.log", "ab")  # noqa: SIM115
        self.procs.append(
            subprocess.Popen(
                [rl, "server", "--host", "127.0.0.1", "--port", str(self.port)],
                env=env,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        )
        self.procs.append(
            subprocess.Popen(
                [rl, "worker", "--node", "n0", "--cluster", "--loglevel", "WARNING"],
                env=env,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        )
        import httpx

        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=10)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if self.http.get("/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        self.seq = 0

    def post(self, samples: list[dict], participants: list[dict]) -> float:
        self.seq += 1
        body = {
            "agent_id": "bench",
            "node": "n0",
            "seq": self.seq,
            "sent_at": time.time(),
            "samples": samples,
            "participants": participants,
            "fingerprint": None,
        }
        r = self.http.post(
            "/api/v1/ingest", json=body, headers={"Authorization": f"Bearer {self.token}"}
        )
        r.raise_for_status()
        return time.time()

    def started_at(self, job: str, timeout: float = 30.0) -> float | None:
        from sqlmodel import Session, select

        from app.models.action import RecoveryAction

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with Session(self.engine) as s:
                row = s.exec(select(RecoveryAction).where(RecoveryAction.job == job)).first()
                if row is not None and row.started_at is not None:
                    return row.started_at.timestamp()
            time.sleep(0.02)
        return None

    def trial(self, i: int) -> float | None:
        job = f"bench{i:04d}"
        (self.dir / "runs" / job).mkdir(parents=True, exist_ok=True)
        labels = {"job": job, "role": "trainer", "rank": "0"}
        now = time.time()
        part = [{"job": job, "role": "trainer", "rank": 0, "phase": "TRAIN", "step": 50, "ts": now}]
        self.post(
            [{"name": m.TRAIN_STEP_FAILURES_TOTAL, "value": 0, "ts": now, "labels": labels}], part
        )
        time.sleep(0.3)
        now = time.time()
        part[0]["ts"] = now
        acked = self.post(
            [
                {"name": m.TRAIN_STEP_FAILURES_TOTAL, "value": 1, "ts": now, "labels": labels},
                {"name": m.TRAIN_LAST_FAILED_STEP, "value": 50, "ts": now, "labels": labels},
            ],
            part,
        )
        started = self.started_at(job)
        return None if started is None else started - acked

    def exit_trial(self, i: int) -> float | None:
        """The event path: a trainer reported by its launcher as EXITED (no window needed)."""
        job = f"exit{i:04d}"
        (self.dir / "runs" / job).mkdir(parents=True, exist_ok=True)
        part = [
            {
                "job": job,
                "role": "trainer",
                "rank": 0,
                "phase": "TRAIN",
                "step": 50,
                "ts": time.time(),
            }
        ]
        self.post([], part)
        time.sleep(0.3)
        part[0].update(phase="EXITED", ts=time.time())
        acked = self.post([], part)
        started = self.started_at(job)
        return None if started is None else started - acked

    def direct(self, i: int) -> float | None:
        """Baseline: an outbox row sent to the broker by this process, to worker start."""
        from sqlmodel import Session

        from app.actions.kinds import task_name
        from app.actions.outbox import mark_dispatched
        from app.incidents.persist import persist_decisions
        from app.policy.engine import DecisionType, IncidentDecision
        from app.policy.plans import ActionName, PlannedAction
        from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject, Tier
        from app.tasks.celery_app import make_celery

        job = f"direct{i:04d}"
        (self.dir / "runs" / job).mkdir(parents=True, exist_ok=True)
        subj = Subject(node="n0", job=job, role="trainer", rank=0)
        sig = FaultSignal(
            FaultKind.STEP_FAILED, subj, Evidence(metric=None), Tier.LIGHT, 0.0, step=5
        )
        act = PlannedAction(ActionName.SKIP_FAILED_STEP, job, "n0", False, {"step": 5})
        with Session(self.engine) as s:
            out = persist_decisions(
                s,
                decisions=[
                    IncidentDecision(
                        DecisionType.OPEN,
                        sig.incident_key,
                        sig.kind,
                        subj,
                        Tier.LIGHT,
                        0.0,
                        sig,
                        (act,),
                    )
                ],
                policy=self.policy,
            )
            [aid] = out.new_actions
            mark_dispatched(s, action_id=aid)  # keep the server's dispatcher off this row
            s.commit()
            from app.models.action import RecoveryAction

            key = s.get(RecoveryAction, aid).idempotency_key  # type: ignore[union-attr]
        if not hasattr(self, "_celery"):
            from app.core.config import Settings

            self._celery = make_celery(
                Settings(
                    dev=True,
                    database_url=self.url,
                    data_dir=self.dir / "data",
                    redis_url=self.env.get("RLGUARD_REDIS_URL"),
                )
            )
        sent = time.time()
        self._celery.send_task(task_name("skip_failed_step"), args=[aid, key], queue="node.n0")
        started = self.started_at(job)
        return None if started is None else started - sent

    def close(self) -> None:
        for p in reversed(self.procs):
            try:
                os.killpg(p.pid, signal.SIGTERM) if p.pid else None
            except (ProcessLookupError, PermissionError):
                p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        self.engine.dispose()
        if self.admin_db:
            import sqlalchemy as sa

            admin, name = self.admin_db  # type: ignore[misc]
            eng = sa.create_engine(admin, isolation_level="AUTOCOMMIT")
            with eng.connect() as c:
                c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            eng.dispose()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bench_latency(modes: list[str], trials: int, tick: float) -> None:
    with tempfile.TemporaryDirectory(prefix="rlg-detect-") as tmp:
        for mode in modes:
            stack = Stack(mode, tick, Path(tmp))
            try:
                stack.trial(-1)  # warm-up: first task import, connections
                stack.exit_trial(-1)
                lat, event = [], []
                for i in range(trials):  # interleaved: a loaded moment weighs on both paths
                    if (x := stack.trial(i)) is not None:
                        lat.append(x)
                    if (x := stack.exit_trial(i)) is not None:
                        event.append(x)
                base = [
                    x
                    for x in (stack.direct(i) for i in range(max(5, trials // 3)))
                    if x is not None
                ]
            finally:
                stack.close()
            if not lat or not base or not event:
                print(f"latency[{mode}]: no task started (see {stack.dir}/server.log)")
                continue
            print(
                f"latency[{mode}] tick {tick:g}s: tick path (step failure): ingest ack -> task start "
                f"p50 {pct(lat, 50) * 1e3:.0f} ms  p99 {pct(lat, 99) * 1e3:.0f} ms  (n={len(lat)}/{trials})"
            )
            print(
                f"latency[{mode}]: event path (launcher-seen exit): ingest ack -> task start "
                f"p50 {pct(event, 50) * 1e3:.0f} ms  p99 {pct(event, 99) * 1e3:.0f} ms  "
                f"max {max(event) * 1e3:.0f} ms  (n={len(event)}/{trials})"
            )
            print(
                f"latency[{mode}]: baseline outbox row -> broker -> task start p50 {pct(base, 50) * 1e3:.0f} ms  "
                f"p99 {pct(base, 99) * 1e3:.0f} ms  (n={len(base)})"
            )
            verdict = (
                ""
                if mode != "redis"
                else f"   target p99 <= 1 s: {'MET' if pct(lat, 99) <= 1.0 else 'NOT MET'}"
            )
            print(
                f"latency[{mode}]: ratio p50 detection-path/baseline {statistics.median(lat) / statistics.median(base):.1f}x{verdict}"
            )
            print(
                f"latency[{mode}]: ratio p50 event-path/baseline {statistics.median(event) / statistics.median(base):.1f}x  "
                f"event/tick path p99 {pct(event, 99) / pct(lat, 99):.2f}x   target event path p99 <= 150 ms: "
                f"{'MET' if pct(event, 99) <= 0.15 else 'NOT MET'}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--part", choices=["tick", "ingest-share", "latency", "all"], default="all")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--history", type=int, default=10)
    ap.add_argument("--ticks", type=int, default=12)
    ap.add_argument(
        "--arrivals",
        action="store_true",
        help="tick part: a new sample for every series before each tick (agents at 1 s)",
    )
    ap.add_argument("--trials", type=int, default=15)
    ap.add_argument("--tick", type=float, default=1.0, help="policy tick for the latency part (s)")
    ap.add_argument("--modes", default="redis,embedded")
    args = ap.parse_args()
    for name in ("nodes", "gpus", "history", "ticks", "trials"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1")
    if args.part in ("tick", "all"):
        bench_tick(args.nodes, args.gpus, args.history, args.ticks, args.arrivals)
    if args.part in ("ingest-share", "all"):
        bench_ingest_share(args.nodes, args.gpus, args.history, args.ticks)
    if args.part in ("latency", "all"):
        modes = [x.strip() for x in args.modes.split(",") if x.strip()]
        bad = [x for x in modes if x not in ("redis", "embedded")]
        if bad:
            ap.error(f"--modes: unknown mode(s) {', '.join(bad)} (use redis, embedded)")
        bench_latency(modes, args.trials, args.tick)


if __name__ == "__main__":
    main()
