"""The node-side supervisor: runs a job's processes, reports their exits, restarts on request.

One supervisor per launch (``rlguard launch``, ``python -m workload.launch``). It:

* starts one process per child (role, rank) through its :mod:`backend
  <recovery.supervision.backends>`, with the argv and environment its caller computes;
* sees an exit within ``poll`` seconds and writes it into the process's heartbeat (phase
  ``EXITED`` with the exit code or signal) *before* announcing it on the timeline
  (``child_exit``), so the timeline never shows an exit the heartbeat does not;
* carries out the launcher hook's requests (:mod:`recovery.supervision.requests`) and never
  restarts anything by itself: a restart spends the
  :class:`~recovery.supervision.restarts.RestartBudget` (empty: refused, saying so), waits its
  backoff, and is held while the control file says ``SAFE_MODE`` (an approved heavy action is
  the release); ``capture_stacks`` (:mod:`recovery.supervision.stacks`) is answered at once and
  never held; ``inject_fault`` is :mod:`recovery.supervision.drills`;
* keeps a starting process's heartbeat fresh (``STARTING``) and optionally a warm standby per
  role (:mod:`recovery.supervision.standby`) once the job is steady.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recovery.control import ControlError, ControlMode, read_control, write_control
from recovery.errors import RecoveryError
from recovery.fsio import write_json_atomic
from recovery.launcher_reports import declare_launch, report_process_exit, report_starting
from recovery.redaction import environment_secrets
from recovery.report import (
    DONE_PHASE,
    EXITED_PHASE,
    STARTING_PHASE,
    heartbeat_path,
    read_heartbeat,
)
from recovery.supervision import requests
from recovery.supervision.backends import Backend
from recovery.supervision.backends.local import LocalBackend
from recovery.supervision.drills import DrillDesk
from recovery.supervision.events import EVENTS_FILE, append_event
from recovery.supervision.exit_causes import Catalogue, ExitCause
from recovery.supervision.kernel_oom import memory_events_path, oom_kill_line, oom_kills
from recovery.supervision.output_tail import OutputTail
from recovery.supervision.restarts import RestartBudget
from recovery.supervision.stacks import StackCapture, capture_limits, capture_stacks
from recovery.supervision.standby import StandbyPool, reports_steadily

log = logging.getLogger("rlguard.recovery.supervision")

# Heavy-tier actions reach the launcher only after an approver said so.
APPROVED_HEAVY_ACTIONS = ("restart_job", "restore_checkpoint")
_KILL_TIMEOUT = 10.0


@dataclass
class Child:
    """One supervised process slot: a role and rank, and the process now filling it."""

    role: str
    rank: int
    proc: subprocess.Popen[bytes] | None = None
    reported_exit: bool = False
    starts: int = 0
    vouched_at: float = 0.0
    started_at: float = 0.0
    quick_failures: int = 0
    last_pid: int | None = None
    # Why its last process failed, from its own output (exit-cause catalogue); None: unknown.
    tail: OutputTail | None = None
    secrets: dict[str, str] = field(default_factory=dict)
    oom_kills_at_start: int | None = None

    @property
    def name(self) -> str:
        return f"{self.role}-{self.rank}"

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()


@dataclass
class _Restart:
    children: list[Child]
    due: float
    why: str
    asked_by: list[requests.Request]
    extra: dict[str, Any] = field(default_factory=dict)


class Supervisor:
    """See the module docstring. ``command(child)`` is the argv of the child's next start
    (``child.starts`` is 0 before the first), ``env(child)`` its environment; ``order(child,
    argv, env, log)`` the line that makes a standby that process (needed with ``standby``);
    ``py_spy`` the py-spy executable for ``capture_stacks`` (``stacks.find_py_spy``), None
    where none is installed; ``exit_causes`` the catalogue a failed exit's output tail is
    matched against (:mod:`recovery.supervision.exit_causes`), None: no causes looked for;
    ``first_step_budget`` what each process declares as its first-step hang budget
    (:func:`recovery.launcher_reports.declare_launch`), None: the policy's."""

    def __init__(
        self,
        run_dir: Path,
        job: str,
        children: list[Child],
        *,
        command: Callable[[Child], list[str]],
        env: Callable[[Child], Mapping[str, str]] = lambda child: dict(os.environ),
        backend: Backend | None = None,
        budget: RestartBudget | None = None,
        standby: StandbyPool | None = None,
        order: Callable[[Child, list[str], Mapping[str, str], Path], bytes] | None = None,
        clean_exit_phase: str = DONE_PHASE,
        cwd: Path | None = None,
        timeout: float | None = None,
        poll: float = 0.1,
        py_spy: str | None = None,
        exit_causes: Catalogue | None = None,
        first_step_budget: float | None = None,
    ) -> None:
        if standby is not None and order is None:
            raise ValueError("a standby pool needs an order function")
        self.run_dir = run_dir
        self.job = job
        self.children = children
        self._command = command
        self._env = env
        self.backend: Backend = backend or LocalBackend()
        self.budget = budget or RestartBudget()
        self.standby = standby
        self._order = order
        self.clean_exit_phase = clean_exit_phase
        self.cwd = cwd
        self.timeout = timeout
        self.poll = poll
        self.py_spy = py_spy  # None: not installed; captures say so (see the class docstring)
        self.exit_causes = exit_causes
        self.first_step_budget = first_step_budget
        self._memory_events = memory_events_path() if exit_causes is not None else None
        self.log_dir = run_dir / "logs"
        self._restarts: list[_Restart] = []
        # Restarts carried out whose answers wait (``due``: when spawned; ``extra``: the answer).
        self._held: list[_Restart] = []
        self._deferred_keys: set[str] = set()
        self._stopping = False
        self.drills = DrillDesk()  # a launcher with injection points replaces its injector
        self.log_dir.mkdir(parents=True, exist_ok=True)
        requests.requests_dir(run_dir).mkdir(parents=True, exist_ok=True)

    # ---- timeline ----------------------------------------------------------------------------

    def event(self, kind: str, **fields: Any) -> None:
        """Append one event to the run directory's timeline (``events.jsonl``)."""
        append_event(self.run_dir / EVENTS_FILE, kind, **fields)

    # ---- processes ---------------------------------------------------------------------------

    def start(self) -> None:
        """Say the launcher runs (for the hook) and start every child."""
        roles = sorted({c.role for c in self.children})
        requests.announce(self.run_dir, job=self.job, backend=self.backend.name, roles=roles)
        for child in self.children:
            self.spawn(child)

    def spawn(self, child: Child) -> None:
        """Start ``child``'s process: a warm standby of its role if one waits, else cold."""
        argv = self._command(child)
        env = self._env(child)
        log_path = self.log_dir / f"{child.name}.log"
        if self.exit_causes is not None:
            child.tail = child.tail or OutputTail(log_path)
            child.tail.mark()  # this start's output begins here
            child.secrets = environment_secrets(env)
            child.oom_kills_at_start = oom_kills(self._memory_events)
        warm = None
        if self.standby is not None and self._order is not None:
            warm = self.standby.activate(child.role, self._order(child, argv, env, log_path))
        child.proc = warm or self.backend.spawn(argv, env=env, log_path=log_path, cwd=self.cwd)
        child.reported_exit = False
        child.starts += 1
        child.started_at = time.monotonic()
        child.vouched_at = 0.0
        child.last_pid = child.proc.pid
        if self.first_step_budget is not None:  # for this process: replaced at each start
            declare_launch(
                self.run_dir,
                child.role,
                child.rank,
                pid=child.proc.pid,
                first_step_budget_seconds=self.first_step_budget,
            )
        self.event(
            "spawn",
            role=child.role,
            rank=child.rank,
            child_pid=child.proc.pid,
            start=child.starts,
            warm=warm is not None,
            argv=argv,
        )
        self._write_pids()

    def kill(self, child: Child) -> None:
        """End ``child``'s process now; its exit is ours, not a fault to report."""
        if child.proc is not None:
            self.backend.kill(child.proc, _KILL_TIMEOUT)
        child.reported_exit = True

    def restart_now(self, children: list[Child], why: str) -> None:
        """Kill and start ``children`` at once (no budget, no backoff: the caller decided)."""
        for child in children:
            self.kill(child)
        self.event("restart", roles=[c.name for c in children], why=why)
        for child in children:
            self.spawn(child)

    def _write_pids(self) -> None:
        write_json_atomic(
            self.run_dir / "pids.json",
            {
                c.name: c.proc.pid
                for c in self.children
                if c.proc is not None and c.proc.poll() is None
            },
        )

    # ---- the loop ----------------------------------------------------------------------------

    def loop(self) -> int:
        """Supervise until the job is finished (0), ``timeout`` passed (4) or :meth:`stop` (130)."""
        started = time.monotonic()
        while not self._stopping:
            if self.timeout is not None and time.monotonic() - started > self.timeout:
                log.error("job did not finish within %.0f s", self.timeout)
                self.event("launcher_timeout")
                return 4
            self.tick()  # first: an exit is reported (heartbeat) even when it ends the job
            if self.finished():
                self.wind_down()
                self.event("job_done")
                return 0
            time.sleep(self.poll)
        return 130

    def tick(self) -> list[str]:
        """One round of supervision; returns the names of children whose process failed."""
        failed = self.check_exits()
        self.handle_requests()
        self._run_due_restarts()
        self.drills.fire_due(self)
        self._vouch_for_starting()
        self._keep_standbys()
        return failed

    def finished(self) -> bool:
        """Whether the job is done: every process exited 0 and no restart is pending."""
        return not self._restarts and all(c.returncode == 0 for c in self.children)

    def wind_down(self) -> None:
        """Called once when the job finished, before ``job_done`` goes on the timeline."""

    def exit_expected(self, child: Child, code: int) -> bool:
        """Whether ``child``'s exit is part of the job's normal end (not reported at all)."""
        return False

    def standby_wanted(self) -> bool:
        """Whether warm standbys may start now (the job is steady: see :meth:`_keep_standbys`)."""
        return True

    def check_exits(self) -> list[str]:
        """Report every new exit (heartbeat first, then the timeline); failed children's names."""
        failed = []
        for c in self.children:
            code = c.returncode
            if code is None or self.exit_expected(c, code):
                continue
            if not c.reported_exit:
                c.reported_exit = True
                ran = time.monotonic() - c.started_at
                c.quick_failures = c.quick_failures + 1 if ran < self.budget.stable_seconds else 0
                cause = self.exit_cause(c, code) if code != 0 else None
                # The heartbeat first: whoever reads the event must find the exit there already.
                report_process_exit(
                    self.run_dir,
                    c.role,
                    c.rank,
                    job=self.job,
                    pid=c.proc.pid if c.proc is not None else None,
                    returncode=code,
                    clean_exit_phase=self.clean_exit_phase,
                    exit_cause=cause.to_dict() if cause is not None else None,
                )
                self.event(
                    "child_exit",
                    role=c.role,
                    rank=c.rank,
                    code=code,
                    ran_s=round(ran, 3),
                    cause=cause.cause if cause is not None else None,
                    line=cause.line if cause is not None else None,
                )
                self._write_pids()
            if code != 0 or self.clean_exit_phase == EXITED_PHASE:
                failed.append(c.name)
        return failed

    def exit_cause(self, child: Child, code: int) -> ExitCause | None:
        """Why ``child``'s process failed with ``code``, as the tail of its own output (and
        the kernel's OOM-kill record for a SIGKILL) says; None when nothing known matches."""
        if self.exit_causes is None or child.tail is None:
            return None
        lines = child.tail.lines(child.secrets)
        exit_signal = None
        if code < 0:
            try:
                exit_signal = signal.Signals(-code).name
            except ValueError:
                exit_signal = f"SIG{-code}"
        if exit_signal == "SIGKILL":
            record = oom_kill_line(
                child.oom_kills_at_start, oom_kills(self._memory_events), self._memory_events
            )
            if record is not None:
                lines.append(record)
        return self.exit_causes.match(lines, exit_signal=exit_signal)

    def _vouch_for_starting(self) -> None:
        """Keep the heartbeat of a process that is still starting (importing torch takes seconds
        on a busy machine) fresh, with phase STARTING and the new pid, until the process writes
        its own: a restart that is under way must not look like a second silent participant."""
        now = time.monotonic()
        for c in self.children:
            if c.proc is None or c.proc.poll() is not None or now - c.vouched_at < 0.5:
                continue
            beat = read_heartbeat(heartbeat_path(self.run_dir, c.role, c.rank)) or {}
            if beat.get("pid") == c.proc.pid and beat.get("phase") != STARTING_PHASE:
                continue  # the process reports for itself now
            c.vouched_at = now
            report_starting(self.run_dir, c.role, c.rank, job=self.job, pid=c.proc.pid)

    def _keep_standbys(self) -> None:
        """Start the missing standbys once the job is steady: every process is alive and writes
        its own heartbeat (not while the job starts or recovers, when CPU is what it lacks)."""
        if self.standby is None:
            return
        self.standby.reap()
        missing = self.standby.missing({c.role for c in self.children})
        if not missing or self._restarts or not self.standby_wanted():
            return
        for c in self.children:
            if c.proc is None or c.proc.poll() is not None:
                return
            beat = read_heartbeat(heartbeat_path(self.run_dir, c.role, c.rank))
            if not reports_steadily(beat, pid=c.proc.pid):
                return
        for role in missing:
            self.standby.start(role)

    # ---- launcher hook requests --------------------------------------------------------------

    def handle_requests(self) -> None:
        """Carry out (or hold) every request the hook left."""
        in_progress = {req.path for r in [*self._restarts, *self._held] for req in r.asked_by}
        in_progress |= self.drills.armed_paths()  # a drill armed for its step is answered then
        for req in requests.pending(self.run_dir):
            if req.path in in_progress:
                continue
            if requests.answered(req):  # carried out before a crash between answer and unlink
                req.path.unlink(missing_ok=True)
                continue
            mine = bool(self._targets(req.body.get("role"), req.body.get("rank")))
            if requests.for_another_launcher(self.run_dir, req.body, runs_it=mine):
                continue
            result = self.carry_out(req)
            if result is not None:
                requests.answer(req, result)

    def carry_out(self, req: requests.Request) -> dict[str, Any] | None:
        """The answer to ``req``, or None while it is held or scheduled (answered later)."""
        body = req.body
        action, role, rank = body.get("action"), body.get("role"), body.get("rank")
        key = str(body.get("key"))
        if key not in self._deferred_keys:
            self.event("hook_request", action=action, role=role, rank=rank)
        if action == "capture_stacks":
            return self._capture_stacks(role, rank, body.get("extra"))
        if action == "inject_fault":
            return self.drills.handle(self, req)
        if action in APPROVED_HEAVY_ACTIONS:
            released = self._release_safe_mode(f"{action} approved ({key})")
            if self.backend.requeue_job(f"{action} requested"):
                self.event("requeued", action=action, backend=self.backend.name)
                return {"ok": True, "requeued": True, "released_safe_mode": released}
            return self._schedule(
                req, self.children, f"{action} requested", {"released_safe_mode": released}
            )
        if action == "drain_node":
            return self._drain_node(body)
        if action in ("restart_role", "reschedule_batches"):
            if role is None:
                if action == "reschedule_batches":
                    # One machine: there is no healthy node to move batches to; processes that
                    # lost work redo it themselves, so nothing is left to move.
                    return {"ok": True, "restarted": [], "note": "single node: nothing to move"}
                return {"ok": False, "error": "restart_role needs --role"}
            targets = self._targets(role, rank)
            if not targets:
                return {"ok": False, "error": f"no process with role {role!r} rank {rank!r}"}
            held = self._safe_mode_reason()
            if held is not None:
                if key not in self._deferred_keys:
                    self._deferred_keys.add(key)
                    self.event("restart_held", action=action, role=role, rank=rank, why=held)
                    log.warning("%s of %s held: %s", action, role, held)
                return None
            self._deferred_keys.discard(key)
            return self._schedule(req, targets, f"{action} requested", {})
        return {"ok": False, "error": f"unknown launcher action {action!r}"}

    def _targets(self, role: Any, rank: Any) -> list[Child]:
        return [
            c
            for c in self.children
            if c.role == role and (rank is None or str(c.rank) == str(rank))
        ]

    def _capture_stacks(self, role: Any, rank: Any, extra: Any) -> dict[str, Any]:
        """The stacks of ``role`` (``rank``: one process), each dump within what is left of
        the request's timeout. A process that already exited has none, which the answer says:
        the restart that follows must not wait for forensics."""
        targets = self._targets(role, rank)
        if not targets:
            return {"ok": False, "error": f"no process with role {role!r} rank {rank!r}"}
        try:
            timeout, max_bytes = capture_limits(extra)
        except ValueError as exc:
            return {"ok": False, "error": str(exc)}
        deadline = time.monotonic() + timeout
        stacks = []
        for c in targets:
            code = c.returncode
            if c.proc is None or code is not None:
                capture = StackCapture.gone(c.last_pid or 0, code)
            else:
                left = max(0.1, deadline - time.monotonic())
                capture = capture_stacks(
                    c.proc.pid, py_spy=self.py_spy, timeout=left, max_bytes=max_bytes
                )
            self.event(
                "stacks_captured",
                role=c.role,
                rank=c.rank,
                child_pid=capture.pid,
                ok=capture.ok,
                reason=capture.reason,
                bytes=len(capture.text.encode("utf-8")),
            )
            stacks.append({"role": c.role, "rank": c.rank, **capture.to_dict()})
        return {"ok": True, "stacks": stacks}

    def _drain_node(self, body: dict[str, Any]) -> dict[str, Any]:
        """An approved drain: the backend takes the node out of its scheduler's service."""
        drain = getattr(self.backend, "drain_node", None)
        if drain is None:
            return {"ok": False, "error": f"the {self.backend.name} backend cannot drain a node"}
        extra = body.get("extra") or {}
        reason = extra.get("reason") if isinstance(extra, dict) else None
        if not isinstance(reason, str) or not reason.strip():
            return {"ok": False, "error": "drain_node needs a reason (--extra '{\"reason\": ...}')"}
        try:
            drain(reason, node=body.get("node"))
        except RecoveryError as exc:
            return {"ok": False, "error": str(exc)}
        self.event("node_drained", node=body.get("node"), reason=reason, backend=self.backend.name)
        return {"ok": True, "drained": body.get("node"), "reason": reason}

    def _safe_mode_reason(self) -> str | None:
        try:
            state = read_control(self.run_dir)
        except ControlError as exc:
            return f"the control file cannot be read ({exc}): no restart until it can"
        if state.mode is ControlMode.SAFE_MODE:
            return f"the job is in SAFE_MODE ({state.reason}): no restart until it is released"
        return None

    def _release_safe_mode(self, reason: str) -> bool:
        try:
            if read_control(self.run_dir).mode is not ControlMode.SAFE_MODE:
                return False
        except ControlError:
            pass  # an unreadable control file is replaced by the approved command
        write_control(self.run_dir, ControlMode.RUN, reason, timeout=10.0)
        return True

    def _schedule(
        self, req: requests.Request, children: list[Child], why: str, extra: dict[str, Any]
    ) -> dict[str, Any] | None:
        for pending in self._restarts:
            if {id(c) for c in children} <= {id(c) for c in pending.children}:
                # Already being restarted (in its backoff): one restart answers both requests.
                pending.asked_by.append(req)
                return None
        if not self.budget.spend():
            message = (
                f"restart budget spent: {self.budget.used} of {self.budget.max_restarts} "
                f"restarts used (--max-restarts); not restarting {[c.name for c in children]}"
            )
            log.error("%s", message)
            self.event("restart_refused", roles=[c.name for c in children], why=message)
            return {"ok": False, "error": message, "budget_left": 0}
        delay = max(self.budget.delay(c.quick_failures) for c in children)
        for child in children:  # at once: a hung process must not keep its GPU during backoff
            self.kill(child)
        if delay > 0:
            self.event("restart_backoff", roles=[c.name for c in children], delay_s=delay)
        self._restarts.append(_Restart(children, time.monotonic() + delay, why, [req], extra))
        return None

    def _run_due_restarts(self) -> None:
        now = time.monotonic()
        for restart in list(self._restarts):
            if restart.due > now:
                continue
            self._restarts.remove(restart)
            self.event("restart", roles=[c.name for c in restart.children], why=restart.why)
            for child in restart.children:
                self.spawn(child)
            answer = {
                "ok": True,
                "restarted": [c.name for c in restart.children],
                "budget_left": self.budget.left,
                **restart.extra,
            }
            self._held.append(
                _Restart(restart.children, now, restart.why, restart.asked_by, answer)
            )
        self._answer_held()

    def restart_answer(
        self, children: list[Child], answer: dict[str, Any], spawned_at: float
    ) -> dict[str, Any] | None:
        """The answer to a restart of ``children`` (spawned at monotonic ``spawned_at``), or
        None to be asked next round: a role that must catch up before it serves (an engine
        refit to the trainer's weights) answers then, its stages on the incident's timeline."""
        return answer

    def _answer_held(self) -> None:
        for held in list(self._held):
            answer = self.restart_answer(held.children, dict(held.extra), held.due)
            if answer is None:
                continue
            self._held.remove(held)
            for req in held.asked_by:
                requests.answer(req, answer)

    # ---- stopping ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Make :meth:`loop` return (from a signal handler)."""
        self._stopping = True

    def close(self, timeout: float = 5.0) -> None:
        """End the standbys and every process (SIGTERM, SIGKILL after ``timeout``)."""
        if self.standby is not None:
            self.standby.close(timeout)
        for c in self.children:
            if c.proc is not None and c.proc.poll() is None:
                try:
                    os.kill(c.proc.pid, signal.SIGCONT)  # a stopped process cannot take SIGTERM
                    c.proc.terminate()
                except ProcessLookupError:
                    continue
        deadline = time.monotonic() + timeout
        for c in self.children:
            if c.proc is None:
                continue
            try:
                c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.backend.kill(c.proc, _KILL_TIMEOUT)
        requests.retire(self.run_dir)
        (self.run_dir / "pids.json").unlink(missing_ok=True)
