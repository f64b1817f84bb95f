"""What a drill's fault made a job generate again, counted on its node (the hook's
``drill_figures``).

The server sees steps (the goodput ledger), not generations: which rollouts a restart lost and
produced again is known only where the job records its generations, in its run directory. The
hook reads the job's own timeline (``<run_dir>/events.jsonl``) from the drill's injection on:

* the reference job (``workload``), whose rollouts go through a write-ahead log
  (``<run_dir>/wal``): a batch its worker died generating is marked FAILED and generated again,
  announced by ``lost_rollout`` with its sample count. Batches the WAL holds as finished are
  never generated again, so a fault outside a batch costs 0.
* TRL's logged generations (:mod:`integrations.trl.generation_log`, ``<run_dir>/generations``):
  ``generation_reused`` for a logged batch used again instead of generated, and
  ``generation_redone`` for one generated again (its step was redone from an older checkpoint,
  or its log entry did not verify).

A job with neither records no generations a restart could redo or reuse: the answer says so
instead of a number.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recovery.supervision.events import read_events

EVENTS_FILE = "events.jsonl"


def _since(run_dir: Path, since: float) -> list[dict[str, Any]]:
    out = []
    for e in read_events(run_dir / EVENTS_FILE):
        ts = e.get("ts")
        if isinstance(ts, int | float) and ts >= since:
            out.append(e)
    return out


def generation_figures(run_dir: Path, since: float) -> dict[str, Any]:
    """The generations the job of ``run_dir`` redid (and reused) from epoch ``since`` on."""
    if not run_dir.is_dir():
        return {"ok": False, "error": f"no run directory {run_dir}"}
    events = _since(run_dir, since)
    if (run_dir / "wal").is_dir():
        lost = [e for e in events if e.get("kind") == "lost_rollout"]
        samples = sum(int(e.get("samples") or 0) for e in lost)
        return {
            "ok": True,
            "generations_redone": samples,
            "unit": "rollouts",
            "batches_redone": len(lost),
            "source": "the rollout write-ahead log: batches lost mid-generation "
            "(lost_rollout) are generated again, finished ones never",
        }
    if (run_dir / "generations").is_dir():
        redone = sum(1 for e in events if e.get("kind") == "generation_redone")
        reused = sum(1 for e in events if e.get("kind") == "generation_reused")
        return {
            "ok": True,
            "generations_redone": redone,
            "generations_reused": reused,
            "unit": "batches",
            "source": "TRL's generation log: generation_redone and generation_reused events",
        }
    return {
        "ok": True,
        "generations_redone": None,
        "note": "not measured: the job records no generations in its run directory (no "
        "rollout write-ahead log wal/, no TRL generation log generations/), so "
        "which ones a restart generated again is not known",
    }


def figures_answer(run_dir: Path | None, extra: Any) -> dict[str, Any]:
    """A hook's answer to ``drill_figures --extra='{"since": EPOCH_SECONDS}'`` for the job whose
    run directory is ``run_dir`` (None: the hook knows of none). ValueError names a bad
    ``--extra``."""
    since = extra.get("since") if isinstance(extra, dict) else None
    if isinstance(since, bool) or not isinstance(since, int | float):
        raise ValueError(
            f"drill_figures needs --extra='{{\"since\": EPOCH_SECONDS}}', got {extra!r}"
        )
    if run_dir is None:
        return {
            "ok": True,
            "generations_redone": None,
            "note": "not measured: the launcher hook knows no run directory for the job "
            "(give it --run-root), where the job records its generations",
        }
    return generation_figures(run_dir, float(since))
