"""Replay a recorded trace through a fresh, in-process series store and policy engine.

A trace is JSON lines, one ingest batch per line, exactly the body of ``POST /api/v1/ingest``
(``agent_id``, ``node``, ``seq``, ``sent_at``, ``samples``, ``participants``, ``fingerprint``);
the agent writes one with ``--record FILE``. Files ending in ``.gz`` are read compressed.

Time is the replay clock: it starts at the first batch's receive time and the engine ticks
every ``tick_seconds`` of trace time, as fast as the machine allows (or ``speed`` times real
time). A batch's receive time is its ``received_at`` when the trace has one (the server's clock,
which an agent with a wrong clock does not share), else its ``sent_at``; as on the live server,
a node's clock offset is estimated from the two and its stamps corrected
(``app.ingest.clock_skew``), and a node was last seen when its batch was received.
A labels file beside the trace (``<trace>.labels.json``) makes replay also score the result.
"""

from __future__ import annotations

import gzip
import json
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.config import IngestLimits
from app.ingest.clock_skew import ClockOffsets, offset_sample
from app.ingest.validation import ValidBatch
from app.policy.clock import ManualClock
from app.policy.engine import DecisionType, IncidentDecision, PolicyEngine
from app.policy.policy_file import Policy, default_policy
from app.policy.signals import Tier
from app.policy.world import ParticipantView, World
from app.series.store import SeriesKey, SeriesStore
from recovery.protocol.samples import ParticipantReport


class TraceError(ValueError):
    """A trace line is not an ingest batch; the message names the line and the field."""


def read_trace(path: str | Path) -> Iterator[dict[str, Any]]:
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                batch = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{p}:{lineno}: not JSON: {exc.msg}") from None
            _check_batch(batch, f"{p}:{lineno}")
            yield batch


def _check_batch(batch: Any, where: str) -> None:
    if not isinstance(batch, dict):
        raise TraceError(f"{where}: a batch must be a JSON object")
    for name, types in (("node", str), ("sent_at", (int, float)), ("samples", list)):
        if not isinstance(batch.get(name), types):
            raise TraceError(f"{where}: field {name!r} missing or of the wrong type")
    for name in ("sent_at", "received_at"):
        value = batch.get(name, 0.0)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise TraceError(f"{where}: {name} must be a finite number")


def received_at(batch: dict[str, Any]) -> float:
    """When the server received ``batch`` (the trace's ``received_at``, else ``sent_at``)."""
    return float(batch.get("received_at", batch["sent_at"]))


def compress(batches: Iterable[dict[str, Any]], factor: float) -> Iterator[dict[str, Any]]:
    """``batches`` with trace time running ``factor`` times faster: every stamp (``sent_at``,
    ``received_at``, sample and heartbeat ``ts``) moved to ``origin + (t - origin) / factor``,
    the origin being the first batch's receive time. Replay it with the policy's durations
    scaled by the same factor (:meth:`Policy.time_scaled`, ``replay(time_scale=)``) and it
    should be judged as the original is, each delay ``factor`` times shorter: what a detector
    decides depends on durations, not on the clock's reading. Sample values are left as they
    are (a job's own step time, a latency, a throughput are figures compared with each other
    or with thresholds, not trace time)."""
    if not factor > 0:
        raise ValueError(f"time compression factor must be positive, got {factor}")
    origin: float | None = None

    def moved(t: float) -> float:
        assert origin is not None
        return origin + (t - origin) / factor

    for batch in batches:
        if origin is None:
            origin = received_at(batch)
        out = {
            **batch,
            "sent_at": moved(float(batch["sent_at"])),
            "samples": [{**x, "ts": moved(float(x["ts"]))} for x in batch["samples"]],
            "participants": [
                {**x, "ts": moved(float(x["ts"]))} for x in batch.get("participants") or []
            ],
        }
        if "received_at" in batch:
            out["received_at"] = moved(float(batch["received_at"]))
        yield out


