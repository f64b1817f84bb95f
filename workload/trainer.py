"""The trainer of the reference job: ``python -m workload.trainer --run-dir D``.

One step: publish the weights of the step (:mod:`recovery.transfer`, rollouts relay them), wait
for every worker's committed batch of the step, load them in worker order, take one GRPO update,
and move the phase machine on (state log + control file). Between steps the trainer offers the
checkpoint coordinator a safe point; when a round commits it saves core (model, optimizer, step,
RNG state, weight version ...) and aux (rollout statistics) layers with the round's version
vector. Every ``snapshot_interval_steps`` it writes a shard snapshot.

A restarted trainer resumes from the newest valid checkpoint and reuses the committed batches
(they are the same bytes a clean run would have used, which ``consumed.jsonl`` records), so a run
with faults ends with the same parameters as a clean run.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from recovery.batch import CommittedBatch, committed_batches
from recovery.checkpoint.engine import CheckpointEngine
from recovery.checkpoint.errors import CheckpointInputError
from recovery.checkpoint.participant import Participant
from recovery.checkpoint.version import VersionVector, WeightVersionTable
from recovery.errors import RecoveryError
from recovery.phases import Event, Phase, PhaseMachine, SafeModeError
from recovery.report import HeartbeatError, HeartbeatReporter, heartbeat_path
from recovery.shards import BaseShard, ShardSnapshotter
from recovery.statelog import StateLog
from recovery.transfer import RegistryClient, WeightPublisher, make_transport
from workload.job import VERSION_STRIDE, WEIGHT_SET, JobConfig, RunDir, read_json, write_json_atomic
from workload.policy import DigitPolicy, grpo_loss, init_policy, params_digest, sample_group
from workload.task import TaskSpec

log = logging.getLogger("rlguard.workload.trainer")
SHARD = "rank0"


class Trainer:
    def __init__(self, run: RunDir, incarnation: int) -> None:
        self.run = run
        self.cfg: JobConfig = run.load_config()
        self.incarnation = incarnation
        torch.set_num_threads(1)
        self.policy, self.reference = self._make_policies()
        self.base = BaseShard(0, {n: t.clone() for n, t in self.policy.state_dict().items()}, {})
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=self.cfg.lr)
        self.step = 0
        self.weight_versions = WeightVersionTable()
        self.stats: list[dict[str, float]] = []
        self.engine = CheckpointEngine(run.checkpoints, keep=3)
        self.snapshots = ShardSnapshotter(
            run.shards, snapshot_interval_steps=self.cfg.snapshot_interval_steps
        )
        self.checkpoint_failures = 0
        self._restore()
        runtime = read_json(run.runtime) or {}
        self.publisher = WeightPublisher(
            WEIGHT_SET,
            transport=make_transport(self.cfg.transport),
            registry=RegistryClient(runtime["registry"], timeout=5.0),
            lease_s=5.0,
        )
        self.participant = Participant(
            "trainer",
            "trainer",
            [runtime["coordinator"]],
            version=VersionVector(self.step, self.step),
            on_commit=self._on_commit,
            heartbeat_interval=0.5,
            request_timeout=2.0,
        )
        self.state_log = StateLog(run.state_log)
        self.hb = HeartbeatReporter(run.root, "trainer", 0, job=self.cfg.job, interval=0.5)
        # The reporter counts failed steps for the agent (train_step_failures_total → step_failed).
        self.machine = PhaseMachine(
            self.state_log, name="trainer", run_dir=run.root, first_step=self.step, reporter=self.hb
        )
        self.published: int | None = None
        self._burst_max_ms = 0.0
        self._step_latency_ms: float | None = None

    # ---- what a rollout backend may change ---------------------------------------------------

    def _make_policies(self) -> tuple[torch.nn.Module, torch.nn.Module]:
        """The policy to train and the frozen reference, identical at step 0."""
        spec = self.cfg.task
        policy: DigitPolicy = init_policy(spec, self.cfg.seed)
        return policy, init_policy(spec, self.cfg.seed)

    def _loss(self, samples: list[dict[str, Any]]) -> tuple[torch.Tensor, dict[str, float]]:
        assert isinstance(self.policy, DigitPolicy) and isinstance(self.reference, DigitPolicy)
        return grpo_loss(
            self.policy, self.reference, samples, self.cfg.task, kl_coef=self.cfg.kl_coef
        )

    def _published(self, version: int, tensors: dict[str, torch.Tensor]) -> None:
        """Called once the weights of the step are published as ``version``."""

    # ---- checkpoints -------------------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        return {
            "model": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "lr_scheduler": {"kind": "constant", "lr": self.cfg.lr},
            "step": self.step,
            "inference_weight_version": self.step,
            "generation_config": {
                "length": self.cfg.task.length,
                "group_size": self.cfg.task.group_size,
            },
            "rng": {"torch": torch.get_rng_state()},
            "rollout_stats": {"history": [dict(s) for s in self.stats[-50:]]},
        }

    def _on_commit(self, round_id: int, target: VersionVector) -> dict[str, Any]:
        try:
            handle = self.engine.save(
                self._state(),
                version=VersionVector(self.step, self.step),
                layers={"rng": "core", **self.engine.layers},
                weight_versions=self.weight_versions,
                timeout=30.0,
            )
            info = handle.wait(timeout=30.0)
        except (RecoveryError, OSError) as exc:
            # The round aborts (the version does not move). The heartbeat's counter brings the
            # storage trouble to the server (storage_unwritable); the timeline records it too.
            self.checkpoint_failures += 1
            try:
                self.hb.record_checkpoint_error()
            except HeartbeatError as report_exc:
                # The heartbeat's storage refuses too: the agent sees its age grow instead.
                log.warning("checkpoint failure not reported: %s", report_exc)
            self.run.event("checkpoint_failed", step=self.step, error=str(exc)[:300])
            raise
        self.run.event("checkpoint", step=self.step, seq=info.seq, round=round_id)
        # The job page shows the newest committed version vector (an operator deciding on a
        # restore needs it); it travels in the heartbeat.
        self.hb.record_checkpoint(self.step, self.step)
        return {"seq": info.seq, "step": self.step}

    def _restore(self) -> None:
        info = self.engine.latest()
        if info is None:
            return
        state = self.engine.load(info)
        self.policy.load_state_dict({k: v.clone() for k, v in state["model"].items()})
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"]["torch"].clone())
        self.step = int(state["step"])
        self.weight_versions = info.weight_versions
        self.stats = list(state.get("rollout_stats", {}).get("history", []))
        self.run.event("trainer_restored", step=self.step, seq=info.seq)
        log.warning("trainer restored step %d from %s", self.step, info.path.name)

    # ---- the loop ----------------------------------------------------------------------------

    def _publish(self) -> None:
        if self.published == self.step:
            return
        version = self.incarnation * VERSION_STRIDE + self.step
        tensors = {n: p.detach().clone() for n, p in self.policy.named_parameters()}
        self.publisher.publish(version, tensors, min_replicas=1)
        self._published(version, tensors)
        if self.published is not None:
            self.publisher.retire(self.incarnation * VERSION_STRIDE + self.published)
        self.published = self.step
        pushes = self.weight_versions.pushes
        if not pushes or pushes[-1].training_step < self.step:
            self.weight_versions.record(self.step, self.step)
        write_json_atomic(self.run.weights, {"step": self.step, "version": version})
        self.participant.set_version(VersionVector(self.step, self.step))

    def _batches(self) -> list[CommittedBatch] | None:
        wanted = {self.run.batch_id(self.step, w) for w in range(self.cfg.rollouts)}
        found = [b for b in committed_batches(self.run.batches) if b.batch_id in wanted]
        return sorted(found, key=lambda b: b.batch_id) if len(found) == len(wanted) else None

    def _pending(self) -> int:
        """Workers whose batch is missing while their heartbeat is stale: work nobody does."""
        now, pending = time.time(), 0
        for w in range(self.cfg.rollouts):
            if (self.run.batches / self.run.batch_id(self.step, w) / "SUCCESS").exists():
                continue
            beat = read_json(heartbeat_path(self.run.root, "rollout", w)) or {}
            if now - float(beat.get("ts", 0)) > 3.0:
                pending += 1
        return pending

    def _fire(self, event: Event, **info: Any) -> Phase:
        # The heartbeat carries the slowest state-log append of the current step: a step's
        # transitions come in a burst, and the last one alone can hide a stall before it.
        try:
            return self.machine.fire(event, **info)
        finally:
            latency = self.state_log.last_write_latency_ms
            if latency is not None:
                self._burst_max_ms = max(self._burst_max_ms, latency)

    def _close_burst(self) -> None:
        self._step_latency_ms = self._burst_max_ms if self._burst_max_ms > 0 else None
        self._burst_max_ms = 0.0

    def _beat(self, *, force: bool = False) -> None:
        self.hb.update(
            phase=self.machine.phase.value,
            step=self.step,
            pending=self._pending(),
            scheduled=self.cfg.rollouts,
            state_log_latency_ms=self._step_latency_ms,
            force=force,
        )

    def _wait_batches(self) -> list[CommittedBatch]:
        while True:
            self.machine.tick()
            if self.machine.phase is Phase.SAFE_MODE:
                self._beat()
                time.sleep(0.2)
                continue
            if self.machine.phase is Phase.PREPARE:  # released from SAFE_MODE
                self._fire(Event.PREPARED)
            self.participant.safe_point(timeout=10.0)
            found = self._batches()
            if found is not None:
                return found
            self._beat()
            time.sleep(0.05)

    def _train(self, batches: list[CommittedBatch]) -> dict[str, float]:
        fault = self.run.chaos / f"oom-step-{self.step}"
        if fault.exists():
            os.replace(fault, fault.with_name(fault.name + ".fired"))
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate 2.00 GiB (injected by chaos at step {self.step})"
            )
        spin = self.run.chaos / f"spin-step-{self.step}"
        if spin.exists():
            os.replace(spin, spin.with_name(spin.name + ".fired"))  # once: not after a restart
            self._spin_in_collective()
        samples: list[dict[str, Any]] = []
        for b in batches:
            samples.extend(b.load_samples())
        self.optimizer.zero_grad(set_to_none=True)
        loss, stats = self._loss(samples)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        self.optimizer.step()
        return stats

    def _spin_in_collective(self) -> None:
        """Chaos ``spin``: what a rank stuck in a collective looks like from outside (NCCL
        busy-waits on its peers): the CPU busy, the heartbeat fresh, the step frozen, for good.
        Only the step tells; RLGuard's ``train_hang`` restarts the process."""
        while True:
            self._beat()
            until = time.monotonic() + 0.05
            while time.monotonic() < until:
                pass

    def _snapshot(self) -> None:
        if not self.snapshots.should_snapshot(self.step):
            return
        latest = self.snapshots.latest(SHARD)
        if latest is not None and latest.step >= self.step:
            return  # a predecessor (before a restart) took it; a redone step is the same state
        self.snapshots.snapshot(
            SHARD, self.step, dict(self.policy.state_dict()), self.optimizer.state_dict(), self.base
        )

    def _record_consumed(self, batches: list[CommittedBatch], outcome: str) -> None:
        for b in batches:
            digest = hashlib.sha256((b.path / "samples.jsonl").read_bytes()).hexdigest()
            self.run.event(
                "consumed", step=self.step, batch=b.batch_id, sha256=digest, outcome=outcome
            )

    def _handle_requests(self) -> None:
        if not self.run.requests.is_dir():
            return
        for req in sorted(self.run.requests.glob("*.json")):
            body = read_json(req) or {}
            action = body.get("action")
            if action == "skip_failed_step":
                # The phase machine already recorded and skipped it; acknowledge.
                self.run.event("request_done", action=action, step=body.get("step"))
            elif action == "rebuild_shard":
                rebuilt = self.snapshots.rebuild_shard(
                    SHARD,
                    load_base=lambda _s: BaseShard(
                        0, {n: t.clone() for n, t in self.base.params.items()}, {}
                    ),
                )
                self.run.event("shard_rebuilt", shard=SHARD, step=rebuilt.step)
            else:
                continue  # restores are the launcher's: it restarts the job from the checkpoint
            os.replace(req, req.with_suffix(".done"))

    def run_loop(self) -> int:
        self.participant.start()
        self.hb.start_keepalive()
        self.run.event("trainer_start", step=self.step, incarnation=self.incarnation)
        try:
            self._fire(Event.START)
            self._fire(Event.PREPARED)
        except SafeModeError as exc:  # the control file holds the job: wait for its release
            log.warning("trainer starts in SAFE_MODE: %s", exc)
        while self.step < self.cfg.steps:
            self._publish()
            batches = self._wait_batches()
            started = time.monotonic()
            try:
                self._fire(Event.ROLLOUT_COMPLETE)
                self._fire(Event.DATA_AVAILABLE)
            except SafeModeError:
                continue  # SAFE_MODE was commanded in between: hold before training
            self._beat(force=True)
            try:
                stats = self._train(batches)
            except torch.cuda.OutOfMemoryError as exc:
                self._record_consumed(batches, "skipped")
                self._fire(Event.TRAIN_STEP_FAILED, reason=str(exc))
                self.run.event("step_failed", step=self.step, error=str(exc))
            else:
                self._record_consumed(batches, "trained")
                self.stats.append(stats)
                self._fire(Event.TRAIN_STEP_DONE, **stats)
                self._fire(Event.EVAL_DONE)
                self.run.event("step", step=self.step, seconds=time.monotonic() - started, **stats)
            # A skipped step moves on; a heavy failure (SAFE_MODE) stays on the step until released.
            self.step = self.machine.step
            self._snapshot()
            self._close_burst()
            self._handle_requests()
            if self.step < self.cfg.steps:
                self._publish()
            self._beat(force=True)
        write_json_atomic(
            self.run.final,
            {
                "step": self.step,
                "params_sha256": params_digest(self.policy),
                "failed_steps": list(self.machine.failed_steps),
            },
        )
        torch.save(self.policy.state_dict(), self.run.root / "final_params.pt")
        self.run.done.touch()
        self.run.event("trainer_done", step=self.step)
        self.hb.update(phase="DONE", step=self.step, force=True)
        return 0

    def close(self) -> None:
        self.hb.close()
        self.participant.close()
        self.publisher.close()
        try:
            self.engine.close(timeout=30.0)
        except (RecoveryError, CheckpointInputError) as exc:
            log.error("checkpoint engine did not close cleanly: %s", exc)
        self.state_log.close()


