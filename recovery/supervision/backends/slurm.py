"""The ``slurm`` backend: ``rlguard launch --backend slurm`` inside a Slurm batch job.

The processes are the launcher's children, as with ``local``; what Slurm adds:

- a whole-job restart (``restart_job`` / ``restore_checkpoint``, approved like every heavy
  action) is a requeue of the batch job (``scontrol requeue JOB``): Slurm stops the step (the
  supervisor still answers the request first) and starts the batch script again. The backend
  then sets the requeued job's start time to now, skipping Slurm's 120 s hold. A job that cannot
  be requeued (``sbatch --no-requeue``) is left to the supervisor, which restarts the processes;
- what Slurm thinks of the node and the job; DOWN, DRAIN and FAIL nodes are lost
  (:func:`node_is_lost`);
- draining the node on a GPU fault whose XID means it must not get new work
  (:func:`drain_reason_for_xid`, :meth:`SlurmBackend.drain_node`).

Every Slurm command has a timeout. :meth:`SlurmBackend.check` reads ``SLURM_JOB_ID`` and
``SLURMD_NODENAME`` from the ``environ`` it is given (the process environment by default): the
scheduler's interface, not configuration.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path

from recovery.supervision.backends import BackendError
from recovery.supervision.backends.local import LocalBackend

log = logging.getLogger("rlguard.recovery.slurm")

# Node states (the base state or a flag of ``State=``) in which the node takes no new work.
LOST_NODE_STATES = frozenset({"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING"})

# XIDs after which the node should be drained until someone looks at the GPU (NVIDIA's XID
# catalogue): 48 double-bit ECC, 64 ECC page retirement / row-remap failure, 74 NVLink error,
# 79 GPU fallen off the bus, 94/95 contained / uncontained ECC error, 119/120 GSP errors.
DRAIN_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    64: "row remapping failure",
    74: "NVLink error",
    79: "GPU fallen off the bus",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
_REQUEUE_WATCH_TRIES = 240  # half-second polls of a requeued job (two minutes at most)
_FIELD = re.compile(r"(\w+)=(.*?)(?= \w+=|$)")
_JOB_ID = re.compile(r"[0-9]+(_[0-9]+)?")
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def parse_record(line: str) -> dict[str, str]:
    """One ``scontrol show ... -o`` record (``Key=value`` pairs; values may hold spaces)."""
    return {m.group(1): m.group(2) for m in _FIELD.finditer(line.strip())}


def node_is_lost(state: str) -> bool:
    """True for a node state (``IDLE+DRAIN``, ``DOWN*``, ``MIXED+DRAIN`` ...) that takes no work."""
    parts = re.split(r"[+]", state.upper().rstrip("*~#!%$@^-"))
    return state.endswith("*") or any(p in LOST_NODE_STATES for p in parts)


def drain_reason_for_xid(xid: int, *, gpu: str | None = None) -> str | None:
    """The drain reason RLGuard writes for ``xid``, or None when the XID does not call for a
    drain (an application fault such as XID 13 or 31 is the job's, not the node's)."""
    what = DRAIN_XIDS.get(xid)
    if what is None:
        return None
    on = f"gpu {gpu} " if gpu is not None else ""
    return f"rlguard: {on}XID {xid} ({what})"


class SlurmBackend:
    """Processes as children of the launcher; whole-job restarts and node drains through Slurm."""

    name = "slurm"

    def __init__(
        self,
        *,
        job_id: str | None = None,
        node: str | None = None,
        scontrol: str = "scontrol",
        timeout: float = 10.0,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.job_id = job_id
        self.node = node
        self._scontrol = scontrol
        self._timeout = timeout
        self._environ = environ
        self._local = LocalBackend()

    def check(self) -> None:
        """Find ``scontrol``, this job and this node; :class:`BackendError` when not in a job."""
        path = shutil.which(self._scontrol)
        if path is None:
            raise BackendError(f"{self._scontrol!r} not found: the slurm backend needs Slurm")
        self._scontrol = path
        env = os.environ if self._environ is None else self._environ
        if self.job_id is None:
            self.job_id = env.get("SLURM_JOB_ID")
        if not self.job_id:
            raise BackendError(
                "not inside a Slurm job (SLURM_JOB_ID is not set): start rlguard launch from "
                "an sbatch script"
            )
        if not _JOB_ID.fullmatch(self.job_id):
            raise BackendError(f"SLURM_JOB_ID is not a job id: {self.job_id!r}")
        if self.node is None:
            self.node = env.get("SLURMD_NODENAME")
        if self.node is not None and not _NODE_NAME.fullmatch(self.node):
            raise BackendError(f"SLURMD_NODENAME is not a node name: {self.node!r}")
        if self.job_state() is None:
            raise BackendError(f"Slurm does not know job {self.job_id}")

    # ---- processes: as the local backend ---------------------------------------------------

    def spawn(
        self, argv: list[str], *, env: Mapping[str, str], log_path: Path, cwd: Path | None
    ) -> subprocess.Popen[bytes]:
        """Start one process in this batch step (as ``local``)."""
        return self._local.spawn(argv, env=env, log_path=log_path, cwd=cwd)

    def kill(self, proc: subprocess.Popen[bytes], timeout: float) -> None:
        """End ``proc`` now (as ``local``)."""
        self._local.kill(proc, timeout)

    # ---- the scheduler -----------------------------------------------------------------------

    def requeue_job(self, reason: str) -> bool:
        """``scontrol requeue`` this job; False (logged) when Slurm refuses (the supervisor then
        restarts the processes itself).

        Returns at once: Slurm stops this very process (the batch step) once the job is requeued,
        and the supervisor must answer the request first. A small detached helper waits for the
        job to be PENDING and sets its start time to now (``scontrol update JobId=J
        StartTime=now``); without it Slurm would hold the requeued job for its credential
        lifetime (``AuthInfo=cred_expire``, 120 s by default). Where the helper is stopped with
        the job (``proctrack/cgroup``), the job starts after that delay instead.
        """
        job = self._job()
        # The watcher starts first, detached from this batch step: Slurm stops every process
        # of the step when the job is requeued, and one caught half-detached would be waited
        # for (the job stuck COMPLETING).
        watcher = self._start_requeue_watcher(job)
        try:
            self._run("requeue", job)
        except _StoppedWithTheStep:
            # Slurm accepted the requeue and is stopping this batch step, scontrol included,
            # before scontrol returned (seen in CI): the requeue went through; the watcher,
            # detached from the step, must live on.
            log.warning("Slurm job %s requeued (scontrol stopped with the step): %s", job, reason)
            return True
        except BackendError as exc:
            log.error("requeue of Slurm job %s refused (%s); restarting in place", job, exc)
            if watcher is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(watcher, signal.SIGTERM)
            return False
        log.warning("Slurm job %s requeued: %s", job, reason)
        return True

    def _start_requeue_watcher(self, job: str) -> int | None:
        """A detached shell that, once the requeued job is PENDING, sets its start time to now
        (again while it stays PENDING, in case Slurm sets its delay after the first update) and
        ends when the job runs again; its pid, or None (then Slurm's delay applies).

        It waits one second after it first sees the job PENDING: slurmd revoked the old
        credential (whole seconds) before the job left COMPLETING, and refuses a credential
        created in that same second (``ctime <= revoked``: "Job credential revoked", and the
        job ends FAILED). Seen here once in a few runs when the job restarted within a second.
        """
        sc = shlex.quote(self._scontrol)
        watch = (
            "seen=0; i=0; "
            f"while [ $i -lt {_REQUEUE_WATCH_TRIES} ]; do "
            f"s=$({sc} show job -o {job} 2>/dev/null); "
            'case "$s" in '
            "*JobState=PENDING*) [ $seen = 0 ] && sleep 1; seen=1; "
            f"{sc} update JobId={job} StartTime=now ;; "
            "*JobState=COMPLETING*|*JobState=REQUEUE*) ;; "
            "*) [ $seen = 1 ] && exit 0 ;; "
            "esac; sleep 0.5; i=$((i+1)); done"
        )
        try:
            # Detached twice: a new session, then orphaned by the shell that starts it (which
            # has exited when this returns), so it is no longer in the step's process tree.
            out = subprocess.run(
                ["sh", "-c", f"({watch}) </dev/null >/dev/null 2>&1 & echo $!"],
                start_new_session=True,
                capture_output=True,
                text=True,
                timeout=self._timeout,
                check=False,
            )
            return int(out.stdout.strip())
        except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
            log.warning("job %s will start after Slurm's requeue delay: %s", job, exc)
            return None

    def job_state(self) -> str | None:
        """This job's ``JobState`` (RUNNING, PENDING, COMPLETED ...); None when Slurm does not
        know it."""
        try:
            out = self._run("show", "job", "-o", self._job())
        except BackendError:
            return None
        return parse_record(out).get("JobState")

    def node_state(self) -> str | None:
        """This node's ``State`` (``IDLE``, ``ALLOCATED+DRAIN``, ``DOWN*`` ...); None when the
        node is unknown to the backend or to Slurm."""
        if not self.node:
            return None
        return self.show_node(self.node).get("State")

    def show_node(self, node: str) -> dict[str, str]:
        """``scontrol show node -o NODE`` as a dict; empty when Slurm does not know it."""
        try:
            return parse_record(self._run("show", "node", "-o", node))
        except BackendError:
            return {}

    def drain_node(self, reason: str, *, node: str | None = None) -> None:
        """``scontrol update NodeName=NODE State=DRAIN Reason=REASON``: running jobs finish,
        nothing new starts there. Raises :class:`BackendError` when Slurm refuses."""
        target = node or self.node
        if not target or not _NODE_NAME.fullmatch(target):
            raise BackendError(f"no node to drain (got {target!r})")
        if not reason.strip() or "\n" in reason:
            raise BackendError(f"a drain needs a one-line reason, got {reason!r}")
        self._run("update", f"NodeName={target}", "State=DRAIN", f"Reason={reason}")
        log.warning("Slurm node %s drained: %s", target, reason)

    def _job(self) -> str:
        if not self.job_id:
            raise BackendError("the slurm backend has no job (check() was not called)")
        return self.job_id

    def _run(self, *args: str) -> str:
        try:
            out = subprocess.run(
                [self._scontrol, *args],
                capture_output=True,
                text=True,
                timeout=self._timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise BackendError(
                f"scontrol {args[0]} gave no answer within {self._timeout} s"
            ) from None
        except OSError as exc:
            raise BackendError(f"scontrol cannot run: {exc}") from None
        if out.returncode in (-signal.SIGTERM, -signal.SIGKILL):
            raise _StoppedWithTheStep(f"scontrol {' '.join(args[:2])} was stopped by a signal")
        if out.returncode != 0:
            raise BackendError(
                f"scontrol {' '.join(args[:2])} failed ({out.returncode}): "
                f"{(out.stderr or out.stdout).strip()[:300]}"
            )
        return out.stdout


class _StoppedWithTheStep(BackendError):
    """scontrol was ended by SIGTERM/SIGKILL: Slurm is stopping the batch step it runs in."""


BACKEND = SlurmBackend()
