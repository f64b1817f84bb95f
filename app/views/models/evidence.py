"""The Evidence panel of an incident: what the detector judged, in the form that shows the fault.

A signal stores its evidence as a series window, a threshold and a sentence; only some kinds
have a series worth drawing, so each kind gets its own form:

- liveness (``heartbeat_lost``, ``node_silent``, ``nodes_lost``, ``rollout_down``): the
  silence's age when judged against the suspect and confirm thresholds, as a gauge; or "exited"
  when the launcher (or Ray) reported the exit;
- a stuck participant (``train_hang``, ``trainer_idle``): how long against the limit, the step
  it is stuck at and its recent phases;
- ``straggler``: its figure beside its peers' median and the limit;
- GPU events: the counter and its increase, and for an XID its catalogue row;
- an exit cause (``cuda_oom`` ...): the output line that matched;
- anything with a real series (two points or more): the chart.

Every panel also lists the facts the signal carries (metric, threshold, window, step, extra), so
no kind is ever shown empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from app.policy.policy_file import Policy
from app.policy.signals import FaultKind
from app.policy.xid_catalog import entry_of
from app.views.models.charts import ChartSpec

LIVENESS_KINDS = frozenset(
    {FaultKind.HEARTBEAT_LOST, FaultKind.NODE_SILENT, FaultKind.NODES_LOST, FaultKind.ROLLOUT_DOWN}
)
STUCK_KINDS = frozenset({FaultKind.TRAIN_HANG, FaultKind.TRAINER_IDLE})
GPU_EVENT_KINDS = frozenset(
    {
        FaultKind.GPU_XID,
        FaultKind.GPU_ECC_UNCORRECTABLE,
        FaultKind.GPU_ROW_REMAP_FAILURE,
        FaultKind.GPU_LOST,
        FaultKind.GPU_THROTTLED,
    }
)
_OUTPUT_SAID = "its output said: "
# extra keys shown elsewhere in the panel, or internal to the engine
_EXTRA_HIDDEN = frozenset({"newest_at", "line", "median_step_seconds"})
# Kinds whose stored "series" is not one: a heartbeat's last beat, a hang's frozen step number
# (its threshold is in seconds); the gauge says what was judged.
NO_CHART_KINDS = (LIVENESS_KINDS - {FaultKind.ROLLOUT_DOWN}) | {FaultKind.TRAIN_HANG}


@dataclass(frozen=True, slots=True)
class Mark:
    """A threshold on a gauge."""

    label: str
    value: float
    pct: float
    level: str


@dataclass(frozen=True, slots=True)
class Gauge:
    """One value against its thresholds, drawn as a bar (HTML and CSS, no plot)."""

    title: str
    value: float
    unit: str
    pct: float
    level: str
    marks: tuple[Mark, ...]

    @property
    def value_text(self) -> str:
        return (
            f"{self.value:.0f} {self.unit}" if self.value >= 10 else f"{self.value:.1f} {self.unit}"
        )


@dataclass(frozen=True, slots=True)
class Bar:
    label: str
    value: float
    pct: float
    level: str


@dataclass(slots=True)
class EvidencePanel:
    kind: str
    detail: str = ""
    facts: list[tuple[str, str]] = field(default_factory=list)
    gauge: Gauge | None = None
    bars: list[Bar] = field(default_factory=list)
    quote: str | None = None
    phases: list[tuple[str, str]] = field(default_factory=list)  # (when, what)
    chart: ChartSpec | None = None

    @property
    def empty(self) -> bool:
        return not (self.detail or self.facts or self.gauge or self.bars or self.chart)


def _num(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _points(evidence: dict[str, Any]) -> list[tuple[float, float]]:
    out = []
    for item in evidence.get("values") or []:
        if isinstance(item, list | tuple) and len(item) == 2:
            try:
                out.append((float(item[0]), float(item[1])))
            except (TypeError, ValueError):
                continue
    return out


def make_gauge(title: str, value: float, unit: str, marks: list[tuple[str, float, str]]) -> Gauge:
    """``value`` on an axis from 0 to a bit past the largest of it and its marks."""
    top = max([value, *(v for _, v, _ in marks)]) * 1.15 or 1.0
    level = "ok"
    for _label, at, mark_level in sorted(marks, key=lambda m: m[1]):
        if value >= at:
            level = mark_level
    return Gauge(
        title=title,
        value=value,
        unit=unit,
        pct=round(min(value / top, 1.0) * 100, 2),
        level=level,
        marks=tuple(Mark(label, at, round(at / top * 100, 2), lvl) for label, at, lvl in marks),
    )


def _liveness(panel: EvidencePanel, signal: dict[str, Any], policy: Policy, now: float) -> None:
    points = _points(signal.get("evidence") or {})
    detected = float(signal.get("detected_at") or now)
    hb = policy.detection.heartbeat
    suspect, confirm = hb.suspect_seconds, hb.suspect_seconds + hb.confirm_seconds
    last = max((ts for ts, _ in points), default=None)
    if last is None:
        return
    age = max(0.0, detected - last)
    exited = "exited" in panel.detail or signal.get("extra", {}).get("exit_cause") is not None
    what = "process" if signal.get("kind") != FaultKind.NODE_SILENT else "node"
    panel.facts.append(("last heard from", _utc(last)))
    if exited:
        panel.facts.append(("judged", "exited: lost at once (its launcher saw the exit)"))
    gauge = make_gauge(
        f"{what.capitalize()} silent when judged",
        age,
        "s",
        [(f"suspect {suspect:g} s", suspect, "warn"), (f"confirmed {confirm:g} s", confirm, "bad")],
    )
    # An exit is certain: judged at once, before any threshold, and no less a fault for it.
    panel.gauge = replace(gauge, title="Exited: lost at once", level="bad") if exited else gauge
    if signal.get("kind") == FaultKind.NODES_LOST and len(points) > 1:
        panel.facts.append(("nodes silent", str(len(points))))


def _stuck(panel: EvidencePanel, signal: dict[str, Any]) -> None:
    evidence = signal.get("evidence") or {}
    points = _points(evidence)
    limit = evidence.get("threshold")
    kind = signal.get("kind")
    if kind == FaultKind.TRAIN_HANG and len(points) >= 2 and isinstance(limit, int | float):
        stuck = points[-1][0] - points[0][0]
        panel.gauge = make_gauge(
            f"Stuck at step {points[0][1]:.0f}",
            stuck,
            "s",
            [(f"limit {limit:.0f} s", limit, "bad")],
        )
        median = (signal.get("extra") or {}).get("median_step_seconds")
        if isinstance(median, int | float):
            panel.facts.append(("median step time", f"{median:g} s"))
    elif kind == FaultKind.TRAINER_IDLE and points:
        window = float(evidence.get("window_seconds") or 0.0)
        idle = points[-1][0] - points[0][0]
        panel.gauge = make_gauge(
            "GPUs idle in TRAIN for", idle, "s", [(f"limit {window:.0f} s", window, "bad")]
        )


# Engine kinds judged by how long a condition held against a window (values as strings: the
# finer engine kinds are newer than this module's imports need to know).
HELD_FOR = {
    "rollout_engine_down": "Health probe unanswered for",
    "rollout_engine_hung": "Alive, health probe unanswered for",
    "rollout_engine_wedged": "Requests held, no token generated for",
}


def _held_for(panel: EvidencePanel, signal: dict[str, Any], title: str) -> None:
    window = (signal.get("evidence") or {}).get("window_seconds")
    since, detected = signal.get("since"), signal.get("detected_at")
    if not (
        isinstance(window, int | float)
        and window > 0
        and isinstance(since, int | float)
        and isinstance(detected, int | float)
    ):
        return
    held = max(0.0, float(detected) - float(since))
    panel.gauge = make_gauge(title, held, "s", [(f"limit {window:.0f} s", float(window), "bad")])


def _straggler(panel: EvidencePanel, signal: dict[str, Any]) -> None:
    extra = signal.get("extra") or {}
    figure, median = extra.get("figure"), extra.get("peer_median")
    limit = (signal.get("evidence") or {}).get("threshold")
    if not isinstance(figure, int | float) or not isinstance(median, int | float):
        return
    rows = [
        ("this participant", float(figure), "bad"),
        (f"peers' median ({extra.get('peers', '?')} peers)", float(median), "ok"),
    ]
    if isinstance(limit, int | float):
        rows.append(("straggler limit", float(limit), "warn"))
    top = max(v for _, v, _ in rows) * 1.1 or 1.0
    panel.bars = [Bar(label, v, round(v / top * 100, 2), lvl) for label, v, lvl in rows]


def _gpu_event(panel: EvidencePanel, signal: dict[str, Any]) -> None:
    evidence, extra = signal.get("evidence") or {}, signal.get("extra") or {}
    points = _points(evidence)
    if evidence.get("metric"):
        panel.facts.append(("counter", str(evidence["metric"])))
    increase = extra.get("increase")
    if isinstance(increase, int | float):
        panel.facts.append(("increase", _num(float(increase))))
    elif points:
        panel.facts.append(("value", _num(points[-1][1])))
    code = extra.get("xid")
    if isinstance(code, int):
        entry = entry_of(code)
        panel.facts.append(("XID", f"{code} {entry.mnemonic}"))
        panel.facts.append(("resolution bucket (NVIDIA's catalogue)", entry.bucket.value))


def _exit_cause(panel: EvidencePanel, signal: dict[str, Any]) -> None:
    extra = signal.get("extra") or {}
    line = extra.get("line")
    if not isinstance(line, str) and _OUTPUT_SAID in panel.detail:
        line = panel.detail.split(_OUTPUT_SAID, 1)[1]
    if isinstance(line, str) and line:
        panel.quote = line
    if extra.get("exit_cause"):
        panel.facts.append(("exit cause", str(extra["exit_cause"])))


def _facts(panel: EvidencePanel, signal: dict[str, Any]) -> None:
    """What the signal carries, in words, after the kind's own figures."""
    evidence = signal.get("evidence") or {}
    shown = {label for label, _ in panel.facts}
    if evidence.get("metric") and "counter" not in shown:
        panel.facts.append(("metric", str(evidence["metric"])))
    threshold = evidence.get("threshold")
    if isinstance(threshold, int | float) and panel.gauge is None and not panel.bars:
        panel.facts.append(("threshold", _num(float(threshold))))
    window = evidence.get("window_seconds")
    if isinstance(window, int | float) and window > 0 and panel.gauge is None:
        panel.facts.append(("window", f"{window:.0f} s"))
    since = signal.get("since")
    if isinstance(since, int | float) and since > 0:
        panel.facts.append(("since", _utc(float(since))))
    if signal.get("step") is not None:
        panel.facts.append(("step", str(signal["step"])))
    for key, value in sorted((signal.get("extra") or {}).items()):
        if key in _EXTRA_HIDDEN or key in {"figure", "peer_median", "increase", "xid"}:
            continue
        if isinstance(value, bool | int | float | str) and str(value):
            panel.facts.append(
                (key.replace("_", " "), _num(value) if isinstance(value, float) else str(value))
            )


