"""The launcher hook for Ray jobs: what ``RLGUARD_RECOVERY_LAUNCHER`` runs for verl / OpenRLHF.

Same command line and exit codes as :mod:`recovery.supervision.hook` (0 done with one JSON line,
1 refused with the reason on stderr, 2 bad arguments or Ray not reachable); ``python -m
integrations.ray.hook write-hook PATH --dashboard URL --preset verl --state-dir DIR`` writes one.

* ``restart_role``: the participant's actor (mapped as the collector maps it) is killed with
  ``ray.kill(actor, no_restart=False)`` so Ray restarts it, its pid and restart count recorded
  under the idempotency key first so a second delivery kills nothing. An actor Ray is restarting
  is left to Ray; a DEAD one whose job registered a restarter (:mod:`integrations.ray.restarter`)
  is created again by it; any other dead, restart-less or unnamed actor is refused.
* ``restart_job`` (heavy, approved, and the job's release from SAFE_MODE under ``--run-root``):
  the Ray job is stopped and submitted again through the Jobs API with its recorded entrypoint
  plus the preset's resume arguments, under a submission id derived from the idempotency key
  (never twice). A job with no recorded entrypoint is refused.
* ``inject_fault`` kills or stops a role's actor process, ``drill_figures`` counts what a drill
  made the job redo (``rlguard drill``; :mod:`recovery.supervision.drill_figures`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from integrations.ray.mapping import MappedActor, job_name_of, map_actors
from integrations.ray.presets import Preset, PresetError, load_preset, with_resume
from integrations.ray.restarter import restarter_name
from integrations.ray.state import ActorRecord, JobRecord, RayStateReader, RayUnavailable
from recovery.control import ControlError, ControlMode, read_control, write_control
from recovery.fsio import write_json_atomic
from recovery.protocol.hook_request import add_request_arguments
from recovery.supervision.hook import answer_drill_figures, write_hook_script
from recovery.supervision.requests import JOB_DIR_PATTERN, KEY_PATTERN

PROG = "python -m integrations.ray.hook"
_ACTIONS = ("restart_role", "restart_job")
# The other launcher-hook actions have no meaning for a Ray job: Ray places actors itself, and the
# checkpoint a resubmission resumes from is the framework's (restart_job's resume arguments).
_NOT_THROUGH_RAY = ("reschedule_batches", "restore_checkpoint")
_TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
# What Ray's Jobs API answers (HTTP 500) while no job agent has registered with the head yet.
NO_JOB_AGENT = "No available agent to submit job"


class Refused(Exception):
    """The action cannot be done through Ray; the message says why (exit 1)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


