"""Drills: a fault injected on purpose into one of the launcher's own processes (``inject_fault``).

``rlguard drill`` asks the node's launcher, which owns the process, through the launcher hook
(:mod:`recovery.supervision.requests`) to inject one fault into the process of a role and rank.
The request's ``extra`` is ``{"fault": F, "drill": ID, "at_step": S|null, "dry_run": bool}``:

* ``kill`` (SIGKILL) and ``hang`` (SIGSTOP): every launcher can. ``oom`` and ``disk-full`` need an
  injection point inside the process: the reference job's :class:`Injector`, or one the process
  declared (:mod:`recovery.drill_points`, :class:`DeclaredPoints`); otherwise refused.
* ``at_step``: armed now, injected once the heartbeat reports that step; the answer waits (the
  caller asks again with the same key). ``dry_run``: checked and described, nothing injected.
* ``expires_at`` (epoch seconds, optional): a request found after it is refused as stale. The
  launcher claims a request before injecting (:func:`recovery.supervision.requests.claim`), so
  one its requester withdrew is never injected.

The answer says what was done (``target_pid``, ``injected_at``, ``step``, ``what``); a refusal
is ``ok: false`` with ``error``.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recovery import drill_points
from recovery.report import heartbeat_path, read_heartbeat

if TYPE_CHECKING:
    from recovery.supervision.requests import Request
    from recovery.supervision.supervisor import Child, Supervisor

__all__ = ["DRILL_FAULTS", "DeclaredPoints", "DrillDesk", "DrillOrder", "DrillRefused", "Injector"]

DRILL_FAULTS = ("kill", "hang", "oom", "disk-full")
_MAX_DRILL_ID_CHARS = 64


class DrillRefused(ValueError):
    """The drill cannot be injected; the message says why (nothing was injected)."""


@dataclass(frozen=True)
class DrillOrder:
    """One ``inject_fault`` request, checked."""

    key: str
    drill: str
    fault: str
    role: str
    rank: int | None
    at_step: int | None
    dry_run: bool
    expires_at: float | None = None

    @classmethod
    def parse(cls, body: dict[str, Any]) -> DrillOrder:
        """Check ``body`` (a request of the hook); raises :class:`DrillRefused` naming the bad value."""
        extra = body.get("extra")
        if not isinstance(extra, dict):
            raise DrillRefused(f"inject_fault needs --extra with the fault, got {extra!r}")
        fault = extra.get("fault")
        if fault not in DRILL_FAULTS:
            raise DrillRefused(f"fault {fault!r} is not one of {', '.join(DRILL_FAULTS)}")
        role = body.get("role")
        if not isinstance(role, str) or not role:
            raise DrillRefused("inject_fault needs --role")
        rank = body.get("rank")
        if rank is not None and not str(rank).isdigit():
            raise DrillRefused(f"rank must be a non-negative integer, got {rank!r}")
        at_step = extra.get("at_step")
        if at_step is not None and (
            isinstance(at_step, bool) or not isinstance(at_step, int) or at_step < 0
        ):
            raise DrillRefused(f"at_step must be an integer >= 0, got {at_step!r}")
        dry_run = extra.get("dry_run", False)
        if not isinstance(dry_run, bool):
            raise DrillRefused(f"dry_run must be true or false, got {dry_run!r}")
        drill = str(extra.get("drill") or body.get("key") or "")
        if not drill or len(drill) > _MAX_DRILL_ID_CHARS:
            raise DrillRefused(f"drill id {drill!r} must be 1-{_MAX_DRILL_ID_CHARS} characters")
        expires = extra.get("expires_at")
        if expires is not None and (
            isinstance(expires, bool) or not isinstance(expires, int | float)
        ):
            raise DrillRefused(f"expires_at must be epoch seconds, got {expires!r}")
        return cls(
            str(body.get("key")),
            drill,
            fault,
            role,
            None if rank is None else int(rank),
            at_step,
            dry_run,
            None if expires is None else float(expires),
        )

    def stale(self, now: float) -> str | None:
        """Why the request is too old to inject (its requester gave up); None: it is not."""
        if self.expires_at is None or now <= self.expires_at:
            return None
        return (
            f"the request expired {now - self.expires_at:.0f} s ago (its requester gave "
            "up waiting): a fault nobody follows is not injected"
        )


def heartbeat_step(run_dir: Path, child: Child) -> int | None:
    """The step ``child``'s process last reported (None: none yet)."""
    beat = read_heartbeat(heartbeat_path(run_dir, child.role, child.rank)) or {}
    step = beat.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


