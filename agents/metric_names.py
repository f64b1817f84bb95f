"""Names of the metrics the agent sends (the table in ``docs/metrics.md``) and their priority.

Kept in one place so that the collectors, the spool's drop policy and the documentation cannot
drift apart: a name used by a collector must be listed here.
"""

from __future__ import annotations

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
