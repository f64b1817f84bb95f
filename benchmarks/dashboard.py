"""Overview at cluster scale, server-side, against the bare ``/healthz`` in the same run.

    .venv/bin/python benchmarks/dashboard.py --nodes 1000       # the fleet view (issue 24)
    .venv/bin/python benchmarks/dashboard.py                    # 125 nodes x 8 GPUs, 20 incidents
    .venv/bin/python benchmarks/dashboard.py --nodes 1000 --no-cards --requests 60

Builds the real application (``app.main.create_app``) on a fresh SQLite database, fills it with a
synthetic fleet (nodes, GPUs with 30 minutes of per-minute rollups and 2 minutes of live samples in
the series store, jobs with participants, open incidents of every tier, pending approvals), serves
it with uvicorn on a free port, signs in through the login form, and then alternates requests:

* ``healthz``: ``GET /healthz``, the floor: routing, middleware and the HTTP round trip;
* ``page``: ``GET /`` signed in. Above ``dashboard.fleet_view_above_nodes`` (64) nodes that is the
  fleet view's first response (filters and empty panels), and the browser then fetches
* its lazily loaded partials, each timed on its own: ``grid`` (tiles and the GPU heat map, first
  page), ``nodes`` (node list), ``incidents``, ``jobs``, ``goodput``, ``breakers``.
* ``grid-cold``: the heat map again, each request finding no shared judgement of the fleet (so
  it judges every node and GPU itself, as the first viewer after a quiet spell does; otherwise
  the partials share one judgement, at most 1 s old, or up to 10 s while a background thread
  judges again: app/views/models/fleet.py).
* ``cards`` (unless ``--no-cards``): the same ``GET /`` with the threshold raised above the node
  count, i.e. every node's card with sparklines in one response, as the Overview was before the
  fleet view: the in-run "before" figure.

Server-side latency is measured by an ASGI wrapper around the app (request in to last body byte).
The first ``--warmup`` requests of each are not counted. The policy scheduler is off unless
``--with-scheduler``. Prints p50/p95/p99 per request kind, the sizes (first response, every
partial, their sum: what a browser loads for the Overview), the load average, and the targets:
every request of the Overview p95 <= 150 ms server-side, everything it loads <= 300 KiB.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import random
import re
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy.engine import Engine  # noqa: E402
from sqlmodel import Session  # noqa: E402

from app.models import Job, MetricRollup, Node, Participant, from_epoch  # noqa: E402
from app.series.store import SeriesKey, SeriesStore  # noqa: E402
from app.views.models.overview import DashboardCaches  # noqa: E402

GIB = 2**30
GPU_NAMES = (
    "gpu_utilization_ratio",
    "gpu_temperature_celsius",
    "gpu_memory_used_bytes",
    "gpu_memory_total_bytes",
    "gpu_power_watts",
    "gpu_throttle_thermal_active",
    "gpu_throttle_power_active",
    "gpu_ecc_uncorrected_errors_total",
    "gpu_xid_critical_events_total",
    "gpu_lost",
)


def _gpu_value(name: str, node_i: int, gpu: int, t: float, rng: random.Random) -> float:
    phase = math.sin(t / 90.0 + node_i * 0.7 + gpu)
    if name == "gpu_utilization_ratio":
        return max(0.0, min(1.0, 0.82 + 0.12 * phase + rng.uniform(-0.04, 0.04)))
    if name == "gpu_temperature_celsius":
        hot = 14.0 if node_i % 41 == 7 and gpu == 3 else 0.0  # one hot GPU now and then
        return 64.0 + 6.0 * phase + hot + rng.uniform(-1, 1)
    if name == "gpu_memory_used_bytes":
        return (62 + 8 * phase) * GIB
    if name == "gpu_memory_total_bytes":
        return 80 * GIB
    if name == "gpu_power_watts":
        return 520 + 120 * phase
    return 0.0


def populate(
    engine: Engine,
    store: SeriesStore,
    *,
    nodes: int,
    gpus: int,
    now: float,
    live_seconds: int = 120,
    rollup_minutes: int = 30,
    jobs: int = 4,
    seed: int = 7,
) -> list[str]:
    """Fill the database and the store; returns the node names."""
    rng = random.Random(seed)
    names = [f"gpu-node-{i:03d}" for i in range(nodes)]
    with Session(engine) as session:
        for i, name in enumerate(names):
            session.add(
                Node(
                    name=name,
                    last_seen_at=from_epoch(now - rng.uniform(0.2, 2.0)),
                    last_agent_id=f"agent-{name}",
                    fingerprint={
                        "python": "3.11.9",
                        "torch": "2.13.0",
                        "cuda": "12.8",
                        "driver": "570.124",
                    },
                    fingerprint_hash=f"{i % 3:064x}",
                )
            )
        session.flush()
        for j in range(jobs):
            job = f"grpo-run-{j + 1}"
            session.add(Job(name=job, last_seen_at=from_epoch(now - 1)))
            session.flush()
            members = names[j::jobs][:16]
            for rank, node in enumerate(members):
                role = "trainer" if rank < len(members) // 2 else "rollout"
                session.add(
                    Participant(
                        job_name=job,
                        role=role,
                        rank=rank,
                        node_name=node,
                        phase="TRAIN" if role == "trainer" else "ROLLOUT",
                        step=1200 + j * 37,
                        last_heartbeat_at=from_epoch(now - rng.uniform(0.5, 4.0)),
                    )
                )
        start_minute = from_epoch(now).replace(second=0, microsecond=0) - timedelta(
            minutes=rollup_minutes
        )
        rollups = []
        for i, name in enumerate(names):
            for gpu in range(gpus):
                for metric in GPU_NAMES[:5]:
                    for m in range(rollup_minutes):
                        minute = start_minute + timedelta(minutes=m)
                        v = _gpu_value(metric, i, gpu, minute.timestamp(), rng)
                        rollups.append(
                            {
                                "series_id": f"{name}:{metric}:{gpu}"[:40],
                                "node": name,
                                "name": metric,
                                "labels": {"gpu": str(gpu)},
                                "minute": minute,
                                "count": 60,
                                "min": v,
                                "max": v,
                                "avg": v,
                                "last": v,
                                "last_ts": minute.timestamp() + 59,
                            }
                        )
        session.bulk_insert_mappings(MetricRollup, rollups)  # type: ignore[arg-type]
        session.commit()
    samples = []
    for i, name in enumerate(names):
        for gpu in range(gpus):
            for metric in GPU_NAMES:
                key = SeriesKey.of(name, metric, {"gpu": str(gpu)})
                for s in range(live_seconds, 0, -1):
                    t = now - s
                    samples.append((key, t, _gpu_value(metric, i, gpu, t, rng)))
    store.extend(samples)
    return names


def add_incidents(engine: Engine, nodes: list[str], *, count: int, now: float) -> None:
    """``count`` open incidents across tiers; each heavy one with a pending approval."""
    from app.models.action import RecoveryAction
    from app.models.approval import Approval
    from app.models.incident import Incident, IncidentEvent

    tiers = ["light", "medium", "heavy"]
    kinds = {"light": "rollout_batch_timeout", "medium": "gpu_xid", "heavy": "storage_unwritable"}
    with Session(engine) as session:
        for i in range(count):
            tier = tiers[i % 3]
            node = nodes[(i * 7) % len(nodes)]
            key = f"{kinds[tier]}:node={node}:{i}"
            inc = Incident(
                key=key,
                open_key=key,
                kind=kinds[tier],
                tier=tier,
                subject={"node": node, "job": "grpo-run-1"},
                job="grpo-run-1",
                node=node,
                summary=f"{kinds[tier].replace('_', ' ')} on {node}",
                evidence={
                    "metric": "state_log_write_latency_ms",
                    "values": [[now - 30, 250.0]],
                    "window_seconds": 10,
                    "threshold": 200,
                },
                safe_mode=tier == "heavy",
                opened_at=from_epoch(now - 60 * (i + 1)),
                updated_at=from_epoch(now - 5 * i),
            )
            session.add(inc)
            session.flush()
            session.add(IncidentEvent(incident_id=inc.id, type="opened", at=inc.opened_at))  # type: ignore[arg-type]
            if tier == "heavy":
                appr = Approval(
                    incident_id=inc.id,
                    expires_at=from_epoch(now + 3600),
                    summary="restore checkpoint",
                )  # type: ignore[arg-type]
                session.add(appr)
                session.flush()
                session.add(
                    RecoveryAction(
                        incident_id=inc.id,  # type: ignore[arg-type]
                        approval_id=appr.id,
                        idempotency_key=f"bench:{i}:restore_checkpoint",
                        action="restore_checkpoint",
                        job="grpo-run-1",
                        queue="cluster",
                        status="pending_approval",
                    )
                )
        session.commit()


class ServerTiming:
    """Outermost ASGI wrapper: time from the request reaching the app to its last body byte.

    This is the server-side figure (routing, middleware, the view, rendering); requests are
    sequential, so the client names the kind of the next one in ``label``.
    """

    def __init__(self, app: object) -> None:
        self.app = app
        self.samples: dict[str, list[float]] = {}
        self.recording = False
        self.label = ""

    async def __call__(self, scope: dict, receive: object, send: object) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)  # type: ignore[operator]
            return
        start = time.perf_counter()
        label = self.label

        async def timed_send(message: dict) -> None:
            await send(message)  # type: ignore[operator]
            if message["type"] == "http.response.body" and not message.get("more_body"):
                if self.recording:
                    self.samples.setdefault(label, []).append((time.perf_counter() - start) * 1000)

        await self.app(scope, receive, timed_send)  # type: ignore[operator]


class _Server(threading.Thread):
    def __init__(self, app: object, port: int) -> None:
        import uvicorn

        super().__init__(daemon=True)
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
        )  # type: ignore[arg-type]

    def run(self) -> None:
        self.server.run()

    def stop(self) -> None:
        self.server.should_exit = True
        self.join(timeout=20)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _sign_in(client: httpx.Client, name: str, password: str) -> None:
    form = client.get("/login")
    token = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
    assert token, "login form without a CSRF token"
    r = client.post(
        "/login", data={"username": name, "password": password, "csrf_token": token.group(1)}
    )
    r.raise_for_status()
    assert "Cluster overview" in r.text, "sign-in did not reach the overview"


HX = {"HX-Request": "true"}
# What a browser fetches for the fleet Overview: the first response, then its lazy partials.
FLEET_REQUESTS = (
    ("page", "/", {}),
    ("grid", "/ui/overview/fleet", HX),
    ("nodes", "/ui/overview/fleet/nodes", HX),
    ("incidents", "/ui/overview/incidents", HX),
    ("jobs", "/ui/overview/jobs", HX),
    ("goodput", "/ui/overview/goodput", HX),
    ("breakers", "/ui/overview/breakers", HX),
)
TARGET_P95_MS = 150.0
TARGET_KIB = 300.0


def _check(label: str, text: str, nodes: int, fleet: bool) -> None:
    """The answer is the page it should be (a benchmark of an error page measures nothing)."""
    if label == "cards" or (label == "page" and not fleet):
        assert text.count('class="node-card') == nodes, "overview lost nodes"
    elif label == "page":
        assert 'hx-get="/ui/overview/fleet" hx-trigger="load"' in text, "no lazy fleet grid"
    elif label in ("grid", "grid-cold"):
        assert text.count('<a class="hm ') == min(nodes, 250), "heat map lost nodes"


def _measure(
    client: httpx.Client,
    timing: ServerTiming,
    caches: DashboardCaches,
    requests: list[tuple[str, str, dict[str, str]]],
    *,
    rounds: int,
    warmup: int,
    nodes: int,
    fleet: bool,
    cold: frozenset[str] = frozenset(),
) -> dict[str, int]:
    """``rounds`` of every request in turn; the server side records after ``warmup`` rounds.
    Returns each request's body size."""
    sizes: dict[str, int] = {}
    for i in range(warmup + rounds):
        timing.recording = i >= warmup
        for label, path, headers in requests:
            timing.label = label
            if label in cold:
                # No judgement of the fleet to share: this request judges every node itself.
                caches.expire_states()
            r = client.get(path, headers=headers)
            r.raise_for_status()
            if label not in sizes:
                _check(label, r.text, nodes, fleet)
            sizes[label] = len(r.content)
    timing.recording = False
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=125)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--incidents", type=int, default=20)
    parser.add_argument("--requests", type=int, default=150, help="measured requests per kind")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument(
        "--cards-requests", type=int, default=40, help="measured node-card overviews (the before)"
    )
    parser.add_argument("--no-cards", action="store_true", help="skip the node-card overview")
    parser.add_argument(
        "--cold-requests", type=int, default=40, help="measured heat maps judging the fleet"
    )
    parser.add_argument(
        "--gc-freeze",
        action="store_true",
        help="gc.freeze() after the fleet is built (shows how much of the tail is the cyclic GC)",
    )
    parser.add_argument(
        "--with-scheduler",
        action="store_true",
        help="also run the policy scheduler in the server (its 1 s tick shares the CPU and the GIL)",
    )
    args = parser.parse_args()
    for name in ("nodes", "gpus", "requests", "cards_requests", "cold_requests"):
        if getattr(args, name) < 1:
            parser.error(
                f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}"
            )
    if args.incidents < 0 or args.warmup < 0:
        parser.error("--incidents and --warmup must not be negative")

    from app.auth.users import create_user
    from app.core.config import DashboardSettings, Settings
    from app.core.migrate import upgrade
    from app.main import create_app

    if not args.with_scheduler:
        # The page alone by default; --with-scheduler measures it next to the policy tick.
        os.environ["RLGUARD_POLICY_SCHEDULER"] = "0"
    with tempfile.TemporaryDirectory(prefix="rlguard-bench-dash-") as tmp:
        settings = Settings(data_dir=Path(tmp), secret_key="bench-" + "k" * 32)
        upgrade(settings.db_url)
        app = create_app(settings)
        fleet = args.nodes > settings.dashboard.fleet_view_above_nodes
        now = time.time()
        t0 = time.perf_counter()
        nodes = populate(
            app.state.engine, app.state.series_store, nodes=args.nodes, gpus=args.gpus, now=now
        )
        add_incidents(app.state.engine, nodes, count=args.incidents, now=now)
        with Session(app.state.engine) as session:
            create_user(
                session, name="bench", role="viewer", actor="bench", password="bench-password"
            )
            session.commit()
        if args.gc_freeze:
            gc.collect()
            gc.freeze()
        gc_before = [g["collections"] for g in gc.get_stats()]
        print(
            f"fleet: {args.nodes} nodes x {args.gpus} GPUs, {len(app.state.series_store)} live series, "
            f"{args.incidents} open incidents (built in {time.perf_counter() - t0:.1f} s); "
            f"layout: {'fleet view' if fleet else 'node cards'} "
            f"(fleet_view_above_nodes={settings.dashboard.fleet_view_above_nodes})"
        )
        from tests.conftest import free_port

        port = free_port()
        timing = ServerTiming(app)
        server = _Server(timing, port)
        server.start()
        try:
            base = f"http://127.0.0.1:{port}"
            with httpx.Client(base_url=base, timeout=60, follow_redirects=True) as client:
                for _ in range(200):
                    try:
                        if client.get("/healthz").status_code == 200:
                            break
                    except httpx.HTTPError:
                        time.sleep(0.05)
                _sign_in(client, "bench", "bench-password")
                overview = [("healthz", "/healthz", {})]
                overview += list(FLEET_REQUESTS) if fleet else [("page", "/", {})]
                sizes = _measure(
                    client,
                    timing,
                    app.state.dashboard_caches,
                    overview,
                    rounds=args.requests,
                    warmup=args.warmup,
                    nodes=args.nodes,
                    fleet=fleet,
                )
                if fleet:
                    # The heat map of a viewer who finds no judgement of the fleet younger than
                    # 10 s (the first after a quiet spell): it judges all 8,000 GPUs itself.
                    _measure(
                        client,
                        timing,
                        app.state.dashboard_caches,
                        [("healthz", "/healthz", {}), ("grid-cold", "/ui/overview/fleet", HX)],
                        rounds=args.cold_requests,
                        warmup=2,
                        nodes=args.nodes,
                        fleet=True,
                        cold=frozenset({"grid-cold"}),
                    )
                if fleet and not args.no_cards:
                    # The same fleet as node cards: the threshold raised above the node count.
                    app.state.settings = settings.model_copy(
                        update={"dashboard": DashboardSettings(fleet_view_above_nodes=args.nodes)}
                    )
                    sizes.update(
                        _measure(
                            client,
                            timing,
                            app.state.dashboard_caches,
                            [("healthz", "/healthz", {}), ("cards", "/", {})],
                            rounds=args.cards_requests,
                            warmup=2,
                            nodes=args.nodes,
                            fleet=False,
                        )
                    )
                    app.state.settings = settings
        finally:
            server.stop()
    gc_runs = [g["collections"] - b for g, b in zip(gc.get_stats(), gc_before, strict=True)]
    _report(args, timing.samples, sizes, fleet=fleet, gc_runs=gc_runs)


