"""A rollout's inference engine (vLLM, SGLang) that stopped answering: ``rollout_engine_down``.

The node agent probes each engine's ``/health`` every round (``--engine``) and sends
``rollout_engine_up`` 1/0 with the participant's labels (job, role, rank) and ``engine``. An
engine whose probe fails for ``detection.engine.down_seconds`` while its node keeps reporting is
dead or wedged: the plan restarts that role through the launcher (``restart_role``). A shorter
failure clears by itself, and an engine in its participant's start-up grace
(:class:`StartupGrace`) is not judged. An engine that answers but generates nothing, with
nothing piling up, is not a fault (a rollout waiting on a tool call keeps its engine idle).

``EngineStalledDetector`` sees an engine that died inside a worker that lives on (the worker
keeps its heartbeat and keeps accepting work) without a probe, from progress: a rollout whose
heartbeat is alive but that generated no tokens for ``detection.rollout.stall_timeout_seconds``
while its work piles up (its pending rollouts rose since the stall began, or its step stayed
frozen throughout with rollouts pending).
"""

from __future__ import annotations

from app.policy.detectors.base import (
    AT_LEAST_ONE,
    Detector,
    ParticipantKey,
    ParticipantSeries,
    StartupGrace,
    breach_run,
    participant_subject,
    subject_of,
)
from app.policy.policy_file import Policy
from app.policy.signals import Evidence, FaultKind, FaultSignal, cap_points
from app.policy.world import ParticipantView, Threshold, World
from app.series.store import Point, SeriesKey
from recovery.protocol import metric_names as m


def engine_key(key: SeriesKey, name: str, **labels: str) -> SeriesKey:
    """The series ``name`` of the engine ``key`` belongs to (the same node and labels, the
    process label replaced by ``labels``)."""
    kept = {k: v for k, v in key.labels if k != m.LABEL_PROCESS}
    return SeriesKey.of(key.node, name, {**kept, **labels})


def engine_starting(detector: Detector, world: World, key: SeriesKey) -> float | None:
    """The engine's uptime while it is in its start-up grace (its kind's
    ``detection.engine.startup_grace_seconds`` from its API server's start, until its first
    answer); None when it is not starting or its node cannot see its processes."""
    uptime = world.store.latest(engine_key(key, m.ROLLOUT_ENGINE_UPTIME))
    if uptime is None or not detector.fresh(world, uptime):
        return None
    kind = key.label(m.LABEL_ENGINE) or ""
    if uptime.value >= detector.policy.detection.engine.grace_seconds(kind):
        return None
    started = uptime.ts - uptime.value
    up = world.store.since(engine_key(key, m.ROLLOUT_ENGINE_UP), started)
    if any(p.value > 0 for p in up):
        return None  # it answered since it started: started
    return uptime.value


def _processes_live(world: World, key: SeriesKey, detector: Detector) -> bool | None:
    """True when the node sees every level of the engine's tree alive, False when it sees a
    level gone, None when it does not watch the engine's processes."""
    point = world.store.latest(engine_key(key, m.ROLLOUT_ENGINE_PROCESS_DEAD, process="api_server"))
    if point is None or not detector.fresh(world, point):
        return None
    levels = [
        world.store.latest(engine_key(key, m.ROLLOUT_ENGINE_PROCESS_DEAD, process=level))
        for level in ("api_server", "engine_core", "worker")
    ]
    return not any(p is not None and p.value >= 1 for p in levels)