def compress_labels(labels: dict[str, Any], factor: float, origin: float) -> dict[str, Any]:
    """Labels of a trace compressed by :func:`compress` (``origin``: its first receive time)."""
    return {
        **labels,
        "expect": [
            {**e, "start": origin + (e["start"] - origin) / factor, "window": e["window"] / factor}
            for e in labels.get("expect", [])
        ],
    }


class ReplayIngest:
    """The bits of the server's ingest the policy engine reads, kept in memory.

    ``time_scale``: the trace was compressed by this factor (:func:`compress`), so the clock
    correction's threshold is scaled as the policy's durations are."""

    def __init__(self, store: SeriesStore, *, time_scale: float = 1.0) -> None:
        self.store = store
        self.participants: dict[tuple[str, str, int], ParticipantView] = {}
        self.node_last_seen: dict[str, float] = {}
        self.fingerprints: dict[str, dict[str, str]] = {}
        self.clock_offsets = ClockOffsets(IngestLimits().clock_correct_above_seconds / time_scale)

    def apply(self, batch: dict[str, Any]) -> None:
        node = batch["node"]
        received = received_at(batch)
        valid, offset = self.clock_offsets.correct(_as_valid(batch), received)
        self.store.extend(valid.samples)
        if offset is not None:
            self.store.extend([offset_sample(node, offset, received)])
        for p in valid.participants:
            view = ParticipantView(
                job=p.job,
                role=p.role,
                rank=p.rank,
                node=node,
                phase=p.phase,
                step=p.step,
                last_heartbeat_ts=p.ts,
            )
            self.participants[view.key] = view
        self.node_last_seen[node] = max(self.node_last_seen.get(node, 0.0), received)
        if batch.get("fingerprint"):
            self.fingerprints[node] = dict(batch["fingerprint"])

    def world(self, now: float) -> World:
        return World(
            now=now,
            store=self.store,
            participants=list(self.participants.values()),
            node_last_seen=dict(self.node_last_seen),
            fingerprints=self.fingerprints,
        )


def _as_valid(batch: dict[str, Any]) -> ValidBatch:
    """A trace line as the server's validation hands it on (the trace was checked on reading)."""
    node = batch["node"]
    return ValidBatch(
        agent_id=str(batch.get("agent_id", "")),
        node=node,
        seq=int(batch.get("seq", 0)),
        sent_at=float(batch["sent_at"]),
        samples=[
            (
                SeriesKey.of(node, s["name"], s.get("labels") or {}),
                float(s["ts"]),
                float(s["value"]),
            )
            for s in batch["samples"]
        ],
        participants=[
            ParticipantReport(
                p["job"], p["role"], int(p["rank"]), p["phase"], int(p["step"]), float(p["ts"])
            )
            for p in batch.get("participants") or []
        ],  # fmt: skip
        fingerprint=batch.get("fingerprint"),
    )


@dataclass(slots=True)
class ReplayResult:
    decisions: list[IncidentDecision] = field(default_factory=list)
    ticks: int = 0
    start_ts: float = 0.0
    trace_seconds: float = 0.0
    wall_seconds: float = 0.0

    @property
    def opened(self) -> list[IncidentDecision]:
        return [d for d in self.decisions if d.type is DecisionType.OPEN]


