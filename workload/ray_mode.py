"""The reference job on Ray: ``python -m workload.launch --run-dir D --steps N --ray``.

A single controller, as verl's is: this process (the Ray driver) hosts what the job's processes
share (:func:`workload.job_supervisor.start_job_services`) and runs the trainer and each rollout
worker (or vLLM engine host) as a Ray actor, ``ReferenceWorker`` named ``<job>_<role>_<rank>``,
running its role's code as under the process supervisor: the same parameters, bit for bit. Ray
is started here (CPU only, small) unless ``address`` names a running cluster.

Who restarts an actor whose process died (``restart_by``): ``ray`` (the default,
``max_restarts=-1``: the role resumes from the WAL and the newest checkpoint); ``rlguard``
(``max_restarts=0``, as verl's workers: the restarter actor
:data:`integrations.ray.restarter.RESTARTER_PREFIX` + job creates the role again as
``<job>_<role>_<rank>_r<n>``, from a warm standby once the job is steady, when RLGuard's
``restart_role`` asks); ``none`` (the whole job exits 1 at the first death, as verl's does).
With ``$VERL_FILE_LOGGER_PATH`` set, the controller appends verl's file-logger line
(``{"step": N, "data": {"perf/time_per_step": S}}``) per trained step.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import tempfile
import threading
import time
from typing import Any

from recovery.fsio import replace_file
from workload.job import JobConfig, RunDir

log = logging.getLogger("rlguard.workload.ray")
ACTOR_CLASS = "ReferenceWorker"
# What a resubmission adds to the launcher's command line (``--resume`` of workload.launch, as
# verl's trainer.resume_mode=auto): resume from the run directory's checkpoint and WAL.
RESUME_ARG = "--resume=auto"


def rlguard_preset(job: str) -> dict[str, Any]:
    """The Ray preset (:mod:`integrations.ray.presets`) of this job's actors, for ``rlguard
    agent --ray-preset`` and the Ray hook: the role and rank from the actor's name
    (``<job>_<role>_<rank>``, ``_r<n>`` for one the restarter created again), so that only
    this job's actors are its participants, and the resume argument of a resubmission."""
    name = rf"^{re.escape(job)}_{{}}_(?P<rank>\d+)(_r\d+)?$"
    return {
        "name": "reference-job",
        "resume": [RESUME_ARG],
        "roles": [
            {"role": role, "class": f"^{ACTOR_CLASS}$", "name": name.format(role)}
            for role in ("trainer", "rollout")
        ],
    }


def next_incarnation(run: RunDir) -> int:
    """1, 2, ... per trainer start of this run (one trainer at a time writes it)."""
    path = run.root / "ray_incarnation"
    try:
        current = int(path.read_text(encoding="utf-8").strip() or 0)
    except FileNotFoundError:
        current = 0
    replace_file(path, str(current + 1).encode(), sync=False)
    return current + 1


# The module each role runs (by the job's rollout engine): what a standby imports ahead of its
# activation. With vLLM a rollout actor hosts one engine (workload/engines/engine_host.py), as a
# rollout process does under the process supervisor; its standby imports the host, not an
# engine (an engine is started when the actor runs).
_ROLE_MODULES = {
    "torch": {"trainer": "workload.trainer", "rollout": "workload.rollout"},
    "vllm": {"trainer": "workload.engines.trainer", "rollout": "workload.engines.engine_host"},
}
# A role's heartbeat this fresh, past its start, is a steady process (the restarter knows no
# pids: a dead actor's heartbeat goes stale instead).
_STEADY_HEARTBEAT_AGE_S = 2.0
# An activated standby that was already waiting finishes its creation within milliseconds; one
# that has not in this long is dead or frozen (stopped, swapped out): the restart goes cold.
_ACTIVATION_TIMEOUT_S = 2.0