class Injector:
    """What a launcher can inject. This one: signals to any process (``kill``, ``hang``); a
    launcher with injection points inside its processes overrides :meth:`refusal` and
    :meth:`inject` for the other faults."""

    def refusal(self, fault: str, child: Child) -> str | None:
        """Why ``fault`` cannot be injected into ``child``'s process; None: it can."""
        if fault in ("kill", "hang"):
            return None
        if fault == "oom":
            return (
                "cannot inject oom: rlguard launch cannot make the next step of a generic "
                "command raise an out-of-memory error: the launcher runs outside the process "
                "and the command has no injection point (drill kill or hang, or use a "
                "launcher that has one, as the reference job's)"
            )
        return (
            "cannot inject disk-full: rlguard launch cannot make the next checkpoint write "
            "of a generic command fail: it does not know where the command writes (drill "
            "kill or hang, or use a launcher that has an injection point, as the reference "
            "job's)"
        )

    def describe(self, fault: str, child: Child, pid: int) -> str:
        """What injecting ``fault`` does, in words (the dry run's answer)."""
        return {
            "kill": f"SIGKILL {child.name} (pid {pid})",
            "hang": f"SIGSTOP {child.name} (pid {pid}): alive, silent, making no progress",
        }.get(fault, f"{fault} into {child.name} (pid {pid})")

    def inject(self, sup: Supervisor, fault: str, child: Child, pid: int) -> dict[str, Any]:
        """Inject ``fault`` now; fields for the answer."""
        os.kill(pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        return {}

    def tick(self, sup: Supervisor) -> None:
        """Called every supervision round: undo what a fault holds once it is over."""


class DeclaredPoints(Injector):
    """The injection points the target process declared for itself (:mod:`recovery.drill_points`):
    injecting writes a request the process takes (once) and fires at its next chance."""

    def __init__(self, run_dir: Path, points: dict[str, str], drill: str) -> None:
        self.run_dir, self.points, self.drill = run_dir, points, drill

    def refusal(self, fault: str, child: Child) -> str | None:
        return None if fault in self.points else super().refusal(fault, child)

    def describe(self, fault: str, child: Child, pid: int) -> str:
        if fault not in self.points:
            return super().describe(fault, child, pid)
        return f"{child.name} (pid {pid}), its own injection point: {self.points[fault]}"

    def inject(self, sup: Supervisor, fault: str, child: Child, pid: int) -> dict[str, Any]:
        if fault not in self.points:
            return super().inject(sup, fault, child, pid)
        drill_points.request(self.run_dir, child.role, child.rank, fault, pid=pid, drill=self.drill)
        return {"injection_point": "declared"}


class DrillDesk:
    """The supervisor's drill requests: checked, armed until their step, injected, answered."""

    def __init__(self, injector: Injector | None = None) -> None:
        self.injector = injector or Injector()
        self._armed: dict[str, tuple[Request, DrillOrder]] = {}

    def _injector(self, sup: Supervisor, order: DrillOrder, child: Child) -> Injector:
        """The launcher's injector, or the process's own declared points where the launcher
        cannot inject ``order``'s fault and the process running now declared it."""
        if self.injector.refusal(order.fault, child) is None or child.proc is None:
            return self.injector
        points = drill_points.declared_points(sup.run_dir, child.role, child.rank, child.proc.pid)
        if order.fault not in points:
            return self.injector
        return DeclaredPoints(sup.run_dir, points, order.drill)

    def armed_paths(self) -> set[Path]:
        """The request files of drills armed for a later step (not to be carried out again)."""
        return {req.path for req, _ in self._armed.values()}

    def handle(self, sup: Supervisor, req: Request) -> dict[str, Any] | None:
        """The answer to ``req``, or None while it waits for its step (answered later)."""
        key = str(req.body.get("key"))
        if key in self._armed:
            return None
        try:
            order = DrillOrder.parse(req.body)
            child = self._target(sup, order)
            injector = self._injector(sup, order, child)
            reason = order.stale(time.time()) or injector.refusal(order.fault, child)
            if reason is not None:
                raise DrillRefused(reason)
        except DrillRefused as exc:
            sup.event("drill_refused", key=key, error=str(exc))
            return {"ok": False, "error": str(exc)}
        pid = child.proc.pid if child.proc is not None else 0
        what = injector.describe(order.fault, child, pid)
        if order.dry_run:
            step = " at step " + str(order.at_step) if order.at_step is not None else " now"
            return {
                "ok": True,
                "dry_run": True,
                "target": child.name,
                "target_pid": pid,
                "what": what + step,
            }
        if order.at_step is not None and (heartbeat_step(sup.run_dir, child) or -1) < order.at_step:
            self._armed[key] = (req, order)
            sup.event(
                "drill_armed",
                drill=order.drill,
                fault=order.fault,
                role=child.role,
                rank=child.rank,
                at_step=order.at_step,
            )
            return None
        return self._inject(sup, order, child, req)

    def fire_due(self, sup: Supervisor) -> None:
        """Inject the armed drills whose step came (each answered then); let faults end."""
        from recovery.supervision.requests import answer

        self.injector.tick(sup)
        for key, (req, order) in list(self._armed.items()):
            try:
                child = self._target(sup, order)
                stale = order.stale(time.time())
                if stale is not None:
                    raise DrillRefused(stale)
            except DrillRefused as exc:
                del self._armed[key]
                sup.event("drill_refused", drill=order.drill, error=str(exc))
                answer(req, {"ok": False, "error": str(exc)})
                continue
            if (heartbeat_step(sup.run_dir, child) or -1) >= (order.at_step or 0):
                del self._armed[key]
                answer(req, self._inject(sup, order, child, req))

    def _target(self, sup: Supervisor, order: DrillOrder) -> Child:
        targets = [
            c
            for c in sup.children
            if c.role == order.role and (order.rank is None or c.rank == order.rank)
        ]
        if not targets:
            roles = sorted({f"{c.role}-{c.rank}" for c in sup.children})
            raise DrillRefused(
                f"this launcher runs no process {order.role}"
                f"{'' if order.rank is None else '-' + str(order.rank)} "
                f"(it runs {', '.join(roles)})"
            )
        child = min(targets, key=lambda c: c.rank)
        if child.proc is None or child.proc.poll() is not None:
            raise DrillRefused(
                f"{child.name} is not running now (its process exited): "
                "a drill needs a running process"
            )
        return child

    def _inject(
        self, sup: Supervisor, order: DrillOrder, child: Child, req: Request
    ) -> dict[str, Any]:
        from recovery.supervision.requests import WITHDRAWN, claim

        holder = claim(req)
        if holder is not None:  # withdrawn by its requester, or an earlier launcher's
            why = (
                "withdrawn by its requester (it gave up waiting): nothing injected"
                if holder == WITHDRAWN
                else "an earlier launcher took this drill and did not "
                "answer (it may have injected it before it stopped): not injected again"
            )
            sup.event("drill_refused", drill=order.drill, error=why)
            return {"ok": False, "withdrawn": holder == WITHDRAWN, "error": why}
        pid = child.proc.pid if child.proc is not None else 0
        step = heartbeat_step(sup.run_dir, child)
        # Asked again: an armed drill's process may have been replaced since it was checked.
        injector = self._injector(sup, order, child)
        what = injector.describe(order.fault, child, pid)
        at = time.time()
        try:
            reason = injector.refusal(order.fault, child)
            if reason is not None:
                raise DrillRefused(reason)
            fields = injector.inject(sup, order.fault, child, pid)
        except (OSError, DrillRefused) as exc:
            sup.event("drill_refused", drill=order.drill, error=str(exc))
            return {
                "ok": False,
                "error": f"injecting {order.fault} into {child.name} failed: {exc}",
            }
        sup.event(
            "drill_injected",
            drill=order.drill,
            fault=order.fault,
            role=child.role,
            rank=child.rank,
            child_pid=pid,
            step=step,
            injected_at=at,
        )
        return {
            "ok": True,
            "fault": order.fault,
            "target": child.name,
            "role": child.role,
            "rank": child.rank,
            "target_pid": pid,
            "injected_at": at,
            "step": step,
            "what": what,
            **fields,
        }