def replay(
    batches: Iterable[dict[str, Any]],
    *,
    policy: Policy | None = None,
    speed: float | None = None,
    tail_seconds: float = 0.0,
    sleep: Callable[[float], None] = time.sleep,
    time_scale: float = 1.0,
) -> ReplayResult:
    """Feed ``batches`` in order, ticking the engine on the replay clock. ``time_scale``: the
    batches were time-compressed by this factor (the caller scales the policy too)."""
    policy = policy or default_policy()
    if speed is not None and speed <= 0:
        raise ValueError(f"speed must be positive, got {speed}")
    ingest = ReplayIngest(SeriesStore(), time_scale=time_scale)
    engine = PolicyEngine(policy)
    result = ReplayResult()
    clock: ManualClock | None = None
    next_tick = 0.0
    started = time.perf_counter()

    def tick_until(t: float) -> None:
        nonlocal next_tick
        assert clock is not None
        while next_tick <= t:
            if speed is not None:
                sleep((next_tick - clock.now()) / speed)
            clock.advance_to(next_tick)
            result.decisions.extend(engine.tick(ingest.world(clock.now())).decisions)
            result.ticks += 1
            next_tick += policy.tick_seconds

    first = None
    last = None
    for batch in batches:
        sent = received_at(batch)
        if clock is None:
            clock = ManualClock(sent)
            first = sent
            result.start_ts = sent
            next_tick = sent + policy.tick_seconds
        tick_until(sent)
        ingest.apply(batch)
        last = max(last or sent, sent)
    if clock is not None and last is not None and first is not None:
        tick_until(last + tail_seconds)
        result.trace_seconds = last - first
    result.wall_seconds = time.perf_counter() - started
    return result


# -- scoring against labels -------------------------------------------------------------------


# The bar a labelled corpus must clear (issue "Detection v2"): what `rlguard replay --check`
# holds it to. Every delay must also be within its label's window + the scoring slack.
MIN_PRECISION = 0.98
MIN_RECALL = 0.98


@dataclass(slots=True)
class Score:
    expected: int = 0
    matched: int = 0
    opened: int = 0
    false_positive: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)
    false_heavy: list[str] = field(default_factory=list)
    late: list[str] = field(default_factory=list)
    delays: list[float] = field(default_factory=list)

    def add(self, other: Score) -> None:
        self.expected += other.expected
        self.matched += other.matched
        self.opened += other.opened
        self.false_positive += other.false_positive
        self.missed += other.missed
        self.false_heavy += other.false_heavy
        self.late += other.late
        self.delays += other.delays

    @property
    def precision(self) -> float:
        true_opens = self.opened - len(self.false_positive)
        return true_opens / self.opened if self.opened else 1.0

    @property
    def recall(self) -> float:
        return self.matched / self.expected if self.expected else 1.0

    def problems(self) -> list[str]:
        """One line per miss, false positive, false heavy tier and late detection."""
        return [
            f"{label}: {item}"
            for label, items in (
                ("missed", self.missed),
                ("false positive", self.false_positive),
                ("false heavy", self.false_heavy),
                ("late", self.late),
            )
            for item in items
        ]

    @property
    def clears_bar(self) -> bool:
        """Whether this score meets what a labelled corpus is held to (``--check``)."""
        return (
            self.precision >= MIN_PRECISION
            and self.recall >= MIN_RECALL
            and not self.false_heavy
            and not self.late
        )


def _subject_matches(want: dict[str, Any], got: dict[str, Any]) -> bool:
    return all(str(got.get(k)) == str(v) for k, v in want.items())


