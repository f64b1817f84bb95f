"""Every metric name on the wire between the agents (and the jobs' heartbeats) and the server:
the agent's table in ``docs/metrics.md``, in one place.

The names the policy engine reads are constants (``ROLLOUT_PENDING_RATIO``, ``GPU_LOST`` ...;
the golden metrics keep the names of DESIGN.md); the sets say what the agent sends, by kind,
and which samples its spool keeps longest. The collectors, the spool's drop policy, the policy
engine and the documentation read this module; ``tests/unit/recovery/protocol/`` pins that
every name the server reads is one an agent sends. Names the server measures itself (an agent's
clock offset, ``app/ingest/clock_skew.py``) are not on the wire and live with what measures them.
"""

from __future__ import annotations

# --- golden metrics (per job/role/rank, from the heartbeat files and the state log) ---
ROLLOUT_PENDING_RATIO = "rollout_pending_ratio"
ACTOR_SHARD_REBUILD_COUNT_5M = "actor_shard_rebuild_count_5m"
STATE_LOG_WRITE_LATENCY_MS = "state_log_write_latency_ms"

# --- job signals (labels job, role, rank) ---
ROLLOUT_TOKENS_PER_SECOND = "rollout_tokens_per_second"
# per rollout engine, the last step: mean and max |trainer - engine| logprob of its tokens
ROLLOUT_LOGPROB_DIFF_MEAN = "rollout_logprob_diff_mean"
ROLLOUT_LOGPROB_DIFF_MAX = "rollout_logprob_diff_max"
TRAIN_STEP = "train_step"
PARTICIPANT_HEARTBEAT_AGE_SECONDS = "participant_heartbeat_age_seconds"
JOB_SAFE_MODE = "job_safe_mode"
# A Ray actor that Ray reports dead or restarting (agent --ray; labels job, role, rank and
# reason = Ray's death cause; value: the dead process's pid).
RAY_ACTOR_DEAD = "ray_actor_dead"
# Why a participant's process failed, from its own output (labels job, role, rank, cause, kind,
# line; value: the exit's time; recovery/supervision/exit_causes.yaml).
PARTICIPANT_EXIT_CAUSE = "participant_exit_cause"
# The job's own first-step hang budget for a participant (heartbeat API, rlguard launch).
PARTICIPANT_FIRST_STEP_BUDGET_SECONDS = "participant_first_step_budget_seconds"
# The process behind a participant's heartbeat (heartbeat pid): a new value is a restart.
PARTICIPANT_PID = "participant_pid"
# A rollout's failed or empty generations (counter; heartbeat API record_failed_samples).
ROLLOUT_FAILED_SAMPLES_TOTAL = "rollout_failed_samples_total"
ROLLOUT_SAMPLES_TOTAL = "rollout_samples_total"  # counter: generations finished, failed included
# A Ray node's liveness in Ray's GCS (agent --ray; labels ray_node and, per job with actors on
# the node, job): 0 once Ray declared the node dead.
RAY_NODE_ALIVE = "ray_node_alive"
LABEL_RAY_NODE = "ray_node"

# Faults the job reports itself (labels job, role, rank): heartbeat fields written by
# recovery.report.HeartbeatReporter (a PhaseMachine given the reporter feeds them), sent by the
# agent as listed in docs/metrics.md.
TRAIN_STEP_FAILURES_TOTAL = "train_step_failures_total"  # counter: failed train steps (OOM ...)
TRAIN_LAST_FAILED_STEP = "train_last_failed_step"  # gauge: the step number of the newest failure
ROLLOUT_BATCH_TIMEOUTS_TOTAL = "rollout_batch_timeouts_total"  # counter
ACTOR_SHARD_STALE = "actor_shard_stale"  # gauge 0/1
STATE_LOG_WRITE_ERRORS_TOTAL = "state_log_write_errors_total"  # counter: failed appends
CHECKPOINT_WRITE_ERRORS_TOTAL = "checkpoint_write_errors_total"  # counter: failed checkpoint saves
# counter: every-step snapshots not persisted (integrations/trl/snapshots.py); and the last
# one's labels dir and error (value: the count it was last at)
SNAPSHOT_PERSIST_ERRORS_TOTAL = "snapshot_persist_errors_total"
SNAPSHOT_PERSIST_LAST_ERROR = "snapshot_persist_last_error"

# Stragglers and engines dead inside a live worker (labels job, role, rank; docs/metrics.md).
ROLLOUT_PENDING_COUNT = "rollout_pending_count"  # gauge: rollouts waiting (heartbeat / engine)
TRAIN_STEP_SECONDS = "train_step_seconds"  # gauge: the rank's own step time, when it reports one