class _Worker:
    """One role of the job inside a Ray actor (made remote in :func:`_actor_class`).

    With ``standby_of`` = ``(restarter, name)`` it is a warm standby: its creation imports the
    role's modules, then waits until the restarter activates ``name``."""

    def __init__(
        self, role: str, rank: int, run_dir: str, standby_of: tuple[Any, str] | None = None
    ) -> None:
        self.role, self.rank, self.run_dir = role, rank, run_dir
        if standby_of is not None:
            import ray

            importlib.import_module(self._module())
            restarter, name = standby_of
            RunDir(run_dir).event(
                "ray_standby_ready", role=role, rank=rank, name=name, pid=os.getpid()
            )
            ray.get(restarter.await_activation.remote(name))

    def _module(self) -> str:
        return _ROLE_MODULES[RunDir(self.run_dir).load_config().rollout_engine][self.role]

    def run(self) -> int:
        role_main = importlib.import_module(self._module()).main
        run = RunDir(self.run_dir)
        if self.role == "trainer":
            incarnation = str(next_incarnation(run))
            return int(role_main(["--run-dir", self.run_dir, "--incarnation", incarnation]))
        code = int(role_main(["--run-dir", self.run_dir, "--rank", str(self.rank)]))
        if code != 0 and not run.done.exists():
            # A rollout that failed before the job's end (an engine host whose engine died) is a
            # dead actor, as a process that exits is a dead child under the supervisor: Ray
            # restarts it (or leaves it to RLGuard's restarter, or fails the job), by restart_by.
            log.error("rollout %d failed with %d: its actor's process exits", self.rank, code)
            os._exit(code)
        return code


def _actor_class(restart_by: str = "ray") -> Any:
    import ray

    cls = type(ACTOR_CLASS, (_Worker,), {"__module__": __name__})
    if restart_by in ("rlguard", "none"):
        return ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)(cls)
    return ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(cls)


