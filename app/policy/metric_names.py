"""Every metric name the policy engine reads, in one place.

The names follow the agent's table in ``docs/metrics.md`` (the golden metrics keep the names of
DESIGN.md). When the agent renames a metric, this module is the only thing to change.
"""

from __future__ import annotations

from app.ingest.clock_skew import CLOCK_OFFSET_METRIC

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

# --- measured by the server, not sent by agents (app/ingest/clock_skew.py; no labels) ---
AGENT_CLOCK_OFFSET = CLOCK_OFFSET_METRIC  # server minus node clock, while corrected

# Label names the detectors rely on.
LABEL_JOB = "job"
LABEL_ROLE = "role"
LABEL_RANK = "rank"
LABEL_GPU = "gpu"
LABEL_XID = "xid"
LABEL_ENGINE = "engine"