# --- GPU health (labels gpu; from NVML, docs/metrics.md) ---
GPU_UTILIZATION_RATIO = "gpu_utilization_ratio"  # 0..1
GPU_XID_CRITICAL_EVENTS_TOTAL = "gpu_xid_critical_events_total"
GPU_XID_EVENTS_TOTAL = "gpu_xid_events_total"  # labels gpu, xid: one counter per XID code
GPU_XID_LAST_CODE = "gpu_xid_last_code"
GPU_ECC_UNCORRECTED_TOTAL = "gpu_ecc_uncorrected_errors_total"
GPU_REMAPPED_ROWS_FAILURE = "gpu_remapped_rows_failure"
GPU_THROTTLE_THERMAL = "gpu_throttle_thermal_active"
GPU_THROTTLE_POWER = "gpu_throttle_power_active"
GPU_LOST = "gpu_lost"

# --- inference engines probed by the agent (--engine; labels job, role, rank, engine) ---
ROLLOUT_ENGINE_UP = "rollout_engine_up"  # gauge 0/1: the engine's /health answered
# gauge 0/1 per level of the engine's process tree (label process: api_server, engine_core,
# worker), sent when the engine runs on the agent's node: 1 once a process seen there is gone
ROLLOUT_ENGINE_PROCESS_DEAD = "rollout_engine_process_dead"
ROLLOUT_ENGINE_UPTIME = "rollout_engine_uptime_seconds"  # gauge: since its API server started
ROLLOUT_ENGINE_REQUESTS_RUNNING = "rollout_engine_requests_running"  # gauge
ROLLOUT_ENGINE_REQUESTS_WAITING = "rollout_engine_requests_waiting"  # gauge
ROLLOUT_TOKENS_GENERATED_TOTAL = "rollout_tokens_generated_total"  # counter (engine or heartbeat)
# counters of finished requests: all, and those that ended in an error or were aborted
ROLLOUT_ENGINE_REQUESTS_FINISHED = "rollout_engine_requests_finished_total"
ROLLOUT_ENGINE_REQUESTS_ERRORED = "rollout_engine_requests_errored_total"
ROLLOUT_ENGINE_REQUESTS_ABORTED = "rollout_engine_requests_aborted_total"
ROLLOUT_ENGINE_PREEMPTIONS = "rollout_engine_preemptions_total"  # counter
ROLLOUT_ENGINE_KV_CACHE_USAGE = "rollout_engine_kv_cache_usage_ratio"  # gauge 0..1
LABEL_PROCESS = "process"

# --- the scheduler's view of a node (agent --slurm-node; no labels) ---
SLURM_NODE_UNAVAILABLE = "slurm_node_unavailable"  # gauge 0/1: DOWN, DRAIN, FAIL

# Label names the detectors rely on.
LABEL_JOB = "job"
LABEL_ROLE = "role"
LABEL_RANK = "rank"
LABEL_GPU = "gpu"
LABEL_XID = "xid"
LABEL_ENGINE = "engine"

# --- what the agent sends, by kind ---

# XID codes that point at failing hardware or a dead GPU context (NVIDIA's XID catalogue):
# 48 double-bit ECC, 63/64 ECC page retirement / row remap, 74 NVLink error, 79 fallen off the
# bus, 94/95 contained / uncontained ECC error. Only gpu_xid_critical_events_total counts by it;
# the server judges every XID by its code (gpu_xid_events_total{xid} and NVIDIA's resolution
# bucket per code, app/policy/xid_catalog.py) and uses this counter only for agents without the
# per-code one.
CRITICAL_XIDS: frozenset[int] = frozenset({48, 63, 64, 74, 79, 94, 95})

GPU_METRICS: frozenset[str] = frozenset(
    {
        "gpu_info",
        "gpu_lost",
        "gpu_utilization_ratio",
        "gpu_memory_utilization_ratio",
        "gpu_memory_used_bytes",
        "gpu_memory_total_bytes",
        "gpu_temperature_celsius",
        "gpu_power_watts",
        "gpu_power_limit_watts",
        "gpu_sm_clock_hertz",
        "gpu_throttle_reasons_bitmask",
        "gpu_throttle_thermal_active",
        "gpu_throttle_power_active",
        "gpu_throttle_hw_slowdown_active",
        "gpu_ecc_corrected_errors_total",
        "gpu_ecc_uncorrected_errors_total",
        "gpu_retired_pages_total",
        "gpu_retired_pages_pending",
        "gpu_remapped_rows_corrected_total",
        "gpu_remapped_rows_uncorrected_total",
        "gpu_remapped_rows_pending",
        "gpu_remapped_rows_failure",
        "gpu_pcie_replay_total",
        "gpu_nvlink_crc_errors_total",
        "gpu_nvlink_replay_errors_total",
        "gpu_nvlink_recovery_errors_total",
        "gpu_xid_events_total",
        "gpu_xid_critical_events_total",
        "gpu_xid_last_code",
    }
)

