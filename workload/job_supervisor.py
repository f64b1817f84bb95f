"""The reference job's supervisor: :class:`recovery.supervision.Supervisor` with the trainer and
the rollout workers as its children.

On top of the generic supervisor it hosts what the job's processes share for its lifetime: the
weight-source registry (:mod:`recovery.transfer.registry_net`) and the checkpoint coordinator
(with a file lease), and it knows the job's own end (the trainer writes ``DONE``; the rollouts
then exit on their own).

What it does when a process dies depends on ``on_failure``:

* ``wait`` (the default, RLGuard mode): exactly what the generic supervisor does. It reports
  the exit at once (heartbeat phase ``EXITED``) and restarts only when RLGuard's launcher hook
  asks (``restart_role`` / ``restart_job``). With ``standby`` (the default in this mode) a warm
  standby per role (:mod:`workload.standby`: Python and torch already loaded) takes the dead
  process's place.
* ``restart-job``: the common practice the ETTR benchmark compares against: any dead or hung
  process (heartbeat older than ``hang_timeout``) restarts every process from the latest
  checkpoint, by the supervisor itself.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from recovery.checkpoint.coordinator import Coordinator
from recovery.report import EXITED_PHASE, heartbeat_path, read_heartbeat
from recovery.supervision import Child, RestartBudget, StandbyPool
from recovery.supervision import Supervisor as _Supervisor
from recovery.supervision.backends import Backend
from recovery.supervision.drills import DrillDesk
from recovery.supervision.exit_causes import load_catalogue
from recovery.supervision.stacks import find_py_spy
from recovery.transfer import InMemoryRegistry, RegistryServer
from workload.drills import ReferenceInjector
from workload.file_lease import FileLease
from workload.job import JobConfig, RunDir, write_json_atomic

log = logging.getLogger("rlguard.workload.launch")
EXITED = EXITED_PHASE  # heartbeat phase of a process the supervisor saw exit
# RLGuard decides every restart of the reference job; the budget only stops a runaway loop, and
# no backoff: the ETTR benchmark measures how fast a healthy job comes back.
REFERENCE_BUDGET = 1000
# How long a restart_role of an engine waits for its re-admission before it answers without it
# (the launcher hook waits 60 s for an answer by default).
READMIT_WAIT_S = 50.0


def start_job_services(run: RunDir, config: JobConfig) -> tuple[RegistryServer, Coordinator]:
    """What the job's processes share for its lifetime, hosted by whoever launches them (this
    supervisor, or the Ray driver of ``workload.ray_mode``): the config, the weight-source
    registry and the checkpoint coordinator, their addresses in the runtime file."""
    write_json_atomic(run.config, config.to_json())
    registry = RegistryServer(InMemoryRegistry())
    coordinator = Coordinator(
        coordinator_id=f"launcher-{os.getpid()}",
        lease=FileLease(run.root / "coordinator.lease", ttl=3.0),
        checkpoint_interval_steps=1,
        round_timeout=3.0,
        request_timeout=1.0,
        suspect_after=2.0,
        confirm_after=4.0,
        tick=0.1,
    )
    coordinator.start()
    write_json_atomic(
        run.runtime,
        {"registry": registry.address, "coordinator": coordinator.url, "launcher_pid": os.getpid()},
    )
    return registry, coordinator


class Supervisor(_Supervisor):
    def __init__(
        self,
        run: RunDir,
        config: JobConfig,
        on_failure: str = "wait",
        hang_timeout: float = 10.0,
        timeout: float | None = None,
        standby: bool = False,
        backend: Backend | None = None,
    ) -> None:
        if on_failure not in ("wait", "restart-job"):
            raise ValueError(f"on_failure must be 'wait' or 'restart-job', got {on_failure!r}")
        if standby and on_failure != "wait":
            # The whole-job restart is the common practice the benchmark compares against: cold.
            raise ValueError("standby processes are for on_failure='wait' (role-local restarts)")
        self.run = run
        self.config = config
        self.on_failure = on_failure
        self.hang_timeout = hang_timeout
        self._incarnation = 0
        run.root.mkdir(parents=True, exist_ok=True)
        pool = None
        if standby:
            pool = StandbyPool(
                self._standby_command,
                log_dir=run.root / "logs",
                on_event=run.event,
            )
        super().__init__(
            run.root,
            config.job,
            [Child("trainer", 0)] + [Child("rollout", k) for k in range(config.rollouts)],
            command=self._role_command,
            env=lambda child: os.environ,
            budget=RestartBudget(max_restarts=REFERENCE_BUDGET, backoff=0, backoff_max=0),
            standby=pool,
            order=self._standby_order,
            clean_exit_phase=EXITED_PHASE,  # its processes never end on their own before DONE
            timeout=timeout,
            py_spy=find_py_spy(),  # hang forensics (capture_stacks) for the reference job too
            backend=backend,  # None: local processes; slurm: restart_job requeues the batch job
            exit_causes=load_catalogue(),  # a failed process's cause, from its own output
        )
        self.registry, self.coordinator = start_job_services(run, config)
        # rlguard drill: the job's own injection points (oom, disk-full) beside the signals.
        self.drill_injector = ReferenceInjector(run)
        self.drills = DrillDesk(self.drill_injector)

    # ---- what the generic supervisor asks of the job -----------------------------------------

    def _role_argv(self, child: Child) -> list[str]:
        if child.role == "trainer":
            self._incarnation += 1
            return ["--run-dir", str(self.run.root), "--incarnation", str(self._incarnation)]
        return ["--run-dir", str(self.run.root), "--rank", str(child.rank)]

    def _role_module(self, role: str) -> str:
        if self.config.rollout_engine == "vllm":
            # The trainer drives the engines; a rollout process is one engine (workload/engines/).
            return {
                "trainer": "workload.engines.trainer",
                "rollout": "workload.engines.engine_host",
            }[role]
        return f"workload.{role}"

    def _role_command(self, child: Child) -> list[str]:
        return [sys.executable, "-m", self._role_module(child.role), *self._role_argv(child)]

    def _standby_command(self, role: str) -> list[str]:
        if self.config.rollout_engine == "vllm" and role == "rollout":
            # A whole engine, started ahead and put to sleep (woken on its order).
            return [
                sys.executable,
                "-m",
                self._role_module(role),
                "--standby",
                "--run-dir",
                str(self.run.root),
            ]
        return [
            sys.executable,
            "-m",
            "workload.standby",
            "--role",
            role,
            "--module",
            self._role_module(role),
            "--run-dir",
            str(self.run.root),
        ]

    @staticmethod
    def _standby_order(child: Child, argv: list[str], env: Mapping[str, str], log: Path) -> bytes:
        # workload.standby runs the role's main itself: it takes the role's arguments only.
        return (json.dumps({"argv": argv[3:], "log": str(log)}) + "\n").encode()

    def event(self, kind: str, **fields: object) -> None:
        self.run.event(kind, **fields)

    def restart_answer(
        self, children: list[Child], answer: dict[str, Any], spawned_at: float
    ) -> dict[str, Any] | None:
        """A restarted engine is healed once the router admits it at the trainer's weight
        version: the answer waits for that (at most ``READMIT_WAIT_S``) and tells its stages."""
        engines = [c for c in children if c.role == "rollout" and c.proc is not None]
        if self.config.rollout_engine != "vllm" or not engines:
            return answer
        from workload.engines.healing import describe, healing_stages

        since = time.time() - (time.monotonic() - spawned_at)
        stages = [healing_stages(self.run, c.rank, c.proc.pid, since) for c in engines if c.proc]
        waited = time.monotonic() - spawned_at
        readmitted = all(s["readmitted_s"] is not None for s in stages)
        if not readmitted and waited < READMIT_WAIT_S:
            return None
        # One line per engine: the recovery worker keeps the answer's last 500 characters, and
        # "stages" sorts near the end of it.
        return {**answer, "stages": [describe(s) for s in stages], "readmitted": readmitted}

    def finished(self) -> bool:
        trainer = self.children[0]
        return trainer.returncode == 0 and self.run.done.exists()

    def exit_expected(self, child: Child, code: int) -> bool:
        # Once the trainer wrote DONE the rollouts end on their own, and so does the trainer.
        return self.run.done.exists() and (child.role == "rollout" or code == 0)

    def start(self) -> None:
        super().start()
        if self.standby is not None and self.config.rollout_engine == "vllm":
            # An engine takes a minute to start: the spare one is provisioned with the job (and
            # put to sleep), not once the job is steady as the light standbys are.
            self.standby.start("rollout")

    def standby_wanted(self) -> bool:
        return not self.run.done.exists()

    # ---- the common practice: restart everything on any failure ------------------------------

    def tick(self) -> list[str]:
        failed = super().tick()
        if self.on_failure == "restart-job":
            failed += self._hung_children()
            if failed:
                self.restart_now(self.children, why=f"whole-job restart after {failed}")
        return failed

    def _hung_children(self) -> list[str]:
        hung = []
        now = time.time()
        for c in self.children:
            if c.returncode is not None:
                continue
            beat = read_heartbeat(heartbeat_path(self.run.root, c.role, c.rank)) or {}
            age = now - float(beat.get("ts", now))
            if beat and age > self.hang_timeout:
                self.event("child_hung", role=c.role, rank=c.rank, age=age)
                hung.append(c.name)
        return hung

    def wind_down(self) -> None:
        deadline = time.monotonic() + 15
        for c in self.children[1:]:
            while c.proc is not None and c.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)

    def close(self, timeout: float = 5.0) -> None:
        try:
            super().close(timeout)
        finally:
            self.drill_injector.restore()  # a disk-full drill never outlives its launcher
            self.coordinator.close()
            self.registry.close()