class InferenceEngineDownDetector(Detector):
    """``rollout_engine_up`` at 0 for ``down_seconds`` on a node that still reports:
    ``rollout_engine_down``; ``rollout_engine_hung`` after ``hung_seconds`` when the node sees
    every process of the engine alive (a dead one is ``rollout_engine_dead``'s)."""

    metrics = (m.ROLLOUT_ENGINE_UP,)

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self.filters = {m.ROLLOUT_ENGINE_UP: Threshold("le", 0.0)}  # only failing probes come
        self.startup = StartupGrace(policy)

    def detect(self, world: World) -> list[FaultSignal]:
        down_for = self.policy.detection.engine.down_seconds
        hung_for = self.policy.detection.engine.hung_seconds
        stale = self.policy.detection.stale_sample_seconds
        check, now = self.startup.check, world.now
        under_way, start_phases = self.startup.under_way, self.startup.phases
        starting = {
            p.key
            for p in world.participants
            if (under_way or p.phase in start_phases) and check(p, now) is not None
        }
        out: list[FaultSignal] = []
        for key, latest in world.series(m.ROLLOUT_ENGINE_UP):
            if latest.value > 0 or not self.fresh(world, latest):
                continue  # answering, or the node went quiet (the node detector's case)
            live = _processes_live(world, key, self)
            if live is False:
                continue  # a process of it is gone: rollout_engine_dead says so
            window = hung_for if live else down_for
            points = world.store.since(key, world.now - max(down_for, hung_for) - stale)
            run = breach_run(points, lambda v: v <= 0)
            if not run:
                continue
            start = self.sticky_since(key, run[0].ts, open_ended=len(run) == len(points))
            if world.now - start < window:
                continue
            engine = key.label(m.LABEL_ENGINE) or "engine"
            subject = subject_of(key)
            if (subject.job, subject.role, subject.rank) in starting:
                continue  # loading, compiling: its start-up grace
            if engine_starting(self, world, key) is not None:
                continue  # its engine kind's start-up grace
            why = "every process of it alive (hung)" if live else "its node still reporting"
            evidence = Evidence(
                metric=m.ROLLOUT_ENGINE_UP,
                values=cap_points([(p.ts, p.value) for p in run]),
                window_seconds=window,
                threshold=0.0,
                detail=f"{engine} of {subject.role}-{subject.rank} has not answered its health "
                f"probe for {world.now - start:.0f}s (after {window:.0f}s) with {why}",
            )
            kind = FaultKind.ROLLOUT_ENGINE_HUNG if live else FaultKind.ROLLOUT_ENGINE_DOWN
            out.append(self.signal(world, kind, subject, evidence, since=start, engine=engine))
        return out


