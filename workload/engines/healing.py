"""The stages of one engine's healing, read back from the run's timeline (``events.jsonl``).

RLGuard's ``restart_role`` of a rollout rank is answered only once the new engine is admitted
(``workload.job_supervisor``): the answer carries these stages, and the recovery worker puts the
answer on the incident's timeline. Times are seconds after the engine was quarantined (or, when
the router never saw it fail, after its replacement was spawned).
"""

from __future__ import annotations

from typing import Any

from workload.job import RunDir, read_events


def healing_stages(run: RunDir, rank: int, host_pid: int, since: float) -> dict[str, Any]:
    """What happened to rank ``rank`` from ``since`` (wall clock) up to its engine of host
    ``host_pid`` being admitted (``readmitted_s`` None: not that far yet)."""
    quarantined = spawned = up = refit = readmitted = None
    for e in read_events(run):
        if e.get("rank") != rank:
            continue
        kind, ts = e.get("kind"), float(e.get("ts") or 0.0)
        if kind == "engine_quarantined" and since - 120 <= ts <= since:
            quarantined = e  # the last one before the replacement was spawned
        elif ts < since:
            continue
        elif kind == "spawn" and e.get("role") == "rollout" and e.get("child_pid") == host_pid:
            spawned = e
        elif kind == "engine_up" and e.get("pid") == host_pid:
            up = e
        elif kind == "engine_refit" and spawned is not None and readmitted is None:
            refit = e
        elif kind == "engine_readmitted" and str(e.get("incarnation", "")).startswith(
            f"{host_pid}:"
        ):
            readmitted = e
    origin = float((quarantined or spawned or {}).get("ts") or since)

    def after(event: dict[str, Any] | None) -> float | None:
        return None if event is None else round(float(event["ts"]) - origin, 3)

    # Compact: the recovery worker keeps the last 500 characters of the hook's answer.
    return {
        "rank": rank,
        "quarantined_s": None if quarantined is None else 0.0,
        "replaced_s": after(spawned),
        "warm": None if spawned is None else bool(spawned.get("warm")),
        "up_s": after(up),
        "refit_s": after(refit),
        "refit_version": None if refit is None else refit.get("served"),
        "readmitted_s": after(readmitted),
        "readmitted_version": None if readmitted is None else readmitted.get("version"),
    }


def describe(stages: dict[str, Any]) -> str:
    """One line for the incident's timeline: ``rollout-1: quarantined 0.0 s, replaced 4.56 s
    warm, up 4.73 s, refit to v1000007 5.70 s, readmitted at v1000007 5.79 s`` (a stage not
    reached is left out)."""

    def at(key: str) -> str:
        return f"{stages[key]:.2f} s"

    parts = []
    if stages["quarantined_s"] is not None:
        parts.append("quarantined 0.0 s")
    if stages["replaced_s"] is not None:
        parts.append(f"replaced {at('replaced_s')} {'warm' if stages['warm'] else 'cold'}")
    if stages["up_s"] is not None:
        parts.append(f"up {at('up_s')}")
    if stages["refit_s"] is not None:
        parts.append(f"refit to v{stages['refit_version']} {at('refit_s')}")
    if stages["readmitted_s"] is not None:
        parts.append(f"readmitted at v{stages['readmitted_version']} {at('readmitted_s')}")
    return f"rollout-{stages['rank']}: " + (", ".join(parts) or "no stage reached")