def _report(
    args: argparse.Namespace,
    samples: dict[str, list[float]],
    sizes: dict[str, int],
    *,
    fleet: bool,
    gc_runs: list[int],
) -> None:
    load = os.getloadavg()
    print(
        f"requests: {args.requests} per kind after {args.warmup} warm-up rounds; policy scheduler "
        f"{'on' if args.with_scheduler else 'off'}; gc.freeze {'on' if args.gc_freeze else 'off'}; "
        f"load average {load[0]:.1f} on {os.cpu_count()} CPUs; GC runs gen0/1/2 {gc_runs}"
    )
    print(
        f"{'request':<10} {'n':>5} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'KiB':>8}   server-side"
    )
    floor = _percentile(samples["healthz"], 0.95)
    for label, values in samples.items():
        kib = sizes.get(label, 0) / 1024
        print(
            f"{label:<10} {len(values):>5} {_percentile(values, 0.5):8.1f} "
            f"{_percentile(values, 0.95):8.1f} {_percentile(values, 0.99):8.1f} {kib:8.1f}"
        )
    loaded = [label for label, _, _ in FLEET_REQUESTS] if fleet else ["page"]
    total_kib = sum(sizes[label] for label in loaded) / 1024
    worst = max(loaded, key=lambda label: _percentile(samples[label], 0.95))
    worst_p95 = _percentile(samples[worst], 0.95)
    if fleet:
        print(
            f"first response {sizes['page'] / 1024:.1f} KiB + lazily loaded partials "
            f"{(sum(sizes[label] for label in loaded) - sizes['page']) / 1024:.1f} KiB "
            f"= {total_kib:.1f} KiB loaded for the Overview"
        )
    print(
        f"ratio slowest Overview request ({worst}) / healthz, server-side p95: "
        f"{worst_p95 / floor:.1f}x ({worst_p95:.1f} / {floor:.1f} ms)"
    )
    if "grid-cold" in samples:
        print(
            f"cold heat map (judges every node itself; otherwise a judgement at most 1 s old is "
            f"used, or up to 10 s while a thread judges again): p50 "
            f"{_percentile(samples['grid-cold'], 0.5):.1f} ms, p95 "
            f"{_percentile(samples['grid-cold'], 0.95):.1f} ms"
        )
    if "cards" in samples:
        cards = _percentile(samples["cards"], 0.95)
        print(
            f"before (node cards, same fleet, same run): p95 {cards:.1f} ms, p99 "
            f"{_percentile(samples['cards'], 0.99):.1f} ms, {sizes['cards'] / 1024:.0f} KiB; "
            f"fleet view slowest p95 {worst_p95:.1f} ms ({cards / worst_p95:.1f}x faster), "
            f"{total_kib:.0f} KiB in all ({sizes['cards'] / 1024 / total_kib:.1f}x smaller)"
        )
    print(
        f"target every Overview request p95 <= {TARGET_P95_MS:.0f} ms server-side: "
        f"{'MET' if worst_p95 <= TARGET_P95_MS else 'NOT MET'} ({worst}: {worst_p95:.1f} ms)"
    )
    print(
        f"target everything the Overview loads <= {TARGET_KIB:.0f} KiB: "
        f"{'MET' if total_kib <= TARGET_KIB else 'NOT MET'} ({total_kib:.1f} KiB)"
    )


if __name__ == "__main__":
    main()