def score(result: ReplayResult, labels: dict[str, Any], *, slack_seconds: float = 2.0) -> Score:
    """Match opened incidents to the labelled faults.

    An expected fault is found by an incident of the same kind whose subject contains the
    label's subject, opened no earlier than the fault's start; its delay must be at most the
    label's window + ``slack_seconds``. Every other opened incident is a false positive.
    """
    sc = Score(expected=len(labels.get("expect", [])))
    opens = result.opened
    sc.opened = len(opens)
    used: set[int] = set()
    escalations = [d for d in result.decisions if d.type is DecisionType.ESCALATE]
    for exp in labels.get("expect", []):
        if exp.get("decision") == "escalate":
            _score_escalation(sc, exp, escalations, labels, slack_seconds)
            continue
        found = None
        for i, d in enumerate(opens):
            if i in used or d.kind.value != exp["kind"]:
                continue
            if not _subject_matches(exp.get("subject", {}), d.subject.to_dict()):
                continue
            if d.at < exp["start"] - 1e-6:
                continue
            found = i
            break
        name = f"{labels.get('name', '?')}:{exp['kind']}"
        if found is None:
            sc.missed.append(name)
            continue
        used.add(found)
        sc.matched += 1
        d = opens[found]
        delay = d.at - exp["start"]
        sc.delays.append(delay)
        if delay > exp["window"] + slack_seconds:
            sc.late.append(f"{name} after {delay:.3f}s (window {exp['window']}s)")
        if d.tier is Tier.HEAVY and exp.get("tier") != "heavy":
            sc.false_heavy.append(name)
    for i, d in enumerate(opens):
        if i not in used:
            sc.false_positive.append(f"{labels.get('name', '?')}:{d.key}@{d.at:.3f}")
            if d.tier is Tier.HEAVY:
                sc.false_heavy.append(d.key)
    return sc


def _score_escalation(
    sc: Score,
    exp: dict[str, Any],
    escalations: list[IncidentDecision],
    labels: dict[str, Any],
    slack_seconds: float,
) -> None:
    name = f"{labels.get('name', '?')}:escalate:{exp['kind']}"
    for d in escalations:
        if (
            d.kind.value == exp["kind"]
            and _subject_matches(exp.get("subject", {}), d.subject.to_dict())
            and d.at >= exp["start"] - 1e-6
        ):
            sc.matched += 1
            delay = d.at - exp["start"]
            sc.delays.append(delay)
            if delay > exp["window"] + slack_seconds:
                sc.late.append(f"{name} after {delay:.3f}s (window {exp['window']}s)")
            return
    sc.missed.append(name)


def labels_path(trace: Path) -> Path:
    name = trace.name.removesuffix(".gz").removesuffix(".jsonl")
    return trace.with_name(f"{name}.labels.json")


def format_report(result: ReplayResult, sc: Score | None = None) -> list[str]:
    lines = [
        f"replayed {result.trace_seconds:.0f}s of trace in {result.wall_seconds:.2f}s "
        f"({result.ticks} ticks)"
    ]
    for d in result.decisions:
        delay = d.detection_delay
        shown = (
            f" detected after {delay:.3f}s"
            if d.type is DecisionType.OPEN and delay is not None
            else ""
        )
        acts = ", ".join(a.action.value + ("*" if a.needs_approval else "") for a in d.actions)
        reason = f" because {'; '.join(d.reasons)}" if d.reasons else ""
        lines.append(
            # Milliseconds, as the engine saw them (its clock is the trace's float seconds).
            f"t+{d.at - result.start_ts:<9.3f} {d.type.value:8} {d.tier.value:6} "
            f"{d.key}{shown}{reason}" + (f" plan: {acts}" if acts else "")
        )
    if sc is not None:
        lines.append(
            f"expected {sc.expected}, found {sc.matched}, opened {sc.opened}: "
            f"precision {sc.precision:.3f} recall {sc.recall:.3f}"
        )
        lines.extend(sc.problems())
    return lines


