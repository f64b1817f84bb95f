"""The launcher's supervisor: starts the trainer and the rollout workers and restarts them.

It also hosts what the job's processes share for its lifetime: the weight-source registry
(:mod:`recovery.transfer.registry_net`) and the checkpoint coordinator (with a file lease).

What it does when a process dies depends on ``on_failure``:

* ``wait`` (the default, RLGuard mode): it does not restart anything by itself. It reports the
  exit at once (waitpid): the process's heartbeat file gets phase ``EXITED``, which the node
  agent forwards and the policy engine treats as lost right away (no heartbeat timeout to sit
  out). The policy engine plans ``restart_role`` / ``restart_job``, and the Celery worker runs
  the launcher hook, which leaves a request in ``recovery/launcher/`` that the supervisor
  carries out (kill -9 what is left of the role, start it again) and answers. With ``standby``
  (the default in this mode) a warm standby per role (:mod:`workload.standby`: Python and torch
  already loaded) takes the dead process's place. Standbys are started only while every role
  runs and reports for itself (not while the job starts or recovers, when CPU is what the job
  is short of), at a lower CPU priority.
* ``restart-job``: the common practice the ETTR benchmark compares against: any dead or hung
  process (heartbeat older than ``hang_timeout``) restarts every process from the latest
  checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recovery.checkpoint.coordinator import Coordinator
from recovery.control import ControlMode, read_control, write_control
from recovery.report import HeartbeatReporter, heartbeat_path
from recovery.transfer import InMemoryRegistry, RegistryServer
from workload.file_lease import FileLease
from workload.job import JobConfig, RunDir, read_json, write_json_atomic

log = logging.getLogger("rlguard.workload.launch")
EXITED = (
    "EXITED"  # heartbeat phase of a process the supervisor saw exit (app policy: exited_phases)
)
# How much lower a standby's CPU priority is while it imports: that must not slow the running
# job. Only lowered where it can be raised back on activation (root); mild, so that a busy
# machine does not starve it for longer than the time between faults.
STANDBY_NICE = 5


@dataclass
class Child:
    role: str
    rank: int
    proc: subprocess.Popen[bytes] | None = None
    reported_exit: bool = False
    starts: int = 0
    vouched_at: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.role}-{self.rank}"


@dataclass
class Supervisor:
    run: RunDir
    config: JobConfig
    on_failure: str = "wait"
    hang_timeout: float = 10.0
    timeout: float | None = None
    standby: bool = False
    children: list[Child] = field(default_factory=list)
    standbys: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _stopping: bool = False
    _incarnation: int = 0

    def __post_init__(self) -> None:
        if self.on_failure not in ("wait", "restart-job"):
            raise ValueError(f"on_failure must be 'wait' or 'restart-job', got {self.on_failure!r}")
        if self.standby and self.on_failure != "wait":
            # The whole-job restart is the common practice the benchmark compares against: cold.
            raise ValueError("standby processes are for on_failure='wait' (role-local restarts)")
        self.run.root.mkdir(parents=True, exist_ok=True)
        (self.run.root / "logs").mkdir(exist_ok=True)
        self.run.launcher_requests.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.run.config, self.config.to_json())
        self.registry = RegistryServer(InMemoryRegistry())
        self.coordinator = Coordinator(
            coordinator_id=f"launcher-{os.getpid()}",
            lease=FileLease(self.run.root / "coordinator.lease", ttl=3.0),
            checkpoint_interval_steps=1,
            round_timeout=3.0,
            request_timeout=1.0,
            suspect_after=2.0,
            confirm_after=4.0,
            tick=0.1,
        )
        self.coordinator.start()
        write_json_atomic(
            self.run.runtime,
            {
                "registry": self.registry.address,
                "coordinator": self.coordinator.url,
                "launcher_pid": os.getpid(),
            },
        )
        self.children = [Child("trainer", 0)] + [
            Child("rollout", k) for k in range(self.config.rollouts)
        ]

    # ---- processes ---------------------------------------------------------------------------

    def _role_argv(self, child: Child) -> list[str]:
        if child.role == "trainer":
            self._incarnation += 1
            return ["--run-dir", str(self.run.root), "--incarnation", str(self._incarnation)]
        return ["--run-dir", str(self.run.root), "--rank", str(child.rank)]

    def _spawn(self, child: Child) -> None:
        argv = self._role_argv(child)
        log_path = self.run.root / "logs" / f"{child.name}.log"
        warm = self._activate_standby(child.role, argv, log_path)
        if warm is not None:
            child.proc = warm
        else:
            logfile = open(log_path, "ab")  # noqa: SIM115
            try:
                child.proc = subprocess.Popen(
                    [sys.executable, "-m", f"workload.{child.role}", *argv],
                    stdout=logfile,
                    stderr=logfile,
                    stdin=subprocess.DEVNULL,
                )
            finally:
                logfile.close()
        child.reported_exit = False
        child.starts += 1
        self.run.event(
            "spawn",
            role=child.role,
            rank=child.rank,
            child_pid=child.proc.pid,
            start=child.starts,
            warm=warm is not None,
        )
        self._write_pids()

    # ---- warm standbys -----------------------------------------------------------------------

    def _start_standby(self, role: str) -> None:
        logfile = open(self.run.root / "logs" / f"standby-{role}.log", "ab")  # noqa: SIM115
        lower = os.geteuid() == 0
        try:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "workload.standby",
                    "--role",
                    role,
                    "--run-dir",
                    str(self.run.root),
                ],
                stdout=logfile,
                stderr=logfile,
                stdin=subprocess.PIPE,
                preexec_fn=(lambda: os.nice(STANDBY_NICE)) if lower else None,
            )
        finally:
            logfile.close()
        self.standbys[role] = proc
        self.run.event("standby_start", role=role, child_pid=proc.pid)

    def _keep_standbys(self) -> None:
        """Start the missing standbys once the job is steady: every role's process is alive and
        writes its own heartbeat."""
        for role, proc in list(self.standbys.items()):
            if proc.poll() is not None:  # died while waiting (killed, out of memory): replace it
                log.warning("standby %s exited (%s) while waiting", role, proc.returncode)
                self.run.event("standby_exit", role=role, code=proc.returncode)
                del self.standbys[role]
        missing = sorted({c.role for c in self.children} - set(self.standbys))
        if not self.standby or not missing or self.run.done.exists():
            return
        for c in self.children:
            if c.proc is None or c.proc.poll() is not None:
                return
            beat = read_json(heartbeat_path(self.run.root, c.role, c.rank)) or {}
            if beat.get("pid") != c.proc.pid or beat.get("phase") in ("INIT", "STARTING"):
                return
        for role in missing:
            self._start_standby(role)

    def _activate_standby(
        self, role: str, argv: list[str], log_path: Path
    ) -> subprocess.Popen[bytes] | None:
        proc = self.standbys.pop(role, None)
        if proc is None:
            return None
        if proc.poll() is not None or proc.stdin is None:
            log.warning("standby %s exited (%s): starting the role cold", role, proc.returncode)
            return None
        try:
            # Back to the launcher's priority before it has work to do (root may raise it).
            os.setpriority(os.PRIO_PROCESS, proc.pid, os.getpriority(os.PRIO_PROCESS, 0))
        except OSError as exc:
            log.warning("standby %s keeps its lower CPU priority: %s", role, exc)
        try:
            proc.stdin.write((json.dumps({"argv": argv, "log": str(log_path)}) + "\n").encode())
            proc.stdin.close()
        except OSError as exc:  # it died between the poll and the write
            log.warning("standby %s did not take its order (%s): starting the role cold", role, exc)
            self._kill_process(proc)
            return None
        return proc

    def _write_pids(self) -> None:
        write_json_atomic(
            self.run.root / "pids.json",
            {
                c.name: c.proc.pid
                for c in self.children
                if c.proc is not None and c.proc.poll() is None
            },
        )

    @staticmethod
    def _kill(child: Child) -> None:
        if child.proc is not None:
            Supervisor._kill_process(child.proc)

    @staticmethod
    def _kill_process(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is not None:
            return
        try:
            os.kill(proc.pid, signal.SIGKILL)  # also ends a SIGSTOPped (hung) process
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)

    def _restart(self, children: list[Child], why: str) -> None:
        for c in children:
            self._kill(c)
        self.run.event("restart", roles=[c.name for c in children], why=why)
        for c in children:
            self._spawn(c)

    # ---- the loop ----------------------------------------------------------------------------

    def start(self) -> None:
        for c in self.children:
            self._spawn(c)

    def loop(self) -> int:
        started = time.monotonic()
        trainer = self.children[0]
        while not self._stopping:
            if self.timeout is not None and time.monotonic() - started > self.timeout:
                log.error("job did not finish within %.0f s", self.timeout)
                self.run.event("launcher_timeout")
                return 4
            if trainer.proc is not None and trainer.proc.poll() == 0 and self.run.done.exists():
                self._finish()
                return 0
            self._handle_requests()
            self._vouch_for_starting()
            self._keep_standbys()
            failed = self._failed_children()
            if failed and self.on_failure == "restart-job":
                self._restart(self.children, why=f"whole-job restart after {failed}")
            time.sleep(0.1)
        return 130

    def _vouch_for_starting(self) -> None:
        """Keep the heartbeat of a process that is still starting (importing torch takes seconds
        on a busy machine) fresh, with phase STARTING and the new pid, until the process writes
        its own: a restart that is under way must not look like a second silent participant."""
        now = time.monotonic()
        for c in self.children:
            if c.proc is None or c.proc.poll() is not None or now - c.vouched_at < 0.5:
                continue
            path = heartbeat_path(self.run.root, c.role, c.rank)
            beat = read_json(path) or {}
            if beat.get("pid") == c.proc.pid and beat.get("phase") != "STARTING":
                continue  # the process reports for itself now
            c.vouched_at = now
            reporter = HeartbeatReporter(
                self.run.root, c.role, c.rank, job=self.config.job, pid=c.proc.pid
            )
            reporter.update(phase="STARTING", force=True)
            reporter.close()

    def _failed_children(self) -> list[str]:
        failed = []
        now = time.time()
        for c in self.children:
            code = None if c.proc is None else c.proc.poll()
            if code is not None and not (c.role == "rollout" and self.run.done.exists()):
                if not c.reported_exit:
                    c.reported_exit = True
                    self.run.event("child_exit", role=c.role, rank=c.rank, code=code)
                    if self.on_failure == "wait":
                        self._report_exit(c, code)
                failed.append(c.name)
            elif self.on_failure == "restart-job" and code is None:
                beat = read_json(heartbeat_path(self.run.root, c.role, c.rank)) or {}
                age = now - float(beat.get("ts", now))
                if beat and age > self.hang_timeout:
                    self.run.event("child_hung", role=c.role, rank=c.rank, age=age)
                    failed.append(c.name)
        return failed

    def _report_exit(self, child: Child, code: int) -> None:
        """Say in the child's heartbeat that it exited: the agent forwards the phase, and the
        policy engine does not have to wait for the heartbeat to go silent. Everything else in
        the last heartbeat (step, fault counters) stays as the process left it."""
        path = heartbeat_path(self.run.root, child.role, child.rank)
        beat = read_json(path) or {
            "format": 1,
            "job": self.config.job,
            "role": child.role,
            "rank": child.rank,
        }
        now = time.time()
        pid = child.proc.pid if child.proc is not None else beat.get("pid")
        beat.update(phase=EXITED, pid=pid, ts=now, exit_code=code)
        write_json_atomic(path, beat)

    def _handle_requests(self) -> None:
        for req in sorted(self.run.launcher_requests.glob("*.json")):
            body = read_json(req)
            if body is None:
                continue
            result = self._carry_out(body)
            write_json_atomic(req.with_suffix(".done"), {**body, **result, "done_at": time.time()})
            req.unlink()

    def _carry_out(self, body: dict[str, Any]) -> dict[str, Any]:
        action, role, rank = body.get("action"), body.get("role"), body.get("rank")
        self.run.event("hook_request", action=action, role=role, rank=rank)
        targets = [
            c
            for c in self.children
            if (role is None or c.role == role) and (rank is None or str(c.rank) == str(rank))
        ]
        if action == "restart_job" or action == "restore_checkpoint":
            # Heavy-tier actions reach the launcher only after an approver said so: that is the
            # go-ahead to leave SAFE_MODE, so the restarted job resumes from its checkpoint.
            released = False
            if read_control(self.run.root).mode is ControlMode.SAFE_MODE:
                write_control(
                    self.run.root,
                    ControlMode.RUN,
                    f"{action} approved ({body.get('key')})",
                    timeout=10.0,
                )
                released = True
            self._restart(self.children, why=f"{action} requested")
            return {
                "ok": True,
                "restarted": [c.name for c in self.children],
                "released_safe_mode": released,
            }
        if action in ("restart_role", "reschedule_batches"):
            if role is None:
                if action == "reschedule_batches":
                    # One machine: there is no healthy node to move batches to; the rollouts
                    # that lost work redo it themselves (WAL), so nothing is left to move.
                    return {"ok": True, "restarted": [], "note": "single node: nothing to move"}
                return {"ok": False, "error": "restart_role needs --role"}
            if not targets:
                return {"ok": False, "error": f"no process with role {role!r} rank {rank!r}"}
            self._restart(targets, why=f"{action} requested")
            return {"ok": True, "restarted": [c.name for c in targets]}
        return {"ok": False, "error": f"unknown launcher action {action!r}"}

    def _finish(self) -> None:
        deadline = time.monotonic() + 15
        for c in self.children[1:]:
            while c.proc is not None and c.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        self.run.event("job_done")

    def stop(self) -> None:
        self._stopping = True

    def close(self) -> None:
        for proc in self.standbys.values():
            if proc.stdin is not None:
                try:
                    proc.stdin.close()  # end of input: the standby exits
                except OSError:
                    pass
        for c in self.children:
            if c.proc is not None and c.proc.poll() is None:
                try:
                    os.kill(c.proc.pid, signal.SIGCONT)
                    c.proc.terminate()
                except ProcessLookupError:
                    continue
        deadline = time.monotonic() + 5
        for c in self.children:
            if c.proc is None:
                continue
            try:
                c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._kill(c)
        for proc in self.standbys.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._kill_process(proc)
        self.standbys.clear()
        self.coordinator.close()
        self.registry.close()
        Path(self.run.root / "pids.json").unlink(missing_ok=True)
