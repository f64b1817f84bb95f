"""The reference job on Ray: ``python -m workload.launch --run-dir D --steps N --ray``.

A single controller, as verl's is: this process (the Ray driver) hosts what the job's processes
share (:func:`workload.supervisor.start_job_services`: config, weight registry, checkpoint
coordinator) and runs the trainer and each rollout worker as a Ray actor,
``ReferenceWorker`` named ``<job>_<role>_<rank>``. Each actor runs its role's ``main`` (the same
code, WAL, batch commits, checkpoints and weight transfer as under the process supervisor), so
the job computes the same parameters, bit for bit.

The actors are created with ``max_restarts=-1`` and ``max_task_retries=-1``: when an actor's
worker process dies (kill -9), Ray restarts the actor and runs its role again in the new
process, which resumes from the WAL and the newest checkpoint as a restarted process does. A
trainer's restart gets the next incarnation (``<run_dir>/ray_incarnation``), as the
supervisor's restarts do. Ray is started here (CPU only, small) unless ``address`` names a
running cluster.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from typing import Any

from workload.job import JobConfig, RunDir

log = logging.getLogger("rlguard.workload.ray")
ACTOR_CLASS = "ReferenceWorker"


def next_incarnation(run: RunDir) -> int:
    """1, 2, ... per trainer start of this run (one trainer at a time writes it)."""
    path = run.root / "ray_incarnation"
    try:
        current = int(path.read_text(encoding="utf-8").strip() or 0)
    except FileNotFoundError:
        current = 0
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(str(current + 1), encoding="utf-8")
    os.replace(tmp, path)
    return current + 1


class _Worker:
    """One role of the job inside a Ray actor (made remote in :func:`_actor_class`)."""

    def __init__(self, role: str, rank: int, run_dir: str) -> None:
        self.role, self.rank, self.run_dir = role, rank, run_dir

    def run(self) -> int:
        if self.role == "trainer":
            from workload import trainer

            incarnation = next_incarnation(RunDir(self.run_dir))
            return trainer.main(["--run-dir", self.run_dir, "--incarnation", str(incarnation)])
        from workload import rollout

        return rollout.main(["--run-dir", self.run_dir, "--rank", str(self.rank)])


def _actor_class() -> Any:
    import ray

    cls = type(ACTOR_CLASS, (_Worker,), {"__module__": __name__})
    return ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(cls)


def run_on_ray(
    run: RunDir, config: JobConfig, *, address: str | None = None, timeout: float | None = None
) -> int:
    """Run the job to its end on Ray; the trainer's exit code (4 when ``timeout`` ran out)."""
    import ray

    from workload.supervisor import start_job_services

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
    try:
        worker = _actor_class()
        roles = [("trainer", 0)] + [("rollout", k) for k in range(config.rollouts)]
        actors = {
            (role, rank): worker.options(name=f"{config.job}_{role}_{rank}").remote(
                role, rank, str(run.root)
            )
            for role, rank in roles
        }
        refs = {key: actor.run.remote() for key, actor in actors.items()}
        run.event("ray_start", actors=[f"{r}-{k}" for r, k in roles])
        deadline = None if timeout is None else time.monotonic() + timeout
        ready, _ = ray.wait([refs[("trainer", 0)]], timeout=timeout)
        if not ready:
            log.error("the job did not finish within %s s", timeout)
            return 4
        code = int(ray.get(refs[("trainer", 0)]))
        rest = [ref for key, ref in refs.items() if key[0] != "trainer"]
        left = 15.0 if deadline is None else max(1.0, deadline - time.monotonic())
        ray.wait(rest, num_returns=len(rest), timeout=left)  # rollouts end once DONE is written
        return code
    finally:
        coordinator.close()
        registry.close()
        ray.shutdown()