def replay_file(
    trace: str | Path,
    *,
    speed: float | None = None,
    policy_path: str | Path | None = None,
    tail_seconds: float = 0.0,
    compress_by: float = 1.0,
) -> tuple[ReplayResult, Score | None]:
    """Replay one trace file (and score it when a labels file sits beside it).

    ``compress_by`` > 1 replays it time-compressed (:func:`compress`) under the policy with
    its durations scaled alike, and scores it against its labels compressed the same way; the
    slack on each delay is then 2 s of the original's time plus one compressed tick (moved
    stamps are not exact, and a comparison may land on the next tick)."""
    from app.policy.policy_file import load_policy

    path = Path(trace)
    if not path.is_file():
        raise TraceError(f"trace file not found: {path}")
    if not (math.isfinite(compress_by) and compress_by >= 1):
        raise ValueError(f"compression factor must be at least 1, got {compress_by}")
    policy = load_policy(policy_path) if policy_path is not None else default_policy()
    batches: Iterable[dict[str, Any]] = read_trace(path)
    origin = None
    if compress_by != 1:
        policy = policy.time_scaled(compress_by)
        listed = list(batches)
        origin = received_at(listed[0]) if listed else 0.0
        batches = compress(listed, compress_by)
    result = replay(
        batches, policy=policy, speed=speed, tail_seconds=tail_seconds, time_scale=compress_by
    )
    lp = labels_path(path)
    if not lp.is_file():
        return result, None
    labels = json.loads(lp.read_text())
    if origin is None:
        return result, score(result, labels)
    slack = 2.0 / compress_by + policy.tick_seconds
    return result, score(result, compress_labels(labels, compress_by, origin), slack_seconds=slack)


# -- a corpus: many labelled traces, one verdict ----------------------------------------------


def trace_files(paths: Iterable[str | Path]) -> list[Path]:
    """The trace files named: a file as given, a directory as its ``*.jsonl[.gz]`` files."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted([*p.glob("*.jsonl"), *p.glob("*.jsonl.gz")])
            if not found:
                raise TraceError(f"no trace files (*.jsonl, *.jsonl.gz) in {p}")
            out.extend(found)
        elif p.is_file():
            out.append(p)
        else:
            raise TraceError(f"trace file not found: {p}")
    return out


@dataclass(slots=True)
class CorpusResult:
    total: Score = field(default_factory=Score)
    traces: int = 0
    unlabelled: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  # one per trace

    @property
    def passes(self) -> bool:
        return self.total.clears_bar and not self.unlabelled


def replay_corpus(
    paths: Iterable[str | Path],
    *,
    policy_path: str | Path | None = None,
    compress_by: float = 1.0,
) -> CorpusResult:
    """Replay and score every trace named (each must have its labels file)."""
    out = CorpusResult()
    for trace in trace_files(paths):
        result, sc = replay_file(trace, policy_path=policy_path, compress_by=compress_by)
        out.traces += 1
        if sc is None:
            out.unlabelled.append(trace.name)
            out.lines.append(f"{trace.name}: no labels file ({labels_path(trace).name})")
            continue
        out.total.add(sc)
        worst = max(sc.delays, default=0.0)
        verdict = (
            "ok" if not (sc.missed or sc.false_positive or sc.false_heavy or sc.late) else "FAIL"
        )
        out.lines.append(
            f"{verdict:4} {trace.name}: expected {sc.expected}, found {sc.matched}, opened "
            f"{sc.opened}" + (f", longest delay {worst:.3f}s" if sc.delays else "")
        )
    return out


def format_corpus(corpus: CorpusResult, compress_by: float = 1.0) -> list[str]:
    t = corpus.total
    delays = sorted(t.delays)
    p99 = delays[min(len(delays) - 1, math.ceil(0.99 * len(delays)) - 1)] if delays else 0.0
    lines = list(corpus.lines)
    scaled = f" (time-compressed {compress_by:g}x)" if compress_by != 1 else ""
    lines.append(
        f"corpus{scaled}: {corpus.traces} traces, expected {t.expected}, found {t.matched}, "
        f"opened {t.opened}: precision {t.precision:.3f} (>= {MIN_PRECISION}), recall "
        f"{t.recall:.3f} (>= {MIN_RECALL}), false heavy {len(t.false_heavy)}, late "
        f"{len(t.late)}, delay p99 {p99:.3f}s max {delays[-1] if delays else 0.0:.3f}s"
    )
    lines.extend(t.problems())
    lines.extend(f"unlabelled: {name}" for name in corpus.unlabelled)
    lines.append("corpus: PASS" if corpus.passes else "corpus: FAIL")
    return lines
