"""The heartbeat document is one contract: what ``HeartbeatReporter`` writes (every field, each
set through the reporter's own API) is what the agent's parser reads, field for field; and the
exit the launcher writes into it (with its cause) is read too. A field renamed on one side fails
here."""

from __future__ import annotations

import time
from pathlib import Path

from recovery.launcher_reports import report_process_exit
from recovery.protocol.heartbeat import Heartbeat, parse_heartbeat
from recovery.report import HeartbeatReporter

# Document keys that are about the file, not the participant (the agent does not forward them).
FILE_KEYS = {"format"}


def _written(tmp_path: Path) -> tuple[dict[str, object], Heartbeat, float]:
    # Now, not at import: the reporter keeps only the rebuilds of its recent window.
    rebuilt_at = round(time.time(), 3)
    hb = HeartbeatReporter(tmp_path, "trainer", 3, job="grpo-7", interval=0.001, pid=4242)
    hb.update(phase="TRAIN", step=41, tokens=900, pending=5, scheduled=7, state_log_latency_ms=2.5)
    hb.record_shard_rebuild(ts=rebuilt_at)
    hb.record_step_failure(40)
    hb.record_rollout_timeout()
    hb.record_state_log_error()
    hb.record_checkpoint_error()
    hb.record_snapshot_persist_error("/ckpt/snap-40", "No space left on device")
    hb.set_shard_stale("shard_2", True)
    hb.record_checkpoint(39, 12)
    hb.set_first_step_budget(600.0)
    hb.record_failed_samples(2)
    hb.record_samples(64)
    hb.set_signals({"grpo_reward_mean": 0.25, "grpo_kl": 0.01})
    hb.flush()
    doc = hb.snapshot()
    raw = hb.path.read_bytes()
    hb.close()
    return doc, parse_heartbeat(raw, default_job="unused"), rebuilt_at


def test_every_field_the_reporter_writes_is_read(tmp_path: Path) -> None:
    doc, beat, rebuilt_at = _written(tmp_path)
    assert beat == Heartbeat(
        job="grpo-7",
        role="trainer",
        rank=3,
        phase="TRAIN",
        ts=beat.ts,
        updated_at=beat.updated_at,
        step=41,
        tokens_generated=900,
        rollouts_pending=5,
        rollouts_scheduled=7,
        shard_rebuilds=(rebuilt_at,),
        shard_rebuilds_total=1,
        state_log_write_latency_ms=2.5,
        train_step_failures_total=1,
        train_last_failed_step=40,
        rollout_batch_timeouts_total=1,
        stale_shards=("shard_2",),
        state_log_write_errors_total=1,
        checkpoint_write_errors_total=1,
        checkpoint_step=39,
        checkpoint_inference_version=12,
        signals=(("grpo_kl", 0.01), ("grpo_reward_mean", 0.25)),
        exit_cause=None,
        pid=4242,
        first_step_budget_seconds=600.0,
        rollout_failed_samples_total=2,
        rollout_samples_total=64,
        snapshot_persist_errors_total=1,
        snapshot_persist_last_error=("/ckpt/snap-40", "No space left on device"),
    )
    assert beat.ts > 0 and beat.updated_at is not None
    # No field of the document goes unread: the parser knows every key the reporter writes.
    unread = set(doc) - set(Heartbeat.__dataclass_fields__) - FILE_KEYS
    assert unread == set()


def test_the_exit_the_launcher_writes_is_read_with_its_cause(tmp_path: Path) -> None:
    hb = HeartbeatReporter(tmp_path, "rollout", 0, job="grpo-7", interval=0.001, pid=77)
    hb.update(phase="ROLLOUT", force=True)
    hb.close()
    cause = {"cause": "cuda_oom", "kind": "oom", "line": "torch.OutOfMemoryError: CUDA",
             "source": "catalogue"}  # fmt: skip
    doc = report_process_exit(
        tmp_path, "rollout", 0, job="grpo-7", pid=77, returncode=-9, exit_cause=cause
    )
    beat = parse_heartbeat(hb.path.read_bytes(), default_job="unused")
    assert (beat.phase, beat.pid) == ("EXITED", 77)
    assert beat.exit_cause == ("cuda_oom", "oom", "torch.OutOfMemoryError: CUDA")
    # For a person reading the file; the agent reports the phase and the cause.
    assert {"exit_code", "exit_signal"} <= set(doc) and doc["exit_signal"] == "SIGKILL"