class _Restarter:
    """The job's restarter actor (``restart_by="rlguard"``): creates a dead role's actor again
    when RLGuard asks (:mod:`integrations.ray.restarter`), from a warm standby when one waits,
    and owns the actors it created."""

    def __init__(self, job: str, run_dir: str, slots: list[tuple[str, int]]) -> None:
        self.job, self.run_dir = job, run_dir
        self.slots = [(str(role), int(rank)) for role, rank in slots]
        self.done: dict[str, dict[str, Any]] = {}  # idempotency key -> answer
        self.refs: dict[tuple[str, int], Any] = {}
        self.actors: dict[tuple[str, int], Any] = {}
        self.created: dict[tuple[str, int], int] = {}  # actors created per slot, for names
        # slot -> (name, actor, its __ray_ready__ ref: resolves with an error if it died waiting)
        self.standbys: dict[tuple[str, int], tuple[str, Any, Any]] = {}
        self.activations: dict[str, threading.Event] = {}  # standby name -> its go
        self.waiting: set[str] = set()  # standbys whose creation waits for its go
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        threading.Thread(target=self._keep_standbys, name="standbys", daemon=True).start()

    def _next_name(self, role: str, rank: int) -> str:
        # Ray keeps a dead actor's name taken while its owner lives: a name of its own.
        n = self.created.get((role, rank), 0) + 1
        self.created[(role, rank)] = n
        return f"{self.job}_{role}_{rank}_r{n}"

    def restart_role(self, role: str, rank: int, key: str) -> dict[str, Any]:
        with self.lock:
            if key in self.done:  # a second delivery of the same action creates nothing
                return {**self.done[key], "already": True}
            self._drop_dead_standbys([(role, rank)])
            spare = self.standbys.pop((role, rank), None)
            if spare is not None and self._activate(spare, role, rank):
                name, actor, _ready = spare
            else:
                spare = None
                name = self._next_name(role, rank)
                actor = _actor_class("rlguard").options(name=name).remote(role, rank, self.run_dir)
            self.actors[(role, rank)] = actor
            self.refs[(role, rank)] = actor.run.remote()
            answer = {
                "name": name,
                "actor_id": actor._actor_id.hex(),
                "created_at": time.time(),
                "warm": spare is not None,
            }
            self.done[key] = answer
            self.changed.notify_all()
            RunDir(self.run_dir).event(
                "ray_role_recreated", role=role, rank=rank, key=key, warm=spare is not None
            )
            return {**answer, "already": False}

    def await_activation(self, name: str) -> None:
        """Called by the standby ``name`` from its creation: returns once it is activated."""
        with self.lock:
            go = self.activations[name]
            self.waiting.add(name)
        # From here on its activation is proven within _ACTIVATION_TIMEOUT_S (see _activate).
        RunDir(self.run_dir).event("ray_standby_waiting", name=name)
        go.wait()

    def _activate(self, spare: tuple[str, Any, Any], role: str, rank: int) -> bool:
        """Let the standby's creation return; False when it cannot take the role (under the lock).

        The check before it (``_drop_dead_standbys``) cannot see a standby that died a moment
        ago, before Ray marked it dead, or one whose process is frozen: handed the restart, it
        would never run, and the role would stay dead. A standby that was waiting finishes its
        creation within milliseconds of its go, so that is waited for. One that has not asked
        for its go yet (still importing, or frozen or dead before it asked) cannot be checked
        at all, and a cold restart costs no more than waiting for its imports would. Either
        way, one that is not proven is killed and the restart is made cold."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        name, actor, ready = spare
        self.activations[name].set()
        if name not in self.waiting:
            why = "it had not asked for its activation yet"
        else:
            try:
                ray.get(ready, timeout=_ACTIVATION_TIMEOUT_S)
                return True
            except (RayActorError, GetTimeoutError) as exc:
                why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        ray.kill(actor, no_restart=True)
        RunDir(self.run_dir).event(
            "ray_standby_lost", role=role, rank=rank, name=name, at="activation", error=why
        )
        return False

    def _drop_dead_standbys(self, slots: list[tuple[str, int]]) -> None:
        """Forget the standbys of ``slots`` whose process died while they waited (their
        creation failed): a dead standby must make a restart cold, never lose it. Under the
        lock."""
        import ray
        from ray.exceptions import RayActorError

        for slot in slots:
            spare = self.standbys.get(slot)
            if spare is None:
                continue
            name, _actor, ready = spare
            done, _ = ray.wait([ready], timeout=0)
            if not done:
                continue  # still waiting for its activation: usable
            try:
                ray.get(done[0])
            except RayActorError as exc:
                del self.standbys[slot]
                self.activations[name].set()  # frees the thread its await_activation holds
                RunDir(self.run_dir).event(
                    "ray_standby_lost", role=slot[0], rank=slot[1], name=name,
                    error=str(exc).splitlines()[0],
                )  # fmt: skip

    def _keep_standbys(self) -> None:
        """Create the missing standbys while the job runs, once it is steady; replace one
        whose process died while it waited."""
        import ray

        me = ray.get_runtime_context().current_actor
        run = RunDir(self.run_dir)
        while not run.done.exists():
            time.sleep(0.5)
            with self.lock:
                self._drop_dead_standbys(list(self.standbys))
                missing = [slot for slot in self.slots if slot not in self.standbys]
                if not missing or not self._steady():
                    continue
                for role, rank in missing:
                    name = self._next_name(role, rank)
                    self.activations[name] = threading.Event()
                    actor = (
                        _actor_class("rlguard")
                        .options(name=name)
                        .remote(role, rank, self.run_dir, (me, name))
                    )
                    self.standbys[(role, rank)] = (name, actor, actor.__ray_ready__.remote())
                    run.event("ray_standby_created", role=role, rank=rank, name=name)

    def _steady(self) -> bool:
        """Every role reports steadily (recovery.supervision.standby.reports_steadily)."""
        from recovery.report import heartbeat_path, read_heartbeat
        from recovery.supervision.standby import reports_steadily

        return all(
            reports_steadily(
                read_heartbeat(heartbeat_path(self.run_dir, role, rank)),
                max_age=_STEADY_HEARTBEAT_AGE_S,
            )
            for role, rank in self.slots
        )

    def result(self, role: str, rank: int, timeout: float) -> int | None:
        """The exit code of the newest actor created for ``(role, rank)`` (None: none in time)."""
        import ray

        deadline = time.monotonic() + timeout
        with self.lock:
            while (role, rank) not in self.refs:
                left = deadline - time.monotonic()
                if left <= 0 or not self.changed.wait(left):
                    return None
            ref = self.refs[(role, rank)]
        ready, _ = ray.wait([ref], timeout=max(0.0, deadline - time.monotonic()))
        return int(ray.get(ready[0])) if ready else None


def run_on_ray(
    run: RunDir,
    config: JobConfig,
    *,
    address: str | None = None,
    timeout: float | None = None,
    restart_by: str = "ray",
) -> int:
    """Run the job to its end on Ray; the trainer's exit code (4 when ``timeout`` ran out)."""
    import ray

    from integrations.ray.restarter import restarter_name
    from workload.job_supervisor import start_job_services

    run.root.mkdir(parents=True, exist_ok=True)
    if address is None:
        ray.init(
            num_cpus=1,
            include_dashboard=False,
            object_store_memory=80 * 1024 * 1024,
            logging_level=logging.ERROR,
            log_to_driver=False,
            _temp_dir=tempfile.mkdtemp(prefix="rlgray-", dir="/tmp"),
        )
    else:
        ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    registry, coordinator = start_job_services(run, config)
    step_log = None
    try:
        worker = _actor_class(restart_by)
        restarter = None
        roles = [("trainer", 0)] + [("rollout", k) for k in range(config.rollouts)]
        if restart_by == "rlguard":
            # Threads for the requests, one result() wait, and one per standby's creation.
            restarter = (
                ray.remote(_Restarter)
                .options(
                    name=restarter_name(config.job), num_cpus=0, max_concurrency=8 + len(roles)
                )
                .remote(config.job, str(run.root), roles)
            )
        actors = {
            (role, rank): worker.options(name=f"{config.job}_{role}_{rank}").remote(
                role, rank, str(run.root)
            )
            for role, rank in roles
        }
        refs = {key: actor.run.remote() for key, actor in actors.items()}
        run.event("ray_start", actors=[f"{r}-{k}" for r, k in roles])
        step_log = _StepLog.start(run)
        deadline = None if timeout is None else time.monotonic() + timeout
        if restart_by == "none" and _an_actor_died(refs, timeout):
            return 1
        code = _trainer_code(refs[("trainer", 0)], restarter, timeout)
        if code is None:
            log.error("the job did not finish within %s s", timeout)
            return 4
        rest = [ref for key, ref in refs.items() if key[0] != "trainer"]
        left = 15.0 if deadline is None else max(1.0, deadline - time.monotonic())
        ray.wait(rest, num_returns=len(rest), timeout=left)  # rollouts end once DONE is written
        return code
    finally:
        if step_log is not None:
            step_log.close()
        coordinator.close()
        registry.close()
        ray.shutdown()


