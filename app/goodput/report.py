"""The ledger as rows of text, for the CLI's table and the weekly review's Markdown."""

from __future__ import annotations

from collections.abc import Sequence

from app.goodput.breakdown import SEGMENTS
from app.goodput.public import JobGoodput


def duration(seconds: float) -> str:
    """``1h 02m 03s`` style, to the second."""
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    if h:
        return f"{h}h {m:02d}m {sec:02d}s"
    if m:
        return f"{m}m {sec:02d}s"
    return f"{sec}s"


def summary_rows(g: JobGoodput) -> list[tuple[str, str]]:
    cf = g.counterfactual
    a = cf.assumptions
    return [
        ("window (UTC)", f"{g.since:%Y-%m-%d %H:%M:%S} → {g.until:%Y-%m-%d %H:%M:%S}"),
        ("wall time", duration(g.wall_seconds)),
        ("productive time", duration(g.productive_seconds)),
        ("lost time", duration(g.lost_seconds)),
        ("ETTR", f"{g.ettr:.3f}"),
        ("GPUs", f"{g.gpu_count} ({a.gpu_count_source})"),
        ("GPU-hours lost", f"{g.gpu_hours_lost:.2f}"),
        ("cost lost", f"${g.cost_lost:,.2f}"),
        ("whole-job restart: lost", duration(cf.lost_seconds)),
        ("whole-job restart: ETTR", f"{cf.ettr:.3f}"),
        ("GPU-hours saved", f"{cf.gpu_hours_saved:.2f} (assuming {a.summary})"),
        ("money saved", f"${cf.money_saved:,.2f} (assuming {a.summary})"),
    ]


def assumption_rows(g: JobGoodput) -> list[tuple[str, str]]:
    a = g.counterfactual.assumptions
    step = "unknown" if a.typical_step_seconds is None else f"{a.typical_step_seconds:.1f}s"
    return [
        ("human detection delay", duration(a.human_detection_seconds)),
        ("job start-up", f"{duration(a.startup_seconds)} ({a.startup_source})"),
        ("typical step", step),
        ("checkpoints", a.checkpoint_source),
        ("price per GPU-hour", f"${a.price_per_gpu_hour:.2f}"),
        *(
            (
                f"class {c.name} ({', '.join(c.kinds)})",
                f"detection {'human delay' if c.detection_seconds is None else duration(c.detection_seconds)}, "
                f"restart {'measured' if c.restart_seconds is None else duration(c.restart_seconds)}"
                f" — {c.source}",
            )
            for c in a.classes
        ),
    ]


INCIDENT_HEADER = (
    "#",
    "kind",
    "tier",
    "fault (UTC)",
    *SEGMENTS,
    "lost",
    "counted",
    "redone steps",
    "whole-job restart",
)


def incident_rows(g: JobGoodput) -> list[tuple[str, ...]]:
    return [
        (
            str(i.id),
            i.kind + (" (drill: not in ETTR)" if i.drill else ""),
            i.tier,
            f"{i.fault_at:%Y-%m-%d %H:%M:%S}",
            *(duration(i.segments.get(s, 0.0)) for s in SEGMENTS),
            duration(i.lost_seconds) + (" (ongoing)" if i.ongoing else ""),
            duration(i.counted_seconds),
            str(i.steps_redone),
            duration(i.whole_job_restart_seconds),
        )
        for i in g.incidents
    ]


def _md_table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    def cell(v: str) -> str:
        return v.replace("|", "\\|")

    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out.extend("| " + " | ".join(cell(v) for v in r) + " |" for r in rows)
    return out


def markdown(g: JobGoodput) -> str:
    """The weekly review's page for one job."""
    lines = [f"# Goodput of job `{g.job}`", ""]
    lines += _md_table(("figure", "value"), summary_rows(g))
    lines += ["", "## Incidents", ""]
    if g.incidents:
        lines += _md_table(INCIDENT_HEADER, incident_rows(g))
    else:
        lines.append("No incident in this window.")
    lines += ["", "## Assumptions of the whole-job-restart counterfactual", ""]
    lines += _md_table(("assumption", "value"), assumption_rows(g))
    lines.append("")
    return "\n".join(lines)