class EngineStalledDetector(Detector):
    """An engine dead inside a live worker, seen from progress (see the module docstring).

    The same kind as the probe's, ``rollout_engine_down``, on purpose: the fault is the same
    (the engine is dead, the worker around it lives), so is the repair (``restart_role``
    restarts that rollout, its engine with it: the plan the probe's case already has), and a
    participant seen both ways is one incident, not two. ``rollout_down`` would say the wrong
    thing: a worker gone, heartbeat and all (its plan also moves the batches of a node that
    may not come back). The evidence says which way it was seen (``reason``: ``no_progress``).
    """

    metrics = (m.ROLLOUT_ENGINE_UP,)
    # Throughput: read in place, the rollouts' only (ParticipantSeries.rings).
    lookups = (m.ROLLOUT_TOKENS_PER_SECOND, m.ROLLOUT_PENDING_COUNT)

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self.filters = {m.ROLLOUT_ENGINE_UP: Threshold("le", 0.0)}  # only failing probes come
        self.startup = StartupGrace(policy)
        self._throughput = ParticipantSeries(m.ROLLOUT_TOKENS_PER_SECOND)
        self._pending = ParticipantSeries(m.ROLLOUT_PENDING_COUNT)
        # stalled participant → (its step, since when we have seen that step)
        self._steps: dict[ParticipantKey, tuple[int, float]] = {}

    def detect(self, world: World) -> list[FaultSignal]:
        cfg = self.policy.detection
        oldest = world.now - cfg.stale_sample_seconds
        zero: dict[ParticipantKey, SeriesKey] = {}
        for rings in self._throughput.rings(world, cfg.rollout.roles).values():
            for points, key, pkey in rings:
                if points:
                    ts, value = points[-1]
                    if value <= 0 and ts >= oldest:
                        zero[pkey] = key
        probe_down = set()
        for key, point in world.series(m.ROLLOUT_ENGINE_UP):
            if point.value <= 0:
                sub = subject_of(key)
                probe_down.add((sub.job, sub.role, sub.rank))
        roles, now, check = cfg.rollout.roles, world.now, self.startup.check
        under_way, start_phases = self.startup.under_way, self.startup.phases
        steps: dict[ParticipantKey, tuple[int, float]] = {}
        out: list[FaultSignal] = []
        for p in world.participants:
            # Every rollout goes through the start-up check on every tick (it must see a start
            # when it begins); the rest only for the few generating nothing.
            if (
                p.role not in roles
                or ((under_way or p.phase in start_phases) and check(p, now) is not None)
                or not zero
            ):
                continue
            pkey = (p.job, p.role, p.rank)
            stalled = zero.get(pkey)
            if stalled is None:
                continue  # generating
            prev = self._steps.get(pkey)
            steps[pkey] = prev if prev is not None and prev[0] == p.step else (p.step, now)
            if (
                p.phase in cfg.heartbeat.finished_phases
                or now - p.last_heartbeat_ts >= cfg.heartbeat.suspect_seconds
                or pkey in probe_down
            ):
                continue  # gone on purpose; heartbeat late (the stall detector's); the probe's
            sig = self._judge(world, p, stalled, steps[pkey][1])
            if sig is not None:
                out.append(sig)
        self._steps = steps
        return out

    def _judge(
        self, world: World, p: ParticipantView, key: SeriesKey, step_since: float
    ) -> FaultSignal | None:
        timeout = self.policy.detection.rollout.stall_timeout_seconds
        if any(
            (pt := world.store.latest(k)) is not None and pt.value > 0
            for k in self._throughput.of(world, p.key)
        ):
            return None  # another of its series (its engine's) still generates
        points = world.store.since(key, world.now - 2 * timeout)
        run = breach_run(points, lambda v: v <= 0)
        if not run:
            return None
        start = self.sticky_since(key, run[0].ts, open_ended=len(run) == len(points))
        if world.now - start < timeout:
            return None
        pending = [
            pts for k in self._pending.of(world, p.key) if (pts := world.store.since(k, start))
        ]
        if not pending:
            return None  # nothing says that work waits for it
        pts = max(pending, key=lambda s: s[-1].value)
        if not self.fresh(world, pts[-1]):
            return None
        first, last = pts[0].value, pts[-1].value
        if last > first:
            why = f"its pending rollouts rose from {first:g} to {last:g}"
        elif world.now - step_since >= timeout and min(pt.value for pt in pts) > 0:
            why = (
                f"its step stayed at {p.step} for {world.now - step_since:.0f}s with {last:g} "
                f"rollouts pending"
            )
        else:
            return None  # nothing piles up: waiting on a tool
        hb_age = world.now - p.last_heartbeat_ts
        evidence = Evidence(
            metric=m.ROLLOUT_PENDING_COUNT,
            values=cap_points([(pt.ts, pt.value) for pt in pts]),
            window_seconds=timeout,
            threshold=first,
            detail=f"the engine of {p.role}-{p.rank} generated no tokens for "
            f"{world.now - start:.0f}s while its worker's heartbeat is alive ({hb_age:.0f}s "
            f"ago) and {why}: an engine dead inside a live worker",
        )
        return self.signal(
            world,
            FaultKind.ROLLOUT_ENGINE_DOWN,
            participant_subject(p),
            evidence,
            since=start,
            step=p.step,
            engine=key.label(m.LABEL_ENGINE) or "engine",
            reason="no_progress",
        )


class EngineProcessDeadDetector(Detector):
    """``rollout_engine_dead``: a process of the engine's tree (APIServer, EngineCore, Worker)
    that its node saw is gone. Certain, so no window: the agent's gauge rising to 1 also runs
    the tick at once (the event path, ``app/ingest/certain.py``). A dead engine is dead during
    its start-up too (a crash while loading): no grace."""

    metrics = (m.ROLLOUT_ENGINE_PROCESS_DEAD,)

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self.filters = {m.ROLLOUT_ENGINE_PROCESS_DEAD: AT_LEAST_ONE}  # only dead levels come

    def detect(self, world: World) -> list[FaultSignal]:
        dead: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[SeriesKey, Point]]] = {}
        if not world.series(m.ROLLOUT_ENGINE_PROCESS_DEAD):
            return []
        # an engine whose participant has finished on purpose (its job stopped it) is not dead
        done = self.policy.detection.heartbeat.finished_phases
        finished = {p.key for p in world.participants if p.phase in done}
        for key, latest in world.series(m.ROLLOUT_ENGINE_PROCESS_DEAD):
            if latest.value >= 1 and self.fresh(world, latest):
                of = engine_key(key, m.ROLLOUT_ENGINE_PROCESS_DEAD)
                dead.setdefault((of.node, of.labels), []).append((key, latest))
        out: list[FaultSignal] = []
        for levels in dead.values():  # one signal per engine, naming every dead level
            key = levels[0][0]
            subject = subject_of(key)
            if (subject.job, subject.role, subject.rank) in finished:
                continue
            names = sorted(k.label(m.LABEL_PROCESS) or "?" for k, _ in levels)
            points = world.store.since(key, world.now - self.policy.detection.stale_sample_seconds)
            run = breach_run(points, lambda v: v >= 1) or [levels[0][1]]
            start = self.sticky_since(key, run[0].ts, open_ended=len(run) == len(points))
            engine = key.label(m.LABEL_ENGINE) or "engine"
            evidence = Evidence(
                metric=m.ROLLOUT_ENGINE_PROCESS_DEAD,
                values=cap_points([(p.ts, p.value) for p in run]),
                window_seconds=0.0,
                threshold=1.0,
                detail=f"{engine} of {subject.role}-{subject.rank}: its {', '.join(names)} "
                f"process{'es' if len(names) > 1 else ''} exited (seen by its node's agent)",
            )
            out.append(
                self.signal(
                    world,
                    FaultKind.ROLLOUT_ENGINE_DEAD,
                    subject,
                    evidence,
                    since=start,
                    engine=engine,
                    processes=names,
                )
            )
        return out