# Training metrics a framework integration publishes in the heartbeat's ``signals``
# (``HeartbeatReporter.set_signals``; the TRL callback sends GRPO's). Only these are forwarded.
TRAINER_SIGNALS: frozenset[str] = frozenset(
    {
        "grpo_reward_mean",
        "grpo_reward_std",
        "grpo_kl",
        "grpo_completion_length_mean",
        "grpo_completion_clipped_ratio",
        # per rollout engine: |trainer logprob - engine logprob| of the tokens it sampled, over
        # the last step (the reference job on vLLM engines: workload/engines/)
        "rollout_logprob_diff_mean",
        "rollout_logprob_diff_max",
    }
)

JOB_METRICS: frozenset[str] = TRAINER_SIGNALS | frozenset(
    {
        "rollout_pending_ratio",
        "rollout_pending_count",
        "rollout_scheduled_count",
        "actor_shard_rebuild_count_5m",
        "actor_shard_rebuilds_total",
        "state_log_write_latency_ms",
        "rollout_tokens_generated_total",
        "rollout_tokens_per_second",
        "train_step",
        "participant_heartbeat_age_seconds",
        "participant_progress_age_seconds",
        "participant_pid",
        "job_state_transitions_total",
        "job_state_log_age_seconds",
        "job_safe_mode",
        "train_step_failures_total",
        "train_last_failed_step",
        "rollout_batch_timeouts_total",
        "actor_shard_stale",
        "state_log_write_errors_total",
        "checkpoint_write_errors_total",
        # every-step snapshots not persisted (TRL integration), and the last one's labels dir
        # and error (value: the count it was last at)
        "snapshot_persist_errors_total",
        "snapshot_persist_last_error",
        "checkpoint_committed_step",
        "checkpoint_inference_version",
        # why a process failed, from its own output (labels job, role, rank, cause, kind, line;
        # value: the exit's time; recovery/supervision/exit_causes.yaml)
        "participant_exit_cause",
        # the job's own first-step hang budget (heartbeat API or rlguard launch
        # --first-step-budget), and a rollout's failed or empty generations (counter)
        "participant_first_step_budget_seconds",
        "rollout_failed_samples_total",
        "rollout_samples_total",
        # Inference engines scraped with --engine (labels job, role, rank, engine); the engine
        # also feeds rollout_pending_ratio/_count, rollout_scheduled_count and the token series.
        "rollout_engine_up",
        "rollout_engine_requests_running",
        "rollout_engine_requests_waiting",
        "rollout_engine_kv_cache_usage_ratio",
        "rollout_engine_preemptions_total",
        "rollout_engine_requests_finished_total",
        "rollout_engine_requests_errored_total",
        "rollout_engine_requests_aborted_total",
        # the engine's process tree, when it runs on the agent's node: 0/1 per level (label
        # process: api_server, engine_core, worker), and seconds since its API server started
        "rollout_engine_process_dead",
        "rollout_engine_uptime_seconds",
        # Ray actors (agent --ray; labels job, role, rank; ray_actor_dead also reason, Ray's
        # death cause) and nodes (label ray_node)
        "ray_actor_alive",
        "ray_actor_restarts_total",
        "ray_actor_dead",
        "ray_node_alive",
        # verl's file logger (agent --verl-log; integrations/ray/verl_log.py)
        "train_throughput_tokens_per_second",
        "train_step_seconds",
        "train_phase_generate_seconds",
        "train_phase_update_seconds",
        "train_phase_generate_ratio",
        "rollout_response_length_mean",
        "rollout_stale_samples_total",
        "rollout_dropped_stale_samples_total",
    }
)

# What Slurm says of this node (--slurm-node; no labels: the node is the batch's node).
SCHEDULER_METRICS: frozenset[str] = frozenset({"slurm_node_unavailable", "slurm_jobs_running"})

AGENT_METRICS: frozenset[str] = frozenset(
    {
        "agent_nvml_available",
        "agent_dcgm_exporter_up",
        "ray_collector_up",
        "agent_gpus_monitored",
        "agent_spool_bytes",
        "agent_spool_batches",
        "agent_dropped_samples_total",
        "agent_batches_sent_total",
        "agent_send_failures_total",
    }
)

ALL_METRICS: frozenset[str] = GPU_METRICS | JOB_METRICS | SCHEDULER_METRICS | AGENT_METRICS


def is_job_signal(name: str) -> bool:
    """True for samples the spool keeps longest: job signals (and the scheduler's view of the
    node) outrank GPU and agent samples."""
    return name in JOB_METRICS or name in SCHEDULER_METRICS
