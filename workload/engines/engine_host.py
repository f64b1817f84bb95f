"""One rollout engine of the reference job: the supervised process of rank K
(``python -m workload.engines.engine_host --run-dir D --rank K``), or its warm standby
(``... --standby``).

The host kills what is left of the rank's previous engine tree, starts a vLLM OpenAI server
for the job's model (:mod:`integrations.vllm.server`, with RLGuard's weight loader), writes the
engine's record (:mod:`workload.engines.records`) and stays as long as the engine runs: when the
API server exits it exits with a failure, which the supervisor reports at once, and RLGuard
heals the rank through ``restart_role``. Its heartbeat follows the router's view
(``engines/fleet.json``): ``STARTING``, ``REFIT``, ``ROLLOUT`` once admitted, ``QUARANTINED``.

The standby starts its engine ahead, puts it to sleep (``/sleep``) and waits on its stdin for
the supervisor's order (:mod:`recovery.supervision.standby`): ``{"argv": ["--run-dir", D,
"--rank", K], "log": ...}``. It then kills the rank's leftovers, wakes the engine
(``/wake_up``) and carries on as the rank's host, with the weights it started with until the
router refits it (``workload.engines.fleet``).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from integrations.vllm.client import EngineClient
from integrations.vllm.server import (
    EngineError,
    EngineSettings,
    VLLMServer,
    checkout_pythonpath,
    popen_dying_with_parent,
    start_server,
)
from recovery.report import HeartbeatReporter
from recovery.supervision.standby import OrderError, parse_order, redirect_output
from workload.engines import records
from workload.engines.records import EngineRecord
from workload.job import JobConfig, RunDir

log = logging.getLogger("rlguard.workload.engines")
EXTENSION = "integrations.vllm.worker_extension.RLGuardWeightLoader"
START_TIMEOUT_S = 300.0
# The router's admission state -> the heartbeat phase the agent reports.
PHASES = {
    records.STARTING: "STARTING",
    records.REFITTING: "REFIT",
    records.ADMITTED: "ROLLOUT",
    records.QUARANTINED: "QUARANTINED",
}


def engine_settings(cfg: JobConfig) -> EngineSettings:
    """How every engine of the job is started (seeded: the job's per-request seeds decide the
    samples anyway; small context: prompts and completions are a few tokens)."""
    return EngineSettings(
        max_model_len=64,
        seed=cfg.seed,
        worker_extension_cls=EXTENSION,
        served_model_name="policy",
    )


def _start(run: RunDir, cfg: JobConfig, name: str) -> VLLMServer:
    assert cfg.model_dir is not None
    logs = run.root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    server = start_server(
        Path(cfg.model_dir),
        settings=engine_settings(cfg),
        log_path=logs / f"engine-{name}-{os.getpid()}.log",
        env={**os.environ, "PYTHONPATH": checkout_pythonpath()},
        popen=popen_dying_with_parent,
    )
    return server


def _record(run: RunDir, rank: int, server: VLLMServer, *, warm: bool, ready: bool) -> EngineRecord:
    pids: dict[str, int] = {"api_server": server.pid}
    try:
        pids = server.tree().named_pids()
    except Exception:  # noqa: BLE001 - the tree is read while it may be dying: the api pid holds
        log.warning("engine tree of %s not readable", server.pid)
    record = EngineRecord(
        rank=rank,
        url=server.url,
        model=server.model_name,
        host_pid=os.getpid(),
        pids=pids,
        warm=warm,
        ready=ready,
        started=server.started_at,
        ready_at=time.time() if ready else None,
    )
    records.write_record(run, record)
    return record


def _kill_previous(run: RunDir, rank: int, spare: set[int]) -> None:
    previous = records.read_record(run, rank)
    if previous is None:
        return
    killed = records.kill_leftovers(previous, spare=spare)
    if killed:
        run.event("engine_leftovers_killed", rank=rank, pids=killed)


def _serve(run: RunDir, cfg: JobConfig, rank: int, server: VLLMServer) -> int:
    """Report for the engine until it exits (a failure) or the job is done (0)."""
    hb = HeartbeatReporter(run.root, "rollout", rank, job=cfg.job, interval=0.5)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.is_set():
            if not server.running():
                code = server.process.returncode
                run.event("engine_exit", rank=rank, code=code, api_server=server.pid)
                return code if code else 1
            if run.done.exists():
                break
            view = (records.read_fleet(run).get("engines") or {}).get(str(rank)) or {}
            state = view.get("state", records.STARTING)
            version = view.get("version")
            diff = view.get("disagreement") or {}
            if "mean" in diff and diff.get("incarnation") == view.get("incarnations"):
                hb.set_signals(
                    {
                        "rollout_logprob_diff_mean": float(diff["mean"]),
                        "rollout_logprob_diff_max": float(diff["max"]),
                    }
                )
            hb.update(
                phase=PHASES.get(state, "STARTING"),
                step=None if version is None else int(version) % 1_000_000,
                tokens=int(view.get("tokens") or 0),
                pending=0,
                scheduled=0,
            )
            stop.wait(0.2)
        return 0
    finally:
        hb.update(phase="DONE" if run.done.exists() else "STOPPED", force=True)
        hb.close()
        _withdraw(run, rank, server)
        server.stop(timeout=10.0)


def _withdraw(run: RunDir, rank: int, server: VLLMServer) -> None:
    """Mark the rank's record not ready before its engine is stopped on purpose: the node
    agent watches the engines a job announces (agents/collectors/engine_discovery.py), and an
    engine its job stopped is not a dead one. An engine that dies keeps its record ready, which
    is how the agent sees it dead."""
    record = records.read_record(run, rank)
    if record is not None and record.pids.get("api_server") == server.pid:
        records.write_record(run, dataclasses.replace(record, ready=False))


def run_cold(run: RunDir, rank: int) -> int:
    cfg = run.load_config()
    _kill_previous(run, rank, spare={os.getpid()})
    hb = HeartbeatReporter(run.root, "rollout", rank, job=cfg.job, interval=0.5)
    hb.update(phase="STARTING", force=True)
    hb.close()
    server = _start(run, cfg, f"rollout-{rank}")
    _record(run, rank, server, warm=False, ready=False)
    try:
        seconds = server.wait_healthy(timeout=START_TIMEOUT_S)
    except EngineError as exc:
        log.error("engine of rollout %d did not start: %s", rank, exc)
        server.stop(timeout=5.0)
        return 1
    _record(run, rank, server, warm=False, ready=True)
    run.event("engine_up", rank=rank, warm=False, seconds=round(seconds, 3), url=server.url)
    return _serve(run, cfg, rank, server)


def run_standby(run: RunDir) -> int:
    cfg = run.load_config()
    server = _start(run, cfg, "standby")
    try:
        seconds = server.wait_healthy(timeout=START_TIMEOUT_S)
        client = EngineClient(server.url, server.model_name, timeout=60.0)
        client.sleep(level=1)
    except EngineError as exc:
        log.error("standby engine did not start: %s", exc)
        server.stop(timeout=5.0)
        return 1
    run.event(
        "standby_ready",
        role="rollout",
        engine=True,
        seconds=round(seconds, 3),
        api_server=server.pid,
    )
    line = sys.stdin.readline()
    if not line.strip():
        server.stop(timeout=10.0)
        return 0  # the launcher no longer needs us
    try:
        order = parse_order(line)
        rank = _rank_of(order.argv)
    except (OrderError, ValueError) as exc:
        print(f"engine standby: {exc}", file=sys.stderr)  # noqa: T201
        server.stop(timeout=10.0)
        return 2
    redirect_output(order.log)
    woken = time.monotonic()
    _kill_previous(run, rank, spare={os.getpid(), *server.tree().pids()})
    try:
        client.wake_up()
    except EngineError as exc:
        log.error("standby engine did not wake up: %s", exc)
        server.stop(timeout=5.0)
        return 1
    _record(run, rank, server, warm=True, ready=True)
    run.event(
        "engine_up",
        rank=rank,
        warm=True,
        seconds=round(time.monotonic() - woken, 3),
        url=server.url,
    )
    return _serve(run, cfg, rank, server)


def _rank_of(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="engine host order", add_help=False)
    p.add_argument("--run-dir")
    p.add_argument("--rank", type=int, required=True)
    try:
        args = p.parse_args(argv)
    except SystemExit:
        raise ValueError(f"the order's argv must name --rank, got {argv!r}") from None
    if args.rank < 0:
        raise ValueError(f"--rank must be >= 0, got {args.rank}")
    return int(args.rank)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workload.engines.engine_host")
    parser.add_argument("--run-dir", required=True)
    who = parser.add_mutually_exclusive_group(required=True)
    who.add_argument("--rank", type=int)
    who.add_argument("--standby", action="store_true")
    args = parser.parse_args(argv)
    if args.rank is not None and args.rank < 0:
        parser.error(f"--rank must be >= 0, got {args.rank}")
    logging.basicConfig(
        level=os.environ.get("RLGUARD_WORKLOAD_LOG", "WARNING"),
        format="%(asctime)s engine-host-%(process)d %(levelname)s %(name)s: %(message)s",
    )
    run = RunDir(args.run_dir)
    if args.standby:
        return run_standby(run)
    return run_cold(run, args.rank)


def warm_up() -> None:
    """Nothing to pay ahead: a rollout standby of this job is a whole engine (``--standby``)."""


if __name__ == "__main__":
    sys.exit(main())