def _increase(points: list[Point]) -> float:
    """How much a counter rose over ``points`` (a reset, an engine restarted, counts from 0)."""
    total = 0.0
    for prev, cur in zip(points, points[1:], strict=False):
        total += cur.value - prev.value if cur.value >= prev.value else cur.value
    return total


class EngineWedgedDetector(Detector):
    """``rollout_engine_wedged``: the engine answers ``/health`` and has requests running or
    waiting, but generated no token for ``wedged_seconds``. vLLM answers ``/health`` from its
    API server's loop, so a scheduler that stopped stepping (a deadlock, a worker stuck in a
    kernel, vLLM's own ``/pause``) keeps answering 200; its request gauges then hold their
    last value, which is how a stalled queue shows. An idle engine (nothing running or
    waiting) generating nothing is healthy, and so is one in its start-up grace."""

    metrics = (m.ROLLOUT_ENGINE_REQUESTS_RUNNING, m.ROLLOUT_ENGINE_REQUESTS_WAITING)

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        busy = Threshold("gt", 0.0)  # only engines with requests come
        self.filters = {
            m.ROLLOUT_ENGINE_REQUESTS_RUNNING: busy,
            m.ROLLOUT_ENGINE_REQUESTS_WAITING: busy,
        }

    def detect(self, world: World) -> list[FaultSignal]:
        window = self.policy.detection.engine.wedged_seconds
        engines: dict[SeriesKey, SeriesKey] = {}  # the engine's tokens series → a busy gauge
        for name in self.metrics:
            for key, latest in world.series(name):
                if latest.value > 0 and self.fresh(world, latest):
                    engines.setdefault(engine_key(key, m.ROLLOUT_TOKENS_GENERATED_TOTAL), key)
        out: list[FaultSignal] = []
        for tokens_key, busy_key in engines.items():
            sig = self._judge(world, tokens_key, busy_key, window)
            if sig is not None:
                out.append(sig)
        return out

    def _judge(
        self, world: World, tokens_key: SeriesKey, busy_key: SeriesKey, window: float
    ) -> FaultSignal | None:
        up = world.store.latest(engine_key(busy_key, m.ROLLOUT_ENGINE_UP))
        if up is None or up.value <= 0 or not self.fresh(world, up):
            return None  # not answering: the probe's detector
        lookback = world.now - 2 * window
        busy = [
            pts
            for name in self.metrics
            if (pts := world.store.since(engine_key(busy_key, name), lookback))
        ]
        # the run of samples with something running or waiting, newest first
        merged: dict[float, float] = {}
        for pts in busy:
            for p in pts:
                merged[p.ts] = merged.get(p.ts, 0.0) + p.value
        run = breach_run([Point(ts, v) for ts, v in sorted(merged.items())], lambda v: v > 0)
        if not run:
            return None
        if world.now - run[0].ts < window:
            return None  # not busy for a whole window
        tokens = world.store.since(tokens_key, lookback)
        if not tokens or not self.fresh(world, tokens[-1]):
            return None  # its counter is not reported: nothing to judge by
        last = tokens[-1].value
        flat = breach_run(tokens, lambda v: v == last)
        # stalled since the later of its last token and the start of its busy run (kept while
        # it lasts beyond the lookback)
        open_ended = len(flat) == len(tokens) and len(run) == len(merged)
        start = self.sticky_since(tokens_key, max(flat[0].ts, run[0].ts), open_ended=open_ended)
        if world.now - start < window or engine_starting(self, world, busy_key) is not None:
            return None
        stalled_since = start
        subject = subject_of(busy_key)
        engine = busy_key.label(m.LABEL_ENGINE) or "engine"
        evidence = Evidence(
            metric=m.ROLLOUT_TOKENS_GENERATED_TOTAL,
            values=cap_points([(p.ts, p.value) for p in tokens]),
            window_seconds=window,
            threshold=0.0,
            detail=f"{engine} of {subject.role}-{subject.rank} answers /health but generated no "
            f"token for {world.now - stalled_since:.0f}s with {run[-1].value:g} requests "
            f"running or waiting (wedged after {window:.0f}s)",
        )
        return self.signal(
            world,
            FaultKind.ROLLOUT_ENGINE_WEDGED,
            subject,
            evidence,
            since=stalled_since,
            engine=engine,
        )


