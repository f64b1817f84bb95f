"""Fault injection for the reference job, on demand or by schedule.

On demand, ``python -m workload.chaos --run-dir D FAULT ...`` with one of ``kill`` (kill -9),
``hang`` (SIGSTOP), ``oom`` (a fake CUDA OOM in a train step), ``spin`` (the trainer spins in a
"collective"), ``starve`` (rollouts produce nothing, idle), ``slow-statelog``,
``ckpt-unwritable``, ``xid`` / ``ecc`` / ``thermal`` (through the agent's fake NVML),
``skip-refit`` and ``kill-engine`` (vLLM job); ``--help`` shows each one's arguments.

By schedule (a JSON list; each fault fires once the trainer has reached ``at_step``, plus
``delay`` seconds so that rollouts are mid-batch)::

    python -m workload.chaos --run-dir D schedule FILE
    [{"at_step": 3, "fault": "kill", "role": "rollout", "rank": 1}, {"at_step": 6, "fault": "oom"}]

Every injection is appended to the run's ``events.jsonl`` (kind ``fault``) so the benchmark
can measure detection and recovery from the moment of injection.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recovery.fsio import replace_file
from recovery.report import heartbeat_path
from workload.job import RunDir, read_json

FAULTS = (
    "kill",
    "hang",
    "oom",
    "spin",
    "starve",
    "slow-statelog",
    "ckpt-unwritable",
    "xid",
    "ecc",
    "thermal",
    "skip-refit",
    "kill-engine",
)
STARVE_FILE = "starve"  # under the run's chaos directory: when the rollouts were starved
SIMULATE_DIR = "rlguard-simulate"
ENGINE_KILL_DELAY_S = 0.02  # kill-engine: after the router sent the request, before it finishes  # the agent's fake NVML reads fault files here


class ChaosError(ValueError):
    """A fault could not be injected; the message says which and why."""


@dataclass
class Fault:
    fault: str
    at_step: int = 0
    delay: float = 0.5
    role: str = "rollout"
    rank: int = 0
    step: int | None = None
    ms: float = 400.0
    seconds: float = 20.0
    gpu: int = 0
    xid: int = 79
    on: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: object) -> Fault:
        if not isinstance(data, dict):
            raise ChaosError(f"a scheduled fault must be an object, got {data!r}")
        known = set(cls.__dataclass_fields__) - {"extra"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ChaosError(f"unknown fault field(s) {unknown} in {data!r}")
        fault = cls(**data)
        fault.check()
        return fault

    def check(self) -> None:
        if self.fault not in FAULTS:
            raise ChaosError(f"fault {self.fault!r} is not one of {', '.join(FAULTS)}")
        if self.role not in ("trainer", "rollout"):
            raise ChaosError(f"role must be trainer or rollout, got {self.role!r}")
        for name in ("at_step", "rank", "gpu"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ChaosError(f"{name} must be an int >= 0, got {value!r}")
        if not self.ms > 0 or not self.seconds > 0 or not self.delay >= 0:
            raise ChaosError(
                f"ms and seconds must be > 0 and delay >= 0, got {self.ms!r}, {self.seconds!r}, {self.delay!r}"
            )


def _pid(run: RunDir, role: str, rank: int) -> int:
    name = f"{role}-{rank}"
    pid = (read_json(run.root / "pids.json") or {}).get(name)
    if not isinstance(pid, int):
        raise ChaosError(f"no running {name} in {run.root} (pids.json)")
    return pid


def current_step(run: RunDir) -> int:
    beat = read_json(heartbeat_path(run.root, "trainer", 0)) or {}
    step = beat.get("step")
    return int(step) if isinstance(step, int) else -1


def _hold_statelog_lock(run: RunDir, ms: float, seconds: float, stop: threading.Event) -> None:
    # The state log serialises appends with flock on this file: holding it makes every append
    # wait, which is what slow storage looks like to the job (the wait is in the measured latency).
    lock_path = run.state_log.with_name(run.state_log.name + ".lock")
    end = time.monotonic() + seconds
    with open(lock_path, "a+") as fh:
        while time.monotonic() < end and not stop.is_set():
            fcntl.flock(fh, fcntl.LOCK_EX)
            time.sleep(ms / 1000.0)
            fcntl.flock(fh, fcntl.LOCK_UN)
            time.sleep(0.005)


def make_checkpoints_unwritable(run: RunDir) -> Path:
    """Put a plain file where the checkpoint directory was (root ignores permission bits, so
    chmod would not do); returns where the real directory was moved."""
    held = run.root / "checkpoints.chaos-held"
    if held.exists():
        raise ChaosError(f"the checkpoint directory is already held at {held}")
    if run.checkpoints.exists():
        os.replace(run.checkpoints, held)
    else:
        held.mkdir()
    run.checkpoints.write_text("storage unavailable (injected by workload.chaos)\n")
    return held


def restore_checkpoints(run: RunDir) -> None:
    """Undo :func:`make_checkpoints_unwritable`."""
    held = run.root / "checkpoints.chaos-held"
    if not held.exists():
        raise ChaosError(f"nothing to restore: {held} does not exist")
    if run.checkpoints.is_file():
        run.checkpoints.unlink()
    os.replace(held, run.checkpoints)


def inject(run: RunDir, fault: Fault, *, stop: threading.Event | None = None) -> dict[str, Any]:
    """Inject ``fault`` now; returns what was done. Long faults (slow state log, unwritable
    checkpoints) last ``fault.seconds`` and block until they are over."""
    fault.check()
    stop = stop or threading.Event()
    info: dict[str, Any] = {"fault": fault.fault}
    if fault.fault in ("kill", "hang"):
        pid = _pid(run, fault.role, fault.rank)
        info.update(role=fault.role, rank=fault.rank, target_pid=pid)
        run.event("fault", **info, step=current_step(run))
        os.kill(pid, signal.SIGKILL if fault.fault == "kill" else signal.SIGSTOP)
    elif fault.fault == "skip-refit":
        # Read by the router of a job on vLLM engines (workload/engines/fleet.py): the next refit
        # of the rank loads nothing and the engine is admitted with the weights it had (stale),
        # the fault the train/inference disagreement signal must reveal.
        run.chaos.mkdir(parents=True, exist_ok=True)
        (run.chaos / f"skip-refit-rank-{fault.rank}").write_text("injected\n")
        info.update(role="rollout", rank=fault.rank)
        run.event("fault", **info, step=current_step(run))
    elif fault.fault == "kill-engine":
        # Armed here, fired by the job's router (fire_armed_engine_kill): the Worker of the rank's
        # engine is killed while a request the router sent it is in flight. Killing from outside
        # would only land mid-request by chance; the kill's own event is written when it lands.
        run.chaos.mkdir(parents=True, exist_ok=True)
        (run.chaos / f"kill-engine-rank-{fault.rank}").write_text("armed\n")
        info.update(role="rollout", rank=fault.rank)
        run.event("fault_armed", **info, step=current_step(run))
    elif fault.fault in ("oom", "spin"):
        # Read by the trainer when it trains that step (workload.trainer): a fake CUDA OOM, or a
        # busy loop that keeps the heartbeat fresh and the step frozen (a rank stuck spinning in
        # a collective), until it is killed.
        step = fault.step if fault.step is not None else max(current_step(run), 0) + 1
        run.chaos.mkdir(parents=True, exist_ok=True)
        (run.chaos / f"{fault.fault}-step-{step}").write_text("injected\n")
        info.update(step=step, role="trainer", rank=0)
        run.event("fault", **info)
    elif fault.fault == "starve":
        # Read by every rollout worker started before it (workload.rollout): alive, heartbeat
        # fresh, idle with nothing pending, it generates nothing more, so the trainer waits for
        # a batch that never comes (verl #7155, a failed sample taken for end-of-data). A
        # restarted worker is not starved: its restart is the cure.
        run.chaos.mkdir(parents=True, exist_ok=True)
        at = time.time()
        replace_file(run.chaos / STARVE_FILE, json.dumps({"at": at}).encode(), sync=False)
        info.update(role="rollout", at=at)
        run.event("fault", **info, step=current_step(run))
    elif fault.fault in ("xid", "ecc", "thermal"):
        sim = run.root / SIMULATE_DIR
        sim.mkdir(exist_ok=True)
        body: dict[str, Any] = (
            {"fault": "xid", "gpu": fault.gpu, "xid": fault.xid}
            if fault.fault == "xid"
            else {"fault": "thermal", "gpu": fault.gpu, "on": fault.on}
            if fault.fault == "thermal"
            else {"fault": "ecc_uncorrectable", "gpu": fault.gpu}
        )
        name = f"chaos-{fault.fault}-{time.time_ns()}.json"
        replace_file(sim / name, json.dumps(body).encode(), sync=False)
        info.update({k: v for k, v in body.items() if k != "fault"}, nvml_fault=body["fault"])
        run.event("fault", **info, step=current_step(run))
    elif fault.fault == "slow-statelog":
        info.update(ms=fault.ms, seconds=fault.seconds)
        run.event("fault", **info, step=current_step(run))
        _hold_statelog_lock(run, fault.ms, fault.seconds, stop)
    elif fault.fault == "ckpt-unwritable":
        info.update(seconds=fault.seconds)
        run.event("fault", **info, step=current_step(run))
        make_checkpoints_unwritable(run)
        try:
            stop.wait(fault.seconds)
        finally:
            restore_checkpoints(run)
            run.event("fault_over", fault=fault.fault)
    return info


def fire_armed_engine_kill(run: RunDir, rank: int, worker_pid: int, in_flight: int) -> bool:
    """Called by the router of a job on vLLM engines just before it sends a request to ``rank``:
    if a ``kill-engine`` fault is armed for the rank, SIGKILL the engine's Worker a moment later,
    while that request is in flight. Whether it fired (once per arming: the rename is atomic)."""
    armed = run.chaos / f"kill-engine-rank-{rank}"
    try:
        armed.replace(armed.with_name(armed.name + ".fired"))
    except FileNotFoundError:
        return False

    def kill() -> None:
        run.event(
            "fault",
            fault="kill-engine",
            role="rollout",
            rank=rank,
            target_pid=worker_pid,
            in_flight=in_flight,
            step=current_step(run),
        )
        try:
            os.kill(worker_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    # The request is posted right after this returns; the engine is killed while it works on it.
    threading.Timer(ENGINE_KILL_DELAY_S, kill).start()
    return True


def run_schedule(
    run: RunDir,
    faults: list[Fault],
    *,
    stop: threading.Event | None = None,
    timeout: float = 3600.0,
    on_inject: Callable[[dict[str, Any]], None] | None = None,
) -> int:
    """Inject each fault once the trainer reaches its ``at_step``; returns how many fired."""
    stop = stop or threading.Event()
    pending = sorted(faults, key=lambda f: f.at_step)
    fired = 0
    deadline = time.monotonic() + timeout
    while pending and not stop.is_set() and time.monotonic() < deadline and not run.done.exists():
        if current_step(run) >= pending[0].at_step:
            fault = pending.pop(0)
            if stop.wait(fault.delay):
                break
            try:
                info = inject(run, fault, stop=stop)
            except ChaosError as exc:
                run.event("fault_skipped", fault=fault.fault, error=str(exc))
                continue
            fired += 1
            if on_inject is not None:
                on_inject(info)
        else:
            stop.wait(0.1)
    return fired


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m workload.chaos", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--run-dir", required=True)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("kill", "hang"):
        s = sub.add_parser(name)
        s.add_argument("--role", choices=("trainer", "rollout"), default="rollout")
        s.add_argument("--rank", type=int, default=0)
    sub.add_parser("skip-refit").add_argument("--rank", type=int, default=0)
    sub.add_parser("kill-engine").add_argument("--rank", type=int, default=0)
    sub.add_parser("oom").add_argument("--step", type=int, default=None)
    sub.add_parser("spin").add_argument("--step", type=int, default=None)
    sub.add_parser("starve")
    s = sub.add_parser("slow-statelog")
    s.add_argument("--ms", type=float, default=400.0)
    s.add_argument("--seconds", type=float, default=20.0)
    sub.add_parser("ckpt-unwritable").add_argument("--seconds", type=float, default=30.0)
    for name in ("xid", "ecc", "thermal"):
        s = sub.add_parser(name)
        s.add_argument("--gpu", type=int, default=0)
        if name == "xid":
            s.add_argument("--xid", type=int, default=79)
        if name == "thermal":
            s.add_argument("--off", dest="on", action="store_false")
    sub.add_parser("schedule").add_argument("file")
    args = p.parse_args(argv)
    run = RunDir(args.run_dir)
    if not run.root.is_dir():
        p.error(f"--run-dir {args.run_dir!r} is not a directory")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        if args.cmd == "schedule":
            try:
                raw = json.loads(Path(args.file).read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as exc:
                p.error(f"schedule {args.file!r}: {exc}")
            if not isinstance(raw, list):
                p.error(f"schedule {args.file!r} must be a JSON list of faults")
            faults = [Fault.from_json(item) for item in raw]
            fired = run_schedule(run, faults, stop=stop)
            print(json.dumps({"fired": fired, "scheduled": len(faults)}))  # noqa: T201
            return 0
        fields = {
            k: v for k, v in vars(args).items() if k not in ("run_dir", "cmd") and v is not None
        }
        print(json.dumps(inject(run, Fault(fault=args.cmd, **fields), stop=stop)))  # noqa: T201
        return 0
    except ChaosError as exc:
        print(f"chaos: error: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
