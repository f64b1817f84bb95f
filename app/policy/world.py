"""What the policy engine looks at on one tick.

The engine is pure: the server builds a :class:`World` from its live state (the series store,
the participant table kept by ingest, node last-seen times and fingerprints), replay builds one
from a trace. Nothing here touches a database.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.policy.signals import FaultKind, FaultSignal
from app.series.store import Point, SeriesKey, SeriesStore
from app.series.watch import RunRule, SeriesWatch

# The silence kinds: what a node or job being worked on looks like from here (the heartbeat and
# node-silence detectors, and a scheduler taking a node out).
SILENCE_KINDS = frozenset(
    {
        FaultKind.NODE_SILENT,
        FaultKind.NODES_LOST,
        FaultKind.HEARTBEAT_LOST,
        FaultKind.NODE_UNAVAILABLE,
    }
)


@dataclass(frozen=True, slots=True)
class ParticipantView:
    """One training process as the policy sees it (adapted from the Participant rows)."""

    job: str
    role: str
    rank: int
    node: str
    phase: str
    step: int
    last_heartbeat_ts: float

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.job, self.role, self.rank)


ParticipantSource = Callable[[], list[ParticipantView]]


def participants_from_ingest(ingest: Any) -> ParticipantSource:
    """The participants the server's ingest pipeline holds, as the policy sees them."""

    def read() -> list[ParticipantView]:
        return [
            ParticipantView(
                job=p.job,
                role=p.role,
                rank=p.rank,
                node=p.node,
                phase=p.phase,
                step=p.step,
                last_heartbeat_ts=p.ts,
            )
            for p in ingest.participants()
        ]

    return read


@dataclass(frozen=True, slots=True)
class Maintenance:
    """The maintenance windows open now (``app.silences.windows``), as (node, job) scopes where
    None is "any": a node's window, a job's window, or a job's window on one node.

    A node being drained or having its driver updated stops reporting: that is the point of the
    window, not a fault, so the silence kinds are not raised for what it covers. A signal about
    several nodes (``nodes_lost``) is covered only if every node it names is: the others are
    lost for real.
    """

    windows: frozenset[tuple[str | None, str | None]] = frozenset()

    def holds(self, node: str, job: str | None) -> bool:
        """Whether ``node`` (for ``job``, if given) is under an open window."""
        w = self.windows
        return (node, None) in w or (job is not None and ((None, job) in w or (node, job) in w))

    def covers(self, sig: FaultSignal) -> bool:
        if sig.kind not in SILENCE_KINDS or not self.windows:
            return False
        job = sig.subject.job
        if job is not None and (None, job) in self.windows:
            return True  # the job's window covers every node of the job
        listed = sig.extra.get("nodes")
        nodes = set(listed) if isinstance(listed, list) else set()
        if sig.subject.node is not None:
            nodes.add(sig.subject.node)
        return bool(nodes) and all(self.holds(node, job) for node in nodes)


class NodeReturns:
    """When each node came back from a silence, as the policy engine saw it, tick by tick.

    A node that hung as a whole (a kernel stall, a paused VM) or lost its network comes back
    with the heartbeats its agent read last: stale until the processes write again, or, after a
    network outage, the spooled batches replayed oldest first. Judged from their own stamps those
    participants would look silent for the whole outage at once, which was the node's silence
    (an incident of its own), not theirs. So a participant's silence is counted from the later
    of its last heartbeat and its node's return (:meth:`World.heartbeat_silence`): one still
    silent is lost after the usual suspect + confirm time from the return.

    A node counts as silent once the engine saw it quiet for ``suspect_seconds``; its return
    is the receive time of its newest batch at the first tick it is no longer quiet. A return
    is forgotten after ``horizon_seconds`` (the engine: twice suspect + confirm), when the
    participants' own stamps decide either way. The engine keeps this across ticks and a resync; a new server
    process starts with every node that reports again after the restart's gap as returned.
    """

    def __init__(self, suspect_seconds: float, horizon_seconds: float) -> None:
        self.suspect_seconds = suspect_seconds
        self.horizon_seconds = horizon_seconds
        self._silent: set[str] = set()
        self._back: dict[str, float] = {}

    def update(self, now: float, node_last_seen: Mapping[str, float]) -> dict[str, float]:
        """Note this tick's silences and returns; the returns still remembered, by node."""
        for node, seen in node_last_seen.items():
            if now - seen >= self.suspect_seconds:
                self._silent.add(node)
                self._back.pop(node, None)
            elif node in self._silent:
                self._silent.discard(node)
                self._back[node] = seen
        if self._back:
            self._back = {
                n: t
                for n, t in self._back.items()
                if now - t < self.horizon_seconds and n in node_last_seen
            }
        return self._back