def warm_up() -> None:
    """Pay now for what torch imports lazily on a trainer's first use (the optimizer alone pulls
    in torch._dynamo: seconds), so a standby that takes over starts training at once. Touches no
    run directory, and the global RNG state is left as it was (a fresh trainer's determinism
    depends on it)."""
    torch.set_num_threads(1)
    with torch.random.fork_rng(devices=[]):
        spec = TaskSpec(length=2, group_size=2, prompts_per_worker=1, hidden=4)
        policy, reference = init_policy(spec, 0), init_policy(spec, 0)
        optimizer = torch.optim.Adam(policy.parameters(), lr=0.01)
        samples = sample_group(policy, spec, 0, 0, 0, 0, 1)
        loss, _stats = grpo_loss(policy, reference, samples, spec, kl_coef=0.05)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        optimizer.step()


def main(argv: list[str] | None = None) -> int:
    return run_trainer("python -m workload.trainer", Trainer, argv)


def run_trainer(
    prog: str, make: Callable[[RunDir, int], Trainer], argv: list[str] | None = None
) -> int:
    """A trainer process's entry: ``--run-dir`` and ``--incarnation``, the trainer ``make``
    builds from them run to its end; 3 when the recovery library stopped it."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--incarnation", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("RLGUARD_WORKLOAD_LOG", "WARNING"),
        format="%(asctime)s trainer-%(process)d %(levelname)s %(name)s: %(message)s",
    )
    trainer = make(RunDir(args.run_dir), args.incarnation)
    try:
        return trainer.run_loop()
    except RecoveryError as exc:
        log.error("trainer stopped: %s", exc)
        return 3
    finally:
        trainer.close()


if __name__ == "__main__":
    sys.exit(main())