def chart_worth_drawing(spec: ChartSpec | None) -> bool:
    """A chart says something only with two samples or more; one point is an event."""
    return spec is not None and len(spec.x) >= 2


def evidence_panel(
    signal: dict[str, Any],
    *,
    kind: str,
    policy: Policy,
    now: float,
    chart: ChartSpec | None,
    phases: list[tuple[str, str]] | None = None,
) -> EvidencePanel:
    """The panel of one incident. ``signal`` is what the incident stored (the whole signal, its
    evidence inside); ``chart`` the series chart built for it, if any; ``phases`` the
    participant's recent phase changes, for a stuck participant."""
    evidence = signal.get("evidence") if isinstance(signal.get("evidence"), dict) else signal
    assert isinstance(evidence, dict)
    whole = signal if "evidence" in signal else {"evidence": evidence, "kind": kind}
    whole = {**whole, "kind": whole.get("kind") or kind}
    panel = EvidencePanel(kind=kind, detail=str(evidence.get("detail") or ""))
    if kind in LIVENESS_KINDS:
        _liveness(panel, whole, policy, now)
    elif kind in STUCK_KINDS:
        _stuck(panel, whole)
        panel.phases = list(phases or [])
    elif kind in HELD_FOR:
        _held_for(panel, whole, HELD_FOR[kind])
    elif kind == FaultKind.STRAGGLER:
        _straggler(panel, whole)
    elif kind in GPU_EVENT_KINDS:
        _gpu_event(panel, whole)
    _exit_cause(panel, whole)
    _facts(panel, whole)
    if chart_worth_drawing(chart) and kind not in NO_CHART_KINDS:
        panel.chart = chart
    return panel