class EngineCounterDetector(Detector):
    """Counters of one engine rising too fast within a window: requests finishing in an error
    or aborted (``rollout_engine_requests_failing``: at least ``failing_min_requests`` and
    ``failing_ratio`` of all finished), preemptions (``rollout_engine_preemption_storm``, light:
    its KV cache is exhausted and requests are evicted and recomputed)."""

    metrics = (m.ROLLOUT_ENGINE_REQUESTS_FINISHED, m.ROLLOUT_ENGINE_PREEMPTIONS)

    def detect(self, world: World) -> list[FaultSignal]:
        cfg = self.policy.detection.engine
        out: list[FaultSignal] = []
        for key, latest in world.series(m.ROLLOUT_ENGINE_REQUESTS_FINISHED):
            if self.fresh(world, latest):
                sig = self._failing(world, key, cfg.failing_window_seconds)
                if sig is not None:
                    out.append(sig)
        for key, latest in world.series(m.ROLLOUT_ENGINE_PREEMPTIONS):
            if not self.fresh(world, latest):
                continue
            window = cfg.preemption_window_seconds
            points = world.store.since(key, world.now - window)
            rose = _increase(points)
            if rose < cfg.preemptions_min:
                continue
            subject = subject_of(key)
            engine = key.label(m.LABEL_ENGINE) or "engine"
            evidence = Evidence(
                metric=m.ROLLOUT_ENGINE_PREEMPTIONS,
                values=cap_points([(p.ts, p.value) for p in points]),
                window_seconds=window,
                threshold=float(cfg.preemptions_min),
                detail=f"{engine} of {subject.role}-{subject.rank} preempted {rose:g} requests "
                f"in {window:.0f}s (a storm from {cfg.preemptions_min}): its KV cache is "
                f"exhausted",
            )
            since = self.sticky_since(key, points[0].ts, open_ended=True)
            out.append(
                self.signal(
                    world,
                    FaultKind.ROLLOUT_ENGINE_PREEMPTION_STORM,
                    subject,
                    evidence,
                    since=since,
                    engine=engine,
                )
            )
        return out

    def _failing(self, world: World, key: SeriesKey, window: float) -> FaultSignal | None:
        cfg = self.policy.detection.engine
        since = world.now - window
        finished = _increase(world.store.since(key, since))
        failed_points: list[Point] = []
        failed = 0.0
        for name in (m.ROLLOUT_ENGINE_REQUESTS_ERRORED, m.ROLLOUT_ENGINE_REQUESTS_ABORTED):
            pts = world.store.since(engine_key(key, name), since)
            failed += _increase(pts)
            failed_points = failed_points or pts
        if failed < cfg.failing_min_requests or failed < cfg.failing_ratio * max(finished, 1):
            return None
        subject = subject_of(key)
        engine = key.label(m.LABEL_ENGINE) or "engine"
        evidence = Evidence(
            metric=m.ROLLOUT_ENGINE_REQUESTS_ERRORED,
            values=cap_points([(p.ts, p.value) for p in failed_points]),
            window_seconds=window,
            threshold=float(cfg.failing_min_requests),
            detail=f"{engine} of {subject.role}-{subject.rank}: {failed:g} of the {finished:g} "
            f"requests it finished in {window:.0f}s ended in an error or were aborted",
        )
        start = self.sticky_since(key, since, open_ended=True)
        return self.signal(
            world,
            FaultKind.ROLLOUT_ENGINE_REQUESTS_FAILING,
            subject,
            evidence,
            since=start,
            engine=engine,
        )