@dataclass(slots=True)
class World:
    now: float
    store: SeriesStore
    participants: Sequence[ParticipantView] = ()
    node_last_seen: Mapping[str, float] = field(default_factory=dict)
    # When a node came back from a silence (set by the engine each tick: NodeReturns).
    node_back_at: Mapping[str, float] = field(default_factory=dict)
    fingerprints: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    maintenance: Maintenance = field(default_factory=Maintenance)
    # Latest point of every series the detectors read, grouped by metric name: built once per
    # tick (one pass over the store) instead of once per detector.
    latest: dict[str, list[tuple[SeriesKey, Point]]] = field(default_factory=dict)

    # The index the snapshot came from (for lazy look-ups of names not read every tick).
    index: LatestIndex | None = None
    # Per job its highest step, per node its jobs (sorted): built on first use, as several
    # signals a tick ask and each question was a pass over every participant.
    _by_job_and_node: tuple[dict[str, int], dict[str, list[str]]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def index_latest(self, names: Iterable[str], index: LatestIndex | None = None) -> None:
        self.index = index or LatestIndex(names)
        self.latest = self.index.snapshot(self.store)

    def all_series(self, name: str) -> list[tuple[SeriesKey, Point]]:
        """Every series of ``name`` with its newest point, unfiltered (computed on demand)."""
        if self.index is not None and name in self.index.names:
            return self.index.read(name)
        return [(k, p) for k, p in self.store.items() if k.name == name]

    def rings(self, name: str) -> list[tuple[SeriesKey, Sequence[tuple[float, float]]]]:
        """Every series of ``name`` with its sample buffer, read in place (newest last).

        For a detector that reads every series of a name on every tick: ``buffer[-1]`` is the
        newest sample, with no Point and no list of points built per tick (objects that live
        through a tick are promoted by the garbage collector and bring on full collections,
        hundreds of ms over the series store). Read-only; safe without the store's lock for
        the reason given in :class:`LatestIndex`."""
        if self.index is not None and name in self.index.names:
            return self.index.rings(name)
        with self.store._lock:  # noqa: SLF001 - see LatestIndex
            return [(k, s.points) for k, s in self.store._series.items() if k.name == name]  # noqa: SLF001

    def series_count(self, name: str, node: str) -> int:
        """How many series of ``name`` the node has (e.g. its GPU count)."""
        if self.index is not None:
            return self.index.count(name, node)
        return len(self.store.keys(node=node, name=name))

    def series(self, name: str) -> list[tuple[SeriesKey, Point]]:
        return self.latest.get(name, [])

    def breach_runs(self, name: str) -> list[tuple[SeriesKey, float, Point]]:
        """The series of a ``BreachRun`` name in a run that breached: (key, ts of the run's
        newest breaching sample, newest point), in the store's order."""
        return self.index.breach_runs(name) if self.index is not None else []

    def heartbeat_silence(self, p: ParticipantView) -> float:
        """Seconds ``p`` has been silent: since its last heartbeat or, when later, since its
        node came back from a silence of its own (see :class:`NodeReturns`)."""
        back = self.node_back_at.get(p.node)
        last = p.last_heartbeat_ts if back is None else max(p.last_heartbeat_ts, back)
        return self.now - last

    def jobs_on_node(self, node: str) -> list[str]:
        return list(self._participant_index()[1].get(node, ()))

    def job_step(self, job: str) -> int | None:
        return self._participant_index()[0].get(job)

    def _participant_index(self) -> tuple[dict[str, int], dict[str, list[str]]]:
        if self._by_job_and_node is None:
            steps: dict[str, int] = {}
            jobs: dict[str, set[str]] = {}
            for p in self.participants:
                if p.job not in steps or p.step > steps[p.job]:
                    steps[p.job] = p.step
                jobs.setdefault(p.node, set()).add(p.job)
            self._by_job_and_node = (steps, {n: sorted(js) for n, js in jobs.items()})
        return self._by_job_and_node


class LatestIndex:
    """The series of the metrics the detectors read, grouped by name, kept between ticks.

    Two ways of reading, by what a name's filter asks (``Detector.filters``):

    - A filtered name (a :class:`Threshold`, ``CHANGED``, or a :class:`BreachRun`) is a
      standing question to the store (``app.series.watch``): ingest keeps its answer up
      to date as samples arrive, and the snapshot reads only the series in it. At 1,000 nodes
      x 8 GPUs a pass over every series' newest sample was most of the tick (a memory read per
      buffer, sample and value, 144,000 times), almost always to find nothing.
    - A name read whole, or on demand (``all_series``, ``rings``), comes from the buffers
      themselves: the index remembers, per name, the store's ring buffers and reads their
      newest point. It is rebuilt (one pass, under the store's lock) when the store created or
      dropped a series (``SeriesStore.layout``), and only then: a rebuild at 1,000 nodes x 8
      GPUs costs several ticks' worth. Reading ``deque[-1]`` without the lock is safe: the store
      appends and trims under its lock and never empties a live buffer.

    Whatever the way, a name's series come in the store's order (the order a full pass would
    see them in), so that signals, and the incidents and evidence chosen among them, do not
    depend on the order samples arrived in.
    """

    def __init__(
        self,
        names: Iterable[str],
        *,
        filters: dict[str, SampleFilter] | None = None,
    ) -> None:
        self.names = frozenset(names)
        # name → Threshold, CHANGED or BreachRun (a standing question), or None: on demand only;
        # names without a filter come back whole.
        self.filters = dict(filters or {})
        self._store: SeriesStore | None = None
        self._watch: SeriesWatch | None = None
        self._layout = -1
        self._by_name: dict[str, list[tuple[SeriesKey, Any]]] = {}
        # Per name, its series' places in the store: made when an answer of that name first
        # needs sorting after a rebuild (a dict of every indexed series cost a rebuild ~40 %).
        self._order: dict[str, dict[SeriesKey, int]] = {}
        self._counts: dict[tuple[str, str], int] | None = None
        self._runs: dict[str, list[tuple[SeriesKey, float, Point]]] = {}

    def _rebuild(self, store: SeriesStore) -> None:
        by_name: dict[str, list[tuple[SeriesKey, Any]]] = {n: [] for n in self.names}
        self._layout, found = store.buffers(self.names)
        for key, ring in found:
            by_name[key.name].append((key, ring))
        self._by_name = by_name
        self._order = {}
        self._counts = None  # counted when first asked for (few ticks ask: GPU failures)
        if store is not self._store:
            self._store = store
            self._watch = store.watch(self._questions())

    def _questions(self) -> SeriesWatch:
        passing, changed, runs = {}, [], {}
        for name, keep in self.filters.items():
            if isinstance(keep, Threshold):
                passing[name] = (keep.compare, keep.value)
            elif isinstance(keep, BreachRun):
                runs[name] = keep.rule
            elif keep is CHANGED:
                changed.append(name)
        return SeriesWatch(passing=passing, changed=changed, runs=runs)

    def snapshot(self, store: SeriesStore) -> dict[str, list[tuple[SeriesKey, Point]]]:
        if store is not self._store or store.layout != self._layout:
            self._rebuild(store)
        assert self._watch is not None
        answers = self._watch.take()
        out: dict[str, list[tuple[SeriesKey, Point]]] = {}
        for found in (answers.passing, answers.changed):
            for name, series in found.items():
                out[name] = [(k, _point(p)) for k, p in self._in_store_order(name, series)]
        self._runs = {
            name: [(k, since, _point(p)) for k, since, p in self._in_store_order(name, series)]
            for name, series in answers.runs.items()
        }
        for name, rings in self._by_name.items():
            if name in self.filters:
                continue  # answered above, or read on demand only (all_series)
            out[name] = [(k, _point(r[-1])) for k, r in rings if r]
        return out

    def _in_store_order(self, name: str, series: list[Any]) -> list[Any]:
        """``series`` of ``name`` (tuples led by a key) sorted as the store holds them; a series
        created since the last rebuild goes last."""
        if len(series) < 2:
            return series
        order = self._order.get(name)
        if order is None:
            rings = self._by_name.get(name, [])
            order = self._order[name] = {key: i for i, (key, _) in enumerate(rings)}
        place, last = order.get, len(order)
        return sorted(series, key=lambda item: place(item[0], last))

    def breach_runs(self, name: str) -> list[tuple[SeriesKey, float, Point]]:
        """For a BreachRun name, the series in a run that breached, as of the last snapshot:
        (key, ts of the run's newest breaching sample, newest point)."""
        return self._runs.get(name, [])

    def read(self, name: str) -> list[tuple[SeriesKey, Point]]:
        out = []
        for key, points in self._by_name.get(name, []):
            if points:
                ts, value = points[-1]
                out.append((key, Point(ts, value)))
        return out

    def rings(self, name: str) -> list[tuple[SeriesKey, Any]]:
        return self._by_name.get(name, [])

    def count(self, name: str, node: str) -> int:
        if self._counts is None:
            counts: dict[tuple[str, str], int] = {}
            for n, rings in self._by_name.items():
                for key, _ in rings:
                    counts[(n, key.node)] = counts.get((n, key.node), 0) + 1
            self._counts = counts
        return self._counts.get((name, node), 0)


@dataclass(frozen=True, slots=True)
class Threshold:
    """Keep a series when its newest value ``op`` ``value`` (op: ge, gt or le)."""

    op: str
    value: float

    @property
    def compare(self) -> Callable[[float, float], bool]:
        """``op`` as a function of (value, bound), for ``map`` over many values in C."""
        return operator.ge if self.op == "ge" else operator.gt if self.op == "gt" else operator.le

    def __call__(self, v: float) -> bool:
        if self.op == "ge":
            return v >= self.value
        if self.op == "gt":
            return v > self.value
        return v <= self.value


@dataclass(frozen=True, slots=True)
class BreachRun:
    """Keep the series in a run of unhealthy samples that holds a breaching one (a golden
    metric's hysteresis, see ``golden_metrics``): read with ``World.breach_runs``."""

    healthy: float
    warning: float
    inclusive: bool

    @property
    def rule(self) -> RunRule:
        return RunRule(operator.ge if self.inclusive else operator.gt, self.warning, self.healthy)


class _Changed:
    def __repr__(self) -> str:
        return "CHANGED"


CHANGED: Any = _Changed()
_point = functools.partial(tuple.__new__, Point)  # Point from a (ts, value) pair, in C
SampleFilter = Any  # Threshold, CHANGED, BreachRun, or None (= on demand only)