class RayHook:
    """Carries out hook actions on one Ray cluster (module docstring)."""

    def __init__(
        self,
        *,
        dashboard: str,
        preset: Preset,
        state_dir: Path,
        ray_address: str = "auto",
        job_name: str | None = None,
        timeout: float = 30.0,
        run_root: Path | None = None,
    ) -> None:
        self.dashboard = dashboard
        self.run_root = run_root
        self.preset = preset
        self.state_dir = state_dir
        self.ray_address = ray_address
        self.job_name = job_name
        self.timeout = timeout
        self.reader = RayStateReader(dashboard, timeout=min(timeout, 10.0))

    def _ledger(self, key: str) -> Path:
        digest = hashlib.sha256(key.encode()).hexdigest()[:32]
        return self.state_dir / f"{digest}.json"

    def _recorded(self, key: str) -> dict[str, Any] | None:
        try:
            doc = json.loads(self._ledger(key).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        return doc if isinstance(doc, dict) else None

    # -- restart_role ------------------------------------------------------------------------

    def _find(self, job: str, role: str, rank: int) -> tuple[MappedActor, list[ActorRecord]]:
        """The participant's actor, and every actor of the same snapshot."""
        snap = self.reader.snapshot()
        mapped = map_actors(snap.actors, self.preset, snap.jobs, job_name=self.job_name)
        found = mapped.find(job, role, rank)
        if found is None:
            raise Refused(
                f"no Ray actor of job {job!r} is {role}-{rank} under preset {self.preset.name!r}"
            )
        return found, list(snap.actors)

    def restart_role(self, job: str, role: str, rank: int, key: str) -> dict[str, Any]:
        found, actors = self._find(job, role, rank)
        actor = found.actor
        recorded = self._recorded(key)
        if recorded is not None and recorded.get("actor_id") == actor.actor_id:
            if actor.num_restarts > recorded["num_restarts"] or actor.pid != recorded["pid"]:
                return {**recorded, "already": True, "pid_now": actor.pid}
        if actor.state == "RESTARTING":
            return {"actor_id": actor.actor_id, "restarted_by": "ray", "state": actor.state}
        if recorded is not None and recorded.get("via") == "restarter":
            return self._ask_restarter(job, role, rank, key, actor)  # it answers a redelivery
        if actor.state == "DEAD" and actor.name and _has_restarter(job, actor, actors):
            return self._ask_restarter(job, role, rank, key, actor)
        if actor.state != "ALIVE":
            raise Refused(
                f"Ray actor {actor.actor_id} ({actor.class_name}) is {actor.state} "
                f"({actor.death_reason}) and Ray will not restart it: the job has to be "
                f"resubmitted (restart_job)"
            )
        if not actor.name:
            raise Refused(
                f"Ray actor {actor.actor_id} ({actor.class_name}) has no name, and Ray gives no "
                f"handle to an unnamed actor outside its job: the job has to be resubmitted "
                f"(restart_job)"
            )
        import ray

        ray.init(
            address=self.ray_address,
            namespace=actor.namespace,
            log_to_driver=False,
            logging_level=logging.ERROR,
        )
        try:
            handle = ray.get_actor(actor.name, namespace=actor.namespace)
            max_restarts = _max_restarts(actor.actor_id)
            if max_restarts is not None and 0 <= max_restarts <= actor.num_restarts:
                raise Refused(
                    f"Ray actor {actor.name} has used {actor.num_restarts} of its "
                    f"{max_restarts} restarts: the job has to be resubmitted (restart_job)"
                )
            record = {
                "action": "restart_role",
                "actor_id": actor.actor_id,
                "name": actor.name,
                "pid": actor.pid,
                "num_restarts": actor.num_restarts,
                "killed_at": time.time(),
            }
            write_json_atomic(self._ledger(key), record)  # recorded before the kill
            ray.kill(handle, no_restart=False)
        finally:
            ray.shutdown()
        return {**record, "already": False}

    # -- inject_fault (rlguard drill) ----------------------------------------------------------

    def inject_fault(
        self, job: str, role: str, rank: int, key: str, extra: dict[str, Any]
    ) -> dict[str, Any]:
        """A drill's fault into the participant's actor process: SIGKILL (``kill``) or SIGSTOP
        (``hang``), as :mod:`recovery.supervision.drills` answers. Only on the actor's own
        node (the hook signals a local pid, checked to be that actor's Ray worker), once per
        key; ``oom``, ``disk-full`` and ``at_step`` need a point inside the process that the
        hook does not have, and are refused."""
        fault, dry_run = extra.get("fault"), extra.get("dry_run") is True
        if fault not in ("kill", "hang"):
            raise Refused(
                f"the Ray hook cannot inject {fault!r} into an actor: it signals the "
                "actor's process from outside (drill kill or hang)"
            )
        if extra.get("at_step") is not None:
            raise Refused(
                "the Ray hook cannot wait for a step (it does not watch the actor): "
                "drill without --at-step"
            )
        recorded = self._recorded(key)
        if recorded is not None and recorded.get("action") == "inject_fault":
            return {**recorded, "already": True}
        actor = self._find(job, role, rank)[0].actor
        pid = actor.pid
        try:
            title = (
                Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            )
        except OSError:
            title = ""
        if (
            actor.state != "ALIVE"
            or pid is None
            or not title.startswith(f"ray::{actor.class_name}")
        ):
            raise Refused(
                f"Ray actor {actor.name or actor.actor_id} ({actor.state}, pid {pid}) "
                "is not an alive actor process on this node: a drill signals a local "
                "process only"
            )
        what = (
            f"SIGKILL {role}-{rank} (Ray actor {actor.name}, pid {pid})"
            if fault == "kill"
            else f"SIGSTOP {role}-{rank} (Ray actor {actor.name}, pid {pid}): alive, silent"
        )
        if dry_run:
            return {
                "ok": True,
                "dry_run": True,
                "target": f"{role}-{rank}",
                "target_pid": pid,
                "what": what + " now",
            }
        record = {
            "ok": True,
            "action": "inject_fault",
            "fault": fault,
            "target": f"{role}-{rank}",
            "target_pid": pid,
            "injected_at": time.time(),
            "step": None,
            "what": what,
        }
        write_json_atomic(self._ledger(key), record)  # recorded before the signal
        os.kill(pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        return {**record, "already": False}

    def _ask_restarter(
        self, job: str, role: str, rank: int, key: str, actor: ActorRecord
    ) -> dict[str, Any]:
        """Ray will not restart the dead actor: the job's restarter creates it again."""
        import ray

        record = {
            "action": "restart_role",
            "via": "restarter",
            "dead_actor_id": actor.actor_id,
            "death_reason": actor.death_reason,
            "name": actor.name,
        }
        if self._recorded(key) is None:
            write_json_atomic(self._ledger(key), record)  # recorded before the request
        ray.init(
            address=self.ray_address,
            namespace=actor.namespace,
            log_to_driver=False,
            logging_level=logging.ERROR,
        )
        try:
            restarter = ray.get_actor(restarter_name(job), namespace=actor.namespace)
            request: Any = restarter.restart_role.remote(role, rank, key)
            answer = dict(ray.get(request, timeout=self.timeout))
        except Exception as exc:  # noqa: BLE001 - any failure of the request is a refusal
            raise Refused(
                f"the restarter of job {job!r} did not create {role}-{rank}: {exc}"
            ) from exc
        finally:
            ray.shutdown()
        return {**record, **answer}

    # -- restart_job -------------------------------------------------------------------------

    def _ray_job(self, job: str) -> JobRecord:
        """The job's newest Jobs API submission (a running one first)."""
        snap = self.reader.snapshot()
        submitted = [r for r in snap.jobs if r.submission_id]
        mine = [r for r in submitted if job_name_of(r) == job]
        if not mine and self.job_name == job:  # the one job of the cluster, submitted unnamed
            mine = [r for r in submitted if "rlguard_job" not in r.metadata]
        if not mine:
            seen = sorted({job_name_of(r) for r in snap.jobs if r.submission_id})
            raise Refused(
                f"job {job!r} has no Ray job submitted through the Jobs API (submitted: "
                f"{', '.join(seen) or 'none'}): it cannot be resubmitted (submit it with ray job "
                f'submit --metadata-json \'{{"rlguard_job": "{job}"}}\')'
            )
        running = [r for r in mine if r.status not in _TERMINAL]
        return (running or mine)[-1]

    def restart_job(self, job: str, key: str) -> dict[str, Any]:
        from ray.job_submission import JobSubmissionClient

        new_id = f"rlguard-{job[:40]}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
        recorded = self._recorded(key)
        if recorded is not None:
            return {**recorded, "already": True}
        old = self._ray_job(job)
        old_id = str(old.submission_id)
        if not old.entrypoint.strip():
            raise Refused(
                f"Ray job {old_id} of job {job!r} has no recorded entrypoint: there is nothing "
                f"to submit again"
            )
        client = JobSubmissionClient(self.dashboard)
        if old_id != new_id:
            if old.status not in _TERMINAL:
                client.stop_job(old_id)
            self._wait_terminal(client, old_id)
        entrypoint = with_resume(old.entrypoint, self.preset.resume_args)
        details = client.get_job_info(old_id)
        known = {j.submission_id for j in client.list_jobs()}
        released = self._release_safe_mode(job, key)
        if new_id not in known:
            self._submit(
                client,
                entrypoint=entrypoint,
                submission_id=new_id,
                runtime_env=details.runtime_env or None,
                metadata={**(old.metadata or {}), "rlguard_job": job},
            )
        record = {
            "action": "restart_job",
            "stopped": old_id,
            "submitted": new_id,
            "entrypoint": entrypoint,
            "released_safe_mode": released,
        }
        write_json_atomic(self._ledger(key), record)
        return {**record, "already": False}

    def _release_safe_mode(self, job: str, key: str) -> bool:
        """The approved restart_job releases the job (module docstring); True when it was held."""
        if self.run_root is None or not JOB_DIR_PATTERN.fullmatch(job):
            return False
        run_dir = self.run_root / job
        if not run_dir.is_dir():
            return False  # no run directory of the job here (verl's own): nothing holds it
        try:
            if read_control(run_dir).mode is not ControlMode.SAFE_MODE:
                return False
        except ControlError:
            pass  # an unreadable control file is replaced by the approved command
        try:
            write_control(run_dir, ControlMode.RUN, f"restart_job approved ({key})", timeout=10.0)
        except ControlError as exc:
            raise Refused(f"the job's SAFE_MODE could not be released: {exc}") from exc
        return True

    def _submit(self, client: Any, **job: Any) -> None:
        """Submit, waiting out the Jobs API's "no agent yet" answer (the head's job agent
        registers some seconds after the dashboard answers, e.g. right after a head restart);
        any other refusal is raised at once."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                client.submit_job(**job)
                return
            except RuntimeError as exc:
                if NO_JOB_AGENT not in str(exc) or time.monotonic() > deadline:
                    raise
            time.sleep(0.5)

    def _wait_terminal(self, client: Any, submission_id: str | None) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            status = client.get_job_status(submission_id)
            if str(getattr(status, "value", status)) in _TERMINAL:
                return
            time.sleep(0.2)
        raise Refused(f"Ray job {submission_id} did not stop within {self.timeout:g} s")


def _has_restarter(job: str, actor: ActorRecord, actors: list[ActorRecord]) -> bool:
    """Whether the job registered a restarter actor (:mod:`integrations.ray.restarter`), in the
    same snapshot of the cluster as the dead actor (one state API call on the recovery path)."""
    return any(
        a.name == restarter_name(job) and a.state == "ALIVE" and a.namespace == actor.namespace
        for a in actors
    )


def _max_restarts(actor_id: str) -> int | None:
    """The actor's ``max_restarts`` from the GCS actor table (-1: unlimited), if it tells."""
    try:
        from ray._private.state import state
        from ray._raylet import ActorID
        from ray.core.generated import gcs_pb2

        accessor = state._connect_and_get_accessor()
        raw = accessor.get_actor_info(ActorID.from_hex(actor_id))
        if raw is None:
            return None
        data = gcs_pb2.ActorTableData.FromString(raw)  # type: ignore[attr-defined]
        return int(data.max_restarts)
    except Exception:  # an internal API: without it, Ray's answer to the kill is the check
        return None


def write_hook(path: Path, argv: list[str], python: str = sys.executable) -> None:
    """An executable that runs this hook with ``argv`` (the cluster options) before its own."""
    write_hook_script(
        path,
        comment="RLGuard launcher hook for Ray jobs (integrations.ray.hook)",
        command=f"{shlex.quote(python)} -m integrations.ray.hook {shlex.join(argv)}",
    )


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG)
    p.add_argument(
        "action", choices=[*_ACTIONS, "inject_fault", "drill_figures", *_NOT_THROUGH_RAY]
    )
    add_request_arguments(p)
    p.add_argument("--wait", type=float, help="accepted for the drill worker; answered at once")
    p.add_argument("--dashboard", required=True, help="the Ray dashboard, http://HEAD:8265")
    p.add_argument("--ray-address", default="auto", help="the GCS address for ray.kill")
    p.add_argument("--preset", default="verl")
    p.add_argument("--ray-job", help="the job's name, as given to the agent's --ray-job")
    p.add_argument("--state-dir", required=True, type=Path)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument(
        "--run-root",
        type=Path,
        default=os.environ.get("RLGUARD_RECOVERY_RUN_ROOT"),
        help="where the jobs' run directories are (their SAFE_MODE control files); default "
        "$RLGUARD_RECOVERY_RUN_ROOT",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point; the exit code (module docstring)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "write-hook":
        if len(argv) < 2:
            sys.stderr.write(f"{PROG} write-hook: error: the hook's path is required\n")
            return 2
        p = _parser()
        checked = p.parse_args(["restart_job", "--job", "x", "--idempotency-key", "x", *argv[2:]])
        try:
            load_preset(checked.preset)
        except PresetError as exc:
            p.error(str(exc))
        write_hook(Path(argv[1]), argv[2:])
        return 0
    p = _parser()
    args = p.parse_args(argv)
    if not KEY_PATTERN.fullmatch(args.idempotency_key):
        p.error(f"--idempotency-key {args.idempotency_key!r} must be printable ASCII")
    if args.action in ("restart_role", "inject_fault") and (
        args.role is None or not (args.rank or "").isdigit()
    ):
        p.error(f"{args.action} needs --role and a whole-number --rank")
    try:
        extra = json.loads(args.extra) if args.extra else {}
    except json.JSONDecodeError as exc:
        p.error(f"--extra is not JSON: {exc}")
    if args.action == "drill_figures":
        # Counted in the job's run directory on this node, as the supervisor's hook does: Ray
        # is not asked (a job that writes no run directory here gets a note, not a number).
        if not JOB_DIR_PATTERN.fullmatch(args.job):
            p.error(f"--job {args.job!r} cannot name a run directory")
        run_dir = None if args.run_root is None else args.run_root / args.job
        return answer_drill_figures(p, run_dir, extra)
    if args.action in _NOT_THROUGH_RAY:
        sys.stderr.write(
            f"refused: {args.action} is not done through Ray (Ray places the actors itself; a "
            f"job resumes from its checkpoint with restart_job)\n"
        )
        return 1
    try:
        preset = load_preset(args.preset)
    except PresetError as exc:
        p.error(str(exc))
    args.state_dir.mkdir(parents=True, exist_ok=True)
    hook = RayHook(
        dashboard=args.dashboard,
        preset=preset,
        state_dir=args.state_dir,
        ray_address=args.ray_address,
        job_name=args.ray_job,
        timeout=args.timeout,
        run_root=args.run_root,
    )
    try:
        if args.action == "restart_role":
            answer = hook.restart_role(args.job, args.role, int(args.rank), args.idempotency_key)
        elif args.action == "inject_fault":
            answer = hook.inject_fault(
                args.job,
                args.role,
                int(args.rank),
                args.idempotency_key,
                extra if isinstance(extra, dict) else {},
            )
        else:
            answer = hook.restart_job(args.job, args.idempotency_key)
    except Refused as exc:
        sys.stderr.write(f"refused: {exc}\n")
        return 1
    except RayUnavailable as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    sys.stdout.write(json.dumps(answer, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
