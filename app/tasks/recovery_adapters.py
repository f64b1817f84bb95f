"""Thin adapters from recovery actions to the recovery library and the job's run directory.

Each adapter checks the world before it acts, so running it twice has the effect of running it
once: SAFE_MODE already set is left alone, a WAL entry already FAILED is not failed again, a
request file already written is not rewritten. Errors are ``ActionError`` (permanent: the
action fails and counts toward escalation) or ``TransientActionError`` (the task retries).

Run directory layout used here: ``<run_root>/<job>/`` holding ``wal/`` (recovery.wal),
``checkpoints/`` (recovery.checkpoint), ``shards/`` (recovery.shards), the control file
(recovery.control) and ``recovery/`` (requests the job picks up, retry ledger).
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.actions.errors import ActionError, TransientActionError
from app.actions.machine import ActionSnapshot
from app.policy.plans import ActionName
from recovery.checkpoint.engine import CheckpointEngine
from recovery.control import (
    ControlError,
    ControlLockTimeout,
    ControlMode,
    read_control,
    write_control,
)
from recovery.errors import RecoveryError
from recovery.fsio import write_json_atomic
from recovery.protocol.hook_request import HookRequest
from recovery.supervision.backends.slurm import drain_reason_for_xid
from recovery.wal import WALStatus, WriteAheadLog

log = logging.getLogger("rlguard.recovery_adapters")

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# What an action's result keeps of a launcher's answer: its end, where the outcome is. 500
# characters cut a healed engine's stage line (quarantined, replaced, refit, re-admitted) short.
HOOK_OUTPUT_CHARS = 4000
# Of its stderr on a failure: the action's error column keeps 2,000 characters, from the start.
HOOK_ERROR_CHARS = 1500


#: Records a restart's captured stacks on its incident now (``app.actions.stacks``); True when
#: recorded.
StacksSink = Callable[[ActionSnapshot, list[dict[str, Any]]], bool]


@dataclass(frozen=True, slots=True)
class ActionContext:
    run_root: Path
    launcher: str | None
    launcher_timeout: float
    attach_stacks: StacksSink | None = None

    def run_dir(self, job: str | None) -> Path:
        if job is None or not _SAFE_NAME.fullmatch(job):
            raise ActionError(f"job name {job!r} cannot name a run directory")
        path = self.run_root / job
        if not path.is_dir():
            raise ActionError(f"run directory {path} does not exist")
        return path


def _write_json_atomic(path: Path, body: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, body)  # fsync the file, rename, fsync the directory


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as exc:
        raise TransientActionError(f"cannot read {path}: {exc}") from exc
    return data if isinstance(data, dict) else None


# -- control file (SAFE_MODE) -------------------------------------------------------------------


def read_mode(run_dir: Path) -> str:
    try:
        return read_control(run_dir).mode.value
    except ControlError as exc:
        raise TransientActionError(str(exc)) from exc


def enter_safe_mode(ctx: ActionContext, a: ActionSnapshot) -> dict[str, Any]:
    """Tell the job to stop new rollouts (the phase machine obeys the control file). For a
    hung participant whose heavy plan waits for a person (the plan asks for
    ``capture_stacks``), its stacks are captured and recorded first, as before a restart."""
    stacks = _capture_first(ctx, a) if a.params.get("capture_stacks") else None
    reason = f"incident {a.incident_id}: {a.params.get('reason', 'heavy fault')}"
    result = _switch_mode(ctx.run_dir(a.job), ControlMode.SAFE_MODE, reason)
    if stacks is not None:
        result["stacks"] = stacks
    return result


def release_safe_mode(ctx: ActionContext, a: ActionSnapshot) -> dict[str, Any]:
    """Tell the job to run again (an approver released it); the phase machine leaves SAFE_MODE."""
    reason = f"incident {a.incident_id}: {a.params.get('reason', 'released by an approver')}"
    # An approver's comment can be long: cut it to what the control file holds.
    return _switch_mode(ctx.run_dir(a.job), ControlMode.RUN, reason[:2000])


def _switch_mode(run_dir: Path, mode: ControlMode, reason: str) -> dict[str, Any]:
    """Write ``mode`` to the job's control file unless it is already there (a retried action
    then changes nothing); a busy control-file lock is worth a retry, a refusal is not."""
    current = read_control(run_dir)
    if current.mode is mode:
        return {"mode": current.mode.value, "revision": current.revision, "already": True}
    try:
        state = write_control(run_dir, mode, reason, timeout=10.0)
    except ControlLockTimeout as exc:
        raise TransientActionError(str(exc)) from exc
    except ControlError as exc:
        raise ActionError(str(exc)) from exc
    return {"mode": state.mode.value, "revision": state.revision, "already": False}


# -- WAL: retry a timed-out rollout batch -------------------------------------------------------


def retry_rollout_batch(ctx: ActionContext, a: ActionSnapshot) -> dict[str, Any]:
    """Mark EXECUTING entries older than the rollout timeout FAILED so the job reschedules them,
    at most ``max_retries`` times per entry (a ledger in ``recovery/retries.json`` counts)."""
    run_dir = ctx.run_dir(a.job)
    timeout = float(a.params.get("timeout_sec", 120))
    max_retries = int(a.params.get("max_retries", 3))
    ledger_path = run_dir / "recovery" / "retries.json"
    ledger: dict[str, int] = dict((_read_json(ledger_path) or {}).get("entries", {}))
    failed: list[str] = []
    exhausted: list[str] = []
    try:
        wal = WriteAheadLog(run_dir / "wal", lock_timeout=10.0)
    except RecoveryError as exc:
        raise TransientActionError(f"cannot open the WAL of {a.job}: {exc}") from exc
    try:
        now = time.time()
        for entry in wal.recover():
            if entry.status is not WALStatus.EXECUTING or now - entry.updated_at < timeout:
                continue
            if ledger.get(entry.entry_id, 0) >= max_retries:
                exhausted.append(entry.entry_id)
                continue
            ledger[entry.entry_id] = ledger.get(entry.entry_id, 0) + 1
            _write_json_atomic(ledger_path, {"entries": ledger})  # count before acting
            wal.update_status(
                entry.entry_id,
                WALStatus.FAILED,
                error=f"rollout timeout, retry {ledger[entry.entry_id]}",
            )
            failed.append(entry.entry_id)
    finally:
        wal.close()
    if exhausted and not failed:
        raise ActionError(f"entries out of retries ({max_retries}): {', '.join(exhausted)}")
    return {"failed_for_retry": failed, "out_of_retries": exhausted}


# -- requests the job picks up ------------------------------------------------------------------


def _request(run_dir: Path, name: str, body: dict[str, Any]) -> dict[str, Any]:
    path = run_dir / "recovery" / "requests" / f"{name}.json"
    existing = _read_json(path)
    if existing is not None:
        return {"request": str(path), "already": True}
    _write_json_atomic(path, {**body, "ts": time.time()})
    return {"request": str(path), "already": False}


def skip_failed_step(ctx: ActionContext, a: ActionSnapshot) -> dict[str, Any]:
    run_dir = ctx.run_dir(a.job)
    step = a.params.get("step")
    if step is None:
        raise ActionError("skip_failed_step needs the failed step number")
    return _request(
        run_dir,
        f"skip_step-{int(step)}",
        {
            "action": ActionName.SKIP_FAILED_STEP.value,
            "step": int(step),
            "role": a.params.get("role"),
            "rank": a.params.get("rank"),
        },
    )


def rebuild_shard(ctx: ActionContext, a: ActionSnapshot) -> dict[str, Any]:
    """Check that a verified snapshot exists for the shard, then ask the job to rebuild from it."""
    from recovery.shards import ShardSnapshotter

    run_dir = ctx.run_dir(a.job)
    rank = a.params.get("rank")
    shard_ids = (
        [f"rank{rank}"]
        if rank is not None
        else sorted(p.name for p in (run_dir / "shards").iterdir() if p.is_dir())
        if (run_dir / "shards").is_dir()
        else []
    )
    if not shard_ids:
        raise ActionError(f"no shard snapshots under {run_dir / 'shards'}")
    snaps = ShardSnapshotter(run_dir / "shards")
    out = []
    for shard in shard_ids:
        info = snaps.latest(shard)
        if info is None:
            raise ActionError(f"shard {shard} has no verified snapshot to rebuild from")
        r = _request(
            run_dir,
            f"rebuild-{shard}",
            {
                "action": ActionName.REBUILD_SHARD.value,
                "shard": shard,
                "snapshot": str(info.path),
                "step": info.step,
            },
        )
        out.append({"shard": shard, "snapshot": str(info.path), "step": info.step, **r})
    return {"shards": out}


def restore_checkpoint(ctx: ActionContext, a: ActionSnapshot) -> dict[str, Any]:
    """Find the newest checkpoint whose marker and checksums verify and ask the job to load it."""
    run_dir = ctx.run_dir(a.job)
    root = run_dir / "checkpoints"
    if not root.is_dir():
        if ctx.launcher:
            # A job whose checkpoints are its framework's, not the checkpoint engine's (TRL's
            # sealed checkpoint-N under its output_dir, its memory snapshots): its launcher
            # restarts it from the newest complete state its integration finds.
            return {"checkpoint": None, "launcher": _launch(ctx, a)}
        raise ActionError(
            f"no checkpoint directory {root} and no launcher hook to restore "
            "the job's own checkpoints"
        )
    # Verified by streaming: the job loads it, this worker must not hold its bytes.
    info = CheckpointEngine(root).latest(keep_bytes=False)
    if info is None:
        raise ActionError(f"no valid checkpoint under {root}")
    body = {
        "action": ActionName.RESTORE_CHECKPOINT.value,
        "checkpoint": str(info.path),
        "seq": info.seq,
        "incident": a.incident_id,
    }
    result = {
        "checkpoint": str(info.path),
        "seq": info.seq,
        **_request(run_dir, f"restore-inc{a.incident_id}", body),
    }
    if ctx.launcher:
        result["launcher"] = _launch(ctx, a, extra={"checkpoint": str(info.path)})
    return result


# -- launcher hook: restart a role or the job, move batches ----------------------------------------


def _hook_argv(
    ctx: ActionContext,
    a: ActionSnapshot,
    action: str,
    key: str,
    extra: dict[str, Any] | None,
    *,
    wait: float | None = None,
) -> list[str]:
    if not ctx.launcher:
        raise ActionError(
            f"{a.action} needs a launcher hook (RLGUARD_RECOVERY_LAUNCHER is not set)"
        )

    def param(name: str) -> str | None:
        value = a.params.get(name)
        return None if value is None else str(value)

    request = HookRequest(
        action=action,
        job=a.job or "",
        idempotency_key=key,
        node=a.node or None,
        role=param("role"),
        rank=param("rank"),
        away_from=param("away_from"),
        extra=extra or {},
        wait=wait,
    )
    return request.argv(ctx.launcher)


def _run_hook(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise TransientActionError(f"launcher timed out after {timeout:g}s") from exc
    except OSError as exc:
        raise ActionError(f"cannot run launcher {argv[0]}: {exc}") from exc


def _launch(
    ctx: ActionContext, a: ActionSnapshot, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    argv = _hook_argv(ctx, a, a.action, a.idempotency_key, extra)
    proc = _run_hook(argv, ctx.launcher_timeout)
    if proc.returncode != 0:
        why = proc.stderr.strip() or _refusal(proc.stdout)
        raise ActionError(f"launcher exited {proc.returncode}: {why[-HOOK_ERROR_CHARS:]}")
    return {"exit": 0, "stdout": proc.stdout.strip()[-HOOK_OUTPUT_CHARS:]}


def _refusal(stdout: str) -> str:
    """Why a launcher refused (exit 1): the ``error`` of the JSON answer the hook printed on
    stdout (the protocol's), else that output itself."""
    lines = stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        return stdout.strip()
    error = answer.get("error") if isinstance(answer, dict) else None
    return str(error) if error else stdout.strip()


# -- hang forensics: the stacks of a hung process, before its restart --------------------------


def _captures(ctx: ActionContext, a: ActionSnapshot, opts: dict[str, Any]) -> list[dict[str, Any]]:
    """Ask the process's launcher for its stacks (``capture_stacks``: answered at once, never
    held); whatever goes wrong becomes a capture that says why."""
    timeout = float(opts.get("timeout_seconds", 10))
    # Its own key: the restart's answer is another request; a retried task gets the same one.
    argv = _hook_argv(
        ctx, a, "capture_stacks", f"{a.idempotency_key}/stacks", opts, wait=timeout + 5
    )
    try:
        proc = _run_hook(argv, timeout + 15)
        answer = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else {}
        if not isinstance(answer, dict):
            answer = {}
        stacks = answer.get("stacks")
        if answer.get("ok") and isinstance(stacks, list) and stacks:
            return [c for c in stacks if isinstance(c, dict)]
        why = (
            answer.get("error")
            or proc.stderr.strip()[-HOOK_ERROR_CHARS:]
            or f"hook exited {proc.returncode}"
        )
    except (ActionError, TransientActionError, json.JSONDecodeError) as exc:
        why = str(exc)
    return [
        {
            "role": a.params.get("role"),
            "rank": a.params.get("rank"),
            "ok": False,
            "reason": f"the launcher gave no stacks: {why}",
        }
    ]


def _capture_first(ctx: ActionContext, a: ActionSnapshot) -> dict[str, Any]:
    """Capture and record the stacks; what the action's result says of them (no text)."""
    opts = a.params["capture_stacks"]
    captures = _captures(ctx, a, opts if isinstance(opts, dict) else {})
    attached = ctx.attach_stacks(a, captures) if ctx.attach_stacks is not None else False
    return {
        "attached": attached,
        "processes": [
            {
                "pid": c.get("pid"),
                "ok": bool(c.get("ok")),
                "reason": c.get("reason") or "",
                "bytes": len(str(c.get("text") or "").encode("utf-8")),
            }
            for c in captures
        ],
    }


def restart_role(ctx: ActionContext, a: ActionSnapshot) -> dict[str, Any]:
    """Restart the role (or one rank); for a hung or stalled process (the plan asks for
    ``capture_stacks``) its Python stacks are captured and recorded first. A capture never
    blocks the restart: it ends in stacks or in a reason, then the restart is asked for."""
    stacks = _capture_first(ctx, a) if a.params.get("capture_stacks") else None
    result = _launch(ctx, a)
    if stacks is not None:
        result["stacks"] = stacks
    return result


def restart_job(ctx: ActionContext, a: ActionSnapshot) -> dict[str, Any]:
    return _launch(ctx, a)


def reschedule_batches(ctx: ActionContext, a: ActionSnapshot) -> dict[str, Any]:
    return _launch(ctx, a)


def drain_node(ctx: ActionContext, a: ActionSnapshot) -> dict[str, Any]:
    """Ask the launcher (its scheduler backend) to drain the node, with RLGuard's reason."""
    xid, gpu = a.params.get("xid"), a.params.get("gpu")
    if not isinstance(xid, int) or not a.node:
        raise ActionError(f"drain_node needs a node and an XID, got node={a.node!r} xid={xid!r}")
    reason = drain_reason_for_xid(xid, gpu=None if gpu is None else str(gpu)) or (
        f"rlguard: {'gpu ' + str(gpu) + ' ' if gpu is not None else ''}XID {xid}"
    )
    return _launch(ctx, a, extra={"reason": f"{reason} [incident {a.incident_id}]", "xid": xid})


ADAPTERS: dict[ActionName, Callable[[ActionContext, ActionSnapshot], dict[str, Any]]] = {
    ActionName.ENTER_SAFE_MODE: enter_safe_mode,
    ActionName.RELEASE_SAFE_MODE: release_safe_mode,
    ActionName.RETRY_ROLLOUT_BATCH: retry_rollout_batch,
    ActionName.SKIP_FAILED_STEP: skip_failed_step,
    ActionName.REBUILD_SHARD: rebuild_shard,
    ActionName.RESTORE_CHECKPOINT: restore_checkpoint,
    ActionName.RESTART_ROLE: restart_role,
    ActionName.RESTART_JOB: restart_job,
    ActionName.RESCHEDULE_BATCHES: reschedule_batches,
    ActionName.DRAIN_NODE: drain_node,
}
