"""The reference job's drill injector: what its launcher can inject beyond signals.

The reference job has injection points inside its processes (:mod:`workload.chaos`), so its
launcher can drill more than a generic ``rlguard launch`` can:

* ``oom``: the trainer's next step raises a CUDA out-of-memory error (chaos ``oom``: a file the
  trainer reads when it trains that step). The rollouts have no such point: refused for them.
* ``disk-full``: the job's checkpoint directory becomes unwritable (chaos ``ckpt-unwritable``:
  a plain file where the directory was) for ``DISK_FULL_SECONDS``, so the next checkpoint write
  fails; the launcher puts the directory back once the time is over (or when it closes). The
  checkpoints are the trainer's: asked of the trainer's role only.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from recovery.supervision.drills import DrillRefused, Injector, heartbeat_step
from workload.chaos import ChaosError, make_checkpoints_unwritable, restore_checkpoints
from workload.job import RunDir

if TYPE_CHECKING:
    from recovery.supervision.supervisor import Child, Supervisor

# Long enough for a checkpoint round to fail (the job checkpoints every step), short enough
# that the drill's job is not left without storage.
DISK_FULL_SECONDS = 30.0


class ReferenceInjector(Injector):
    """Signals as every launcher, plus the reference job's own injection points."""

    def __init__(self, run: RunDir, *, disk_full_seconds: float = DISK_FULL_SECONDS) -> None:
        self.run = run
        self.disk_full_seconds = disk_full_seconds
        self._disk_back_at: float | None = None

    def refusal(self, fault: str, child: Child) -> str | None:
        if fault in ("oom", "disk-full") and child.role != "trainer":
            what = "an out-of-memory point" if fault == "oom" else "checkpoints to write"
            return (
                f"the reference job's {child.role} has no {fault} injection point ({what} "
                f"is the trainer's): drill {fault} on --role trainer, or kill/hang here"
            )
        if fault == "disk-full" and self._disk_back_at is not None:
            return "the checkpoint directory is already held unwritable by a drill"
        return super().refusal(fault, child) if fault in ("kill", "hang") else None

    def describe(self, fault: str, child: Child, pid: int) -> str:
        if fault == "oom":
            return f"{child.name}'s next train step (pid {pid}) raises a CUDA out-of-memory error"
        if fault == "disk-full":
            return (
                f"the job's checkpoint directory {self.run.checkpoints} is unwritable for "
                f"{self.disk_full_seconds:g} s: {child.name}'s next checkpoint write fails"
            )
        return super().describe(fault, child, pid)

    def inject(self, sup: Supervisor, fault: str, child: Child, pid: int) -> dict[str, Any]:
        if fault == "oom":
            step = max(heartbeat_step(sup.run_dir, child) or 0, 0) + 1
            self.run.chaos.mkdir(parents=True, exist_ok=True)
            (self.run.chaos / f"oom-step-{step}").write_text("injected by rlguard drill\n")
            return {"oom_step": step}
        if fault == "disk-full":
            try:
                make_checkpoints_unwritable(self.run)
            except ChaosError as exc:
                raise DrillRefused(str(exc)) from exc
            self._disk_back_at = time.monotonic() + self.disk_full_seconds
            return {"unwritable_seconds": self.disk_full_seconds}
        return super().inject(sup, fault, child, pid)

    def tick(self, sup: Supervisor) -> None:
        if self._disk_back_at is not None and time.monotonic() >= self._disk_back_at:
            self.restore(sup)

    def restore(self, sup: Supervisor | None = None) -> None:
        """Put the checkpoint directory back (the disk-full drill is over)."""
        if self._disk_back_at is None:
            return
        self._disk_back_at = None
        try:
            restore_checkpoints(self.run)
        except ChaosError:
            return  # nothing held any more
        if sup is not None:
            sup.event("drill_over", fault="disk-full")
