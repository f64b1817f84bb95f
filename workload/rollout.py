"""A rollout worker of the reference job: ``python -m workload.rollout --run-dir D --rank K``.

For each training step the worker pulls the trainer's weights of that step (from the trainer or
any relay, through :mod:`recovery.transfer`), generates its share of the groups with seeds
derived from (run seed, step, worker, sample), and commits them as one batch
(:func:`recovery.batch.commit_batch`). Each batch is a WAL entry (PENDING → EXECUTING →
COMPLETED), so a worker killed mid-batch leaves an EXECUTING entry: its successor marks it
FAILED (a lost rollout) and generates the batch again, identically. Between samples the worker
offers the checkpoint coordinator a safe point.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Any

import torch

from recovery.batch import commit_batch
from recovery.checkpoint.participant import Participant
from recovery.checkpoint.version import VersionVector
from recovery.control import ControlMode, read_control
from recovery.errors import RecoveryError
from recovery.pids import process_exists
from recovery.report import HeartbeatReporter, heartbeat_path
from recovery.transfer import RegistryClient, TensorSpec, WeightReceiver, make_transport
from recovery.transfer.errors import TransferError
from recovery.wal import StepType, WALStatus, WriteAheadLog
from workload.chaos import STARVE_FILE
from workload.job import VERSION_STRIDE, WEIGHT_SET, JobConfig, RunDir, read_json
from workload.policy import DigitPolicy, init_policy, prompts_for, sample_group
from workload.task import TaskSpec

log = logging.getLogger("rlguard.workload.rollout")
# A worker whose heartbeat is older than this is not generating: its batch goes to a healthy one.
ORPHAN_AFTER_S = 2.0
# ... and so is one in these phases (EXITED: its launcher saw it exit).
ORPHAN_PHASES = ("STARTING", "STOPPED", "EXITED")


def _attempts(wal: WriteAheadLog, prefix: str) -> list[tuple[str, WALStatus]]:
    return [(e.entry_id, e.status) for e in wal.entries() if e.entry_id.startswith(prefix)]


def run(run_dir: str, rank: int) -> int:
    run = RunDir(run_dir)
    cfg = run.load_config()
    spec = cfg.task
    runtime = read_json(run.runtime) or {}
    torch.set_num_threads(1)
    policy = init_policy(spec, cfg.seed)
    params = dict(policy.named_parameters())
    registry = RegistryClient(runtime["registry"], timeout=5.0)
    receiver = WeightReceiver(
        WEIGHT_SET,
        [TensorSpec.of(n, p.detach()) for n, p in params.items()],
        transport=make_transport("tcp"),
        registry=registry,
        timeout=5.0,
    )
    participant = Participant(
        f"rollout-{rank}",
        "rollout",
        [runtime["coordinator"]],
        version=VersionVector(0, 0),
        heartbeat_interval=0.5,
        request_timeout=2.0,
    )
    participant.start()
    hb = HeartbeatReporter(run.root, "rollout", rank, job=cfg.job, interval=0.5)
    hb.start_keepalive()
    wal = WriteAheadLog(run.wal, lock_timeout=30.0)
    tokens = 0
    started = time.time()
    run.event("rollout_start", rank=rank)
    try:
        while not run.done.exists():
            participant.safe_point(timeout=10.0)
            if read_control(run.root).mode is ControlMode.SAFE_MODE:
                hb.update(phase="SAFE_MODE")  # no new rollouts until the job is released
                time.sleep(0.2)
                continue
            if _starved(run, started):  # chaos: alive and idle, producing nothing
                hb.update(phase="WAIT_WEIGHTS", pending=0, scheduled=0)
                time.sleep(0.05)
                continue
            weights = read_json(run.weights)
            if weights is None:
                time.sleep(0.05)
                continue
            step, version = int(weights["step"]), int(weights["version"])
            worker = _work_for(run, cfg.rollouts, step, rank)
            if worker is None:
                hb.update(phase="WAIT_WEIGHTS", step=step, pending=0, scheduled=0)
                time.sleep(0.05)
                continue
            if receiver.live_version is None or receiver.live_version % VERSION_STRIDE != step:
                participant.set_state("syncing")
                try:
                    receiver.pull(version, timeout=20.0)
                except TransferError as exc:
                    log.warning("rollout %d: pull of version %d failed: %s", rank, version, exc)
                    time.sleep(0.2)
                    continue
                with torch.no_grad():
                    for name, tensor in receiver.live_tensors.items():
                        params[name].copy_(tensor)
                participant.set_version(VersionVector(step, step))
            participant.set_state("rollout_in_progress")
            tokens = _generate(run, cfg, wal, policy, participant, hb, step, rank, tokens, worker)
            participant.set_state("idle")
    finally:
        hb.update(phase="DONE" if run.done.exists() else "STOPPED", force=True)
        hb.close()
        participant.close()
        receiver.close()
        wal.close()
    return 0


def _starved(run: RunDir, started: float) -> bool:
    """Chaos ``starve`` (:mod:`workload.chaos`) was injected after this worker started."""
    path = run.chaos / STARVE_FILE
    if not path.exists():
        return False
    at = (read_json(path) or {}).get("at")
    return isinstance(at, int | float) and at >= started


def _producer_alive(entry_id: str) -> bool:
    try:
        pid = int(entry_id.rsplit("-p", 1)[1])
    except (IndexError, ValueError):
        return False
    return process_exists(pid)


def _work_for(run: RunDir, workers: int, step: int, rank: int) -> int | None:
    """The worker whose batch of ``step`` this process should generate: its own, else one whose
    worker is dead or still restarting (rescheduled to a healthy worker: the seeds make it the
    same batch, so whoever commits first wins and the other commit is a no-op)."""
    if not (run.batches / run.batch_id(step, rank) / "SUCCESS").exists():
        return rank
    now = time.time()
    for k in range(workers):
        if k == rank or (run.batches / run.batch_id(step, k) / "SUCCESS").exists():
            continue
        beat = read_json(heartbeat_path(run.root, "rollout", k)) or {}
        stale = now - float(beat.get("ts", 0)) > ORPHAN_AFTER_S
        if stale or beat.get("phase") in ORPHAN_PHASES:
            return k
    return None


def _generate(
    run: RunDir,
    cfg: JobConfig,
    wal: WriteAheadLog,
    policy: DigitPolicy,
    participant: Participant,
    hb: HeartbeatReporter,
    step: int,
    rank: int,
    tokens: int,
    worker: int,
) -> int:
    spec = cfg.task
    batch_id = run.batch_id(step, worker)
    previous = _attempts(wal, batch_id + "-a")
    for entry_id, status in previous:
        if status in (WALStatus.PENDING, WALStatus.EXECUTING) and not _producer_alive(entry_id):
            # Its worker died mid-batch: the rollouts it was generating are lost and redone.
            wal.update_status(entry_id, WALStatus.FAILED, error="worker died mid-batch")
            run.event(
                "lost_rollout",
                rank=worker,
                step=step,
                entry=entry_id,
                samples=spec.prompts_per_worker * spec.group_size,
            )
    # Unique per producer: a rescheduled batch may be generated by two workers at once.
    entry_id = f"{batch_id}-a{len(previous)}-r{rank}-p{os.getpid()}"
    targets = prompts_for(spec, cfg.seed, step, worker)
    request = {"step": step, "worker": worker, "targets": targets, "seed": cfg.seed, "by": rank}
    wal.append(entry_id, StepType.GENERATE, data=json.dumps(request).encode())
    wal.update_status(entry_id, WALStatus.EXECUTING)
    run.event("batch_start", rank=worker, by=rank, step=step, entry=entry_id)
    started = time.monotonic()
    scheduled = len(targets) * spec.group_size
    samples: list[dict[str, Any]] = []
    for i, target in enumerate(targets):
        hb.update(phase="ROLLOUT", step=step, tokens=tokens, pending=0, scheduled=scheduled)
        group = sample_group(policy, spec, cfg.seed, step, worker, i, target)
        samples.extend(group)
        n_tokens = len(group) * spec.length
        tokens += n_tokens
        time.sleep(n_tokens * cfg.decode_ms_per_token / 1000.0)
        participant.safe_point(timeout=10.0)
    commit_batch(
        run.batches,
        batch_id,
        samples,
        meta={
            "worker_id": f"rollout-{worker}",
            "seed": cfg.seed,
            "token_count": scheduled * spec.length,
            "step": step,
        },
    )
    wal.update_status(entry_id, WALStatus.COMPLETED)
    run.event(
        "batch_done",
        rank=worker,
        by=rank,
        step=step,
        entry=entry_id,
        seconds=time.monotonic() - started,
    )
    hb.update(phase="WAIT_WEIGHTS", step=step, tokens=tokens, pending=0, scheduled=0, force=True)
    return tokens


def warm_up() -> None:
    """Pay now for what torch does lazily on a rollout's first samples, so a standby that takes
    over generates at once. Touches no run directory and leaves the global RNG as it was."""
    torch.set_num_threads(1)
    with torch.random.fork_rng(devices=[]):
        spec = TaskSpec(length=2, group_size=2, prompts_per_worker=1, hidden=4)
        sample_group(init_policy(spec, 0), spec, 0, 0, 0, 0, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workload.rollout")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--rank", type=int, required=True)
    args = parser.parse_args(argv)
    if args.rank < 0:
        parser.error(f"--rank must be >= 0, got {args.rank}")
    logging.basicConfig(
        level=os.environ.get("RLGUARD_WORKLOAD_LOG", "WARNING"),
        format="%(asctime)s rollout-%(process)d %(levelname)s %(name)s: %(message)s",
    )
    try:
        return run(args.run_dir, args.rank)
    except RecoveryError as exc:
        log.error("rollout %d stopped: %s", args.rank, exc)
        return 3


if __name__ == "__main__":
    sys.exit(main())
