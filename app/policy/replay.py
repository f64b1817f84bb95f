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
from app.ingest.series_store import SeriesKey, SeriesStore
from app.ingest.validation import ParticipantReport, ValidBatch
from app.policy.clock import ManualClock
from app.policy.engine import DecisionType, IncidentDecision, PolicyEngine
from app.policy.policy_file import Policy, default_policy
from app.policy.signals import Tier
from app.policy.world import ParticipantView, World


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


class ReplayIngest:
    """The bits of the server's ingest the policy engine reads, kept in memory."""

    def __init__(self, store: SeriesStore) -> None:
        self.store = store
        self.participants: dict[tuple[str, str, int], ParticipantView] = {}
        self.node_last_seen: dict[str, float] = {}
        self.fingerprints: dict[str, dict[str, str]] = {}
        self.clock_offsets = ClockOffsets(IngestLimits().clock_correct_above_seconds)

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
            (SeriesKey.of(node, s["name"], s.get("labels") or {}), float(s["ts"]), float(s["value"]))
            for s in batch["samples"]
        ],
        participants=[
            ParticipantReport(p["job"], p["role"], int(p["rank"]), p["phase"], int(p["step"]),
                              float(p["ts"]))
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
) -> ReplayResult:
    """Feed ``batches`` in order, ticking the engine on the replay clock."""
    policy = policy or default_policy()
    if speed is not None and speed <= 0:
        raise ValueError(f"speed must be positive, got {speed}")
    ingest = ReplayIngest(SeriesStore())
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
        for label, items in (
            ("missed", sc.missed),
            ("false positive", sc.false_positive),
            ("false heavy", sc.false_heavy),
            ("late", sc.late),
        ):
            for item in items:
                lines.append(f"{label}: {item}")
    return lines


def replay_file(
    trace: str | Path, *, speed: float | None = None, policy_path: str | Path | None = None,
    tail_seconds: float = 0.0,
) -> tuple[ReplayResult, Score | None]:
    """Replay one trace file (and score it when a labels file sits beside it)."""
    from app.policy.policy_file import load_policy

    path = Path(trace)
    if not path.is_file():
        raise TraceError(f"trace file not found: {path}")
    policy = load_policy(policy_path) if policy_path is not None else default_policy()
    result = replay(read_trace(path), policy=policy, speed=speed, tail_seconds=tail_seconds)
    lp = labels_path(path)
    sc = score(result, json.loads(lp.read_text())) if lp.is_file() else None
    return result, sc