class _StepLog:
    """verl's file logger's lines for the job's trained steps (module docstring)."""

    def __init__(self, run: RunDir, path: str) -> None:
        self.run, self.path, self.written = run, path, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._follow, name="verl-step-log", daemon=True)

    @classmethod
    def start(cls, run: RunDir) -> _StepLog | None:
        path = os.environ.get("VERL_FILE_LOGGER_PATH")
        if not path:
            return None
        log_ = cls(run, path)
        log_.thread.start()
        return log_

    def _follow(self) -> None:
        import json

        from workload.job import read_events

        with open(self.path, "wb", buffering=0) as fp:  # "wb", as verl's FileLogger opens it
            while not self.stop.wait(0.2):
                steps = [e for e in read_events(self.run) if e["kind"] == "step"]
                for e in steps[self.written :]:
                    data = {"perf/time_per_step": float(e.get("seconds", 0.0))}
                    fp.write(json.dumps({"step": e["step"], "data": data}).encode() + b"\n")
                self.written = max(self.written, len(steps))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)


def _an_actor_died(refs: dict[tuple[str, int], Any], timeout: float | None) -> bool:
    """Fail fast, as verl does: True as soon as one actor died before the trainer finished
    (the recovery is then the whole job's resubmission, which resumes from the checkpoints)."""
    import ray
    from ray.exceptions import RayActorError

    pending = list(refs.values())
    trainer = refs[("trainer", 0)]
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=timeout)
        if not ready:
            return False  # the timeout: the caller's wait says so
        try:
            ray.get(ready[0])
        except RayActorError as exc:
            log.error("an actor of the job died: the job fails (%s)", str(exc).splitlines()[0])
            return True
        if ready[0] == trainer:
            return False
    return False


def _trainer_code(ref: Any, restarter: Any, timeout: float | None) -> int | None:
    """The trainer's exit code; under RLGuard's restarts, that of the actor RLGuard created
    again when the first one died (None when ``timeout`` ran out)."""
    import ray
    from ray.exceptions import RayActorError

    deadline = None if timeout is None else time.monotonic() + timeout
    ready, _ = ray.wait([ref], timeout=timeout)
    if not ready:
        return None
    try:
        return int(ray.get(ref))
    except RayActorError:
        if restarter is None:
            raise
    log.warning("the trainer's actor died: waiting for RLGuard to create it again")
    left = 1e9 if deadline is None else max(0.0, deadline - time.monotonic())
    code = ray.get(restarter.result.remote("trainer", 0, left))
    return None if code is None else int(code)
