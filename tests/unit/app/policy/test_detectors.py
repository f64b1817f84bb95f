from __future__ import annotations

import pytest

from app.policy import metric_names as m
from app.policy.detectors import (
    EnvDriftDetector,
    GoldenMetricDetector,
    GpuHealthDetector,
    HeartbeatDetector,
    JobFailureDetector,
    NodeSilenceDetector,
    RolloutStallDetector,
    TrainerIdleDetector,
)
from app.policy.signals import FaultKind, Tier

from ._helpers import JOB, Cluster

pytestmark = pytest.mark.timeout(30)

P = {"job": JOB, "role": "rollout", "rank": "0"}


def first_firing(results: list) -> int | None:
    for i, sigs in enumerate(results):
        if sigs:
            return i + 1
    return None


# -- golden metrics ---------------------------------------------------------------------------


def test_pending_ratio_fires_after_breach_duration_with_evidence() -> None:
    c = Cluster()
    det = GoldenMetricDetector(c.policy)
    c.run(20, lambda c: c.put("n1", m.ROLLOUT_PENDING_RATIO, 0.05, **P), detector=det)
    res = c.run(40, lambda c: c.put("n1", m.ROLLOUT_PENDING_RATIO, 0.6, **P), detector=det)
    fired = first_firing(res)
    assert fired is not None and 30 <= fired <= 31
    sig = res[fired - 1][0]
    assert sig.kind is FaultKind.ROLLOUT_PENDING_HIGH
    assert sig.subject.to_dict() == {"node": "n1", "job": JOB, "role": "rollout", "rank": 0}
    assert sig.evidence.threshold == 0.3 and sig.evidence.window_seconds == 30
    assert all(v > 0.3 for _, v in sig.evidence.values)
    assert sig.suggested_tier is Tier.LIGHT


def test_pending_ratio_spike_shorter_than_breach_does_not_fire() -> None:
    c = Cluster()
    det = GoldenMetricDetector(c.policy)
    c.run(20, lambda c: c.put("n1", m.ROLLOUT_PENDING_RATIO, 0.05, **P), detector=det)
    res = c.run(25, lambda c: c.put("n1", m.ROLLOUT_PENDING_RATIO, 0.9, **P), detector=det)
    res += c.run(30, lambda c: c.put("n1", m.ROLLOUT_PENDING_RATIO, 0.05, **P), detector=det)
    assert first_firing(res) is None


def test_breach_interrupted_by_one_healthy_sample_restarts_the_clock() -> None:
    c = Cluster()
    det = GoldenMetricDetector(c.policy)
    res = c.run(20, lambda c: c.put("n1", m.STATE_LOG_WRITE_LATENCY_MS, 300, **P), detector=det)
    assert first_firing(res) == 11  # first breaching sample at second 1, +10 s
    res = c.run(1, lambda c: c.put("n1", m.STATE_LOG_WRITE_LATENCY_MS, 20, **P), detector=det)
    res += c.run(9, lambda c: c.put("n1", m.STATE_LOG_WRITE_LATENCY_MS, 300, **P), detector=det)
    assert first_firing(res) is None
    res = c.run(2, lambda c: c.put("n1", m.STATE_LOG_WRITE_LATENCY_MS, 300, **P), detector=det)
    assert first_firing(res) is not None


def test_shard_rebuild_count_is_inclusive_and_immediate() -> None:
    c = Cluster()
    det = GoldenMetricDetector(c.policy)
    res = c.run(5, lambda c: c.put("n0", m.ACTOR_SHARD_REBUILD_COUNT_5M, 1, **P), detector=det)
    assert first_firing(res) is None
    res = c.run(1, lambda c: c.put("n0", m.ACTOR_SHARD_REBUILD_COUNT_5M, 2, **P), detector=det)
    assert res[0] and res[0][0].kind is FaultKind.SHARD_REBUILD_STORM


def test_stale_series_is_not_judged() -> None:
    c = Cluster()
    det = GoldenMetricDetector(c.policy)
    c.run(40, lambda c: c.put("n1", m.STATE_LOG_WRITE_LATENCY_MS, 500, **P), detector=det)
    res = c.run(20, lambda c: None, detector=det)  # no samples: the last breach is 20 s old
    assert res[-1] == []


# -- trainer idleness -------------------------------------------------------------------------


def _trainer_second(util: float, phase: str = "TRAIN"):
    def f(c: Cluster) -> None:
        for gpu in ("0", "1"):
            c.put("n0", m.GPU_UTILIZATION_RATIO, util, gpu=gpu)
        c.participant("trainer", 0, "n0", phase=phase)

    return f


def test_trainer_idle_in_train_fires_after_timeout() -> None:
    c = Cluster()
    det = TrainerIdleDetector(c.policy)
    c.run(30, _trainer_second(0.9), detector=det)
    res = c.run(310, _trainer_second(0.0), detector=det)
    fired = first_firing(res)
    assert fired is not None and 300 <= fired <= 302
    sig = res[fired - 1][0]
    assert sig.kind is FaultKind.TRAINER_IDLE and sig.subject.node == "n0"
    assert sig.extra["ranks"] == [0]


def test_trainer_idle_during_weight_sync_does_not_fire() -> None:
    c = Cluster()
    det = TrainerIdleDetector(c.policy)
    res = c.run(400, _trainer_second(0.0, phase="WEIGHT_SYNC"), detector=det)
    assert first_firing(res) is None


def test_trainer_idle_clock_starts_when_train_phase_starts() -> None:
    c = Cluster()
    det = TrainerIdleDetector(c.policy)
    res = c.run(200, _trainer_second(0.0, phase="ROLLOUT"), detector=det)
    res += c.run(250, _trainer_second(0.0, phase="TRAIN"), detector=det)
    assert first_firing(res) is None
    res = c.run(60, _trainer_second(0.0, phase="TRAIN"), detector=det)
    assert first_firing(res) is not None


def test_trainer_busy_on_one_gpu_is_not_idle() -> None:
    c = Cluster()
    det = TrainerIdleDetector(c.policy)

    def second(c: Cluster) -> None:
        c.put("n0", m.GPU_UTILIZATION_RATIO, 0.0, gpu="0")
        c.put("n0", m.GPU_UTILIZATION_RATIO, 0.5, gpu="1")
        c.participant("trainer", 0, "n0")

    assert first_firing(c.run(400, second, detector=det)) is None


# -- rollout stall ----------------------------------------------------------------------------


def test_rollout_waiting_on_tool_does_not_fire() -> None:
    c = Cluster()
    det = RolloutStallDetector(c.policy)

    def waiting(c: Cluster) -> None:
        c.put("n1", m.ROLLOUT_TOKENS_PER_SECOND, 0.0, **P)
        c.participant("rollout", 0, "n1", phase="ROLLOUT")  # heartbeat fresh

    assert first_firing(c.run(300, waiting, detector=det)) is None


def test_rollout_down_fires_after_stall_and_missing_heartbeat() -> None:
    c = Cluster()
    det = RolloutStallDetector(c.policy)

    def alive(c: Cluster) -> None:
        c.put("n1", m.ROLLOUT_TOKENS_PER_SECOND, 900.0, **P)
        c.put("n1", m.GPU_UTILIZATION_RATIO, 0.5, gpu="0")  # the node keeps reporting
        c.participant("rollout", 0, "n1", phase="ROLLOUT")

    c.run(30, alive, detector=det)
    died = c.now

    def dead(c: Cluster) -> None:
        c.put("n1", m.GPU_UTILIZATION_RATIO, 0.0, gpu="0")
        c.participant("rollout", 0, "n1", phase="ROLLOUT", heartbeat=died)

    res = c.run(80, dead, detector=det)
    fired = first_firing(res)
    assert fired is not None and 59 <= fired <= 61
    assert res[fired - 1][0].kind is FaultKind.ROLLOUT_DOWN


def test_rollout_stall_on_a_silent_node_is_left_to_the_node_detector() -> None:
    c = Cluster()
    det = RolloutStallDetector(c.policy)

    def alive(c: Cluster) -> None:
        c.put("n1", m.ROLLOUT_TOKENS_PER_SECOND, 900.0, **P)
        c.participant("rollout", 0, "n1", phase="ROLLOUT")

    c.run(30, alive, detector=det)
    assert first_firing(c.run(120, lambda c: None, detector=det)) is None


# -- heartbeats and nodes ---------------------------------------------------------------------


def test_heartbeat_two_levels_suspected_then_confirmed() -> None:
    c = Cluster()
    det = HeartbeatDetector(c.policy)
    c.participant("trainer", 1, "n0")
    silent_since = c.now

    def node_alive(c: Cluster) -> None:
        c.put("n0", m.GPU_UTILIZATION_RATIO, 0.8, gpu="0")
        c.participant("trainer", 1, "n0", heartbeat=silent_since)

    res = c.run(14, node_alive, detector=det)
    assert first_firing(res) is None and det.suspected == []
    res = c.run(2, node_alive, detector=det)
    assert [p.rank for p in det.suspected] == [1] and first_firing(res) is None
    res = c.run(59, node_alive, detector=det)
    fired = first_firing(res)
    assert fired is not None and c.now - 59 + fired - silent_since == pytest.approx(75, abs=1)
    assert res[fired - 1][0].kind is FaultKind.HEARTBEAT_LOST


def test_heartbeat_missing_20s_then_back_is_cleared() -> None:
    c = Cluster()
    det = HeartbeatDetector(c.policy)
    c.participant("trainer", 1, "n0")
    stuck = c.now
    res = c.run(
        20,
        lambda c: (c.put("n0", "x", 1), c.participant("trainer", 1, "n0", heartbeat=stuck)),
        detector=det,
    )
    assert det.suspected
    res += c.run(
        100, lambda c: (c.put("n0", "x", 1), c.participant("trainer", 1, "n0")), detector=det
    )
    assert first_firing(res) is None and det.suspected == []


def test_finished_participant_is_not_lost() -> None:
    c = Cluster()
    det = HeartbeatDetector(c.policy)
    c.participant("trainer", 1, "n0", phase="DONE")
    stuck = c.now
    res = c.run(
        100,
        lambda c: (
            c.put("n0", "x", 1),
            c.participant("trainer", 1, "n0", phase="DONE", heartbeat=stuck),
        ),
        detector=det,
    )
    assert first_firing(res) is None


def test_exited_participant_is_lost_at_once_and_clears_when_restarted() -> None:
    c = Cluster()
    det = HeartbeatDetector(c.policy)
    c.participant("rollout", 1, "n0", phase="ROLLOUT", step=7)
    exited_at = c.now + 1

    def exited(c: Cluster) -> None:
        c.put("n0", "x", 1)
        c.participant("rollout", 1, "n0", phase="EXITED", step=7, heartbeat=exited_at)

    res = c.run(1, exited, detector=det)
    assert first_firing(res) == 1  # the first tick, not after suspect + confirm
    sig = res[0][0]
    assert sig.kind is FaultKind.HEARTBEAT_LOST and sig.extra == {"exited": True}
    assert sig.since == exited_at and sig.step == 7
    assert sig.subject.to_dict() == {"node": "n0", "job": JOB, "role": "rollout", "rank": 1}
    assert "exited" in sig.evidence.detail
    # Still the same occurrence on later ticks (same since), so one incident.
    assert [s[0].since for s in c.run(3, exited, detector=det)] == [exited_at] * 3
    res = c.run(
        30,
        lambda c: (c.put("n0", "x", 1), c.participant("rollout", 1, "n0", phase="STARTING")),
        detector=det,
    )
    assert first_firing(res) is None


@pytest.mark.parametrize("phase", ["RAY_DEAD", "RAY_RESTARTING"])
def test_ray_dead_or_restarting_actor_is_lost_at_once_with_rays_death_cause(phase: str) -> None:
    c = Cluster()
    det = HeartbeatDetector(c.policy)

    def dead(c: Cluster) -> None:
        c.put("n0", m.RAY_ACTOR_DEAD, 4242, job=JOB, role="rollout", rank="3", reason="WORKER_DIED")
        c.put("n0", m.RAY_ACTOR_DEAD, 77, job=JOB, role="rollout", rank="2", reason="NODE_DIED")
        c.participant("rollout", 3, "n0", phase=phase, step=0)

    res = c.run(1, dead, detector=det)
    assert first_firing(res) == 1
    sig = res[0][0]
    assert sig.kind is FaultKind.HEARTBEAT_LOST and sig.extra == {"exited": True}
    assert sig.subject.rank == 3
    detail = sig.evidence.detail
    assert "Ray death cause WORKER_DIED, pid 4242" in detail and "NODE_DIED" not in detail
    assert phase.removeprefix("RAY_") in detail


def test_exited_participant_on_a_silent_node_is_the_node_detectors() -> None:
    c = Cluster()
    det = HeartbeatDetector(c.policy)
    c.participant("rollout", 1, "n0", phase="EXITED")
    c.now += 20  # the node, exited participant included, went quiet
    res = c.run(1, lambda c: c.put("n1", "x", 1), detector=det)
    assert first_firing(res) is None


def test_node_silent_then_back_within_20s_does_not_fire() -> None:
    c = Cluster()
    det = NodeSilenceDetector(c.policy)
    c.run(10, lambda c: c.put("n1", "x", 1), detector=det)
    res = c.run(20, lambda c: None, detector=det)
    assert det.suspected == ["n1"]
    res += c.run(100, lambda c: c.put("n1", "x", 1), detector=det)
    assert first_firing(res) is None and det.suspected == []


def test_one_silent_node_is_medium_and_several_are_heavy() -> None:
    c = Cluster()
    det = NodeSilenceDetector(c.policy)
    c.participant("rollout", 0, "n1", phase="ROLLOUT")
    c.participant("rollout", 1, "n2", phase="ROLLOUT")
    c.run(
        5, lambda c: (c.put("n1", "x", 1), c.put("n2", "x", 1), c.put("n0", "x", 1)), detector=det
    )
    res = c.run(80, lambda c: (c.put("n2", "x", 1), c.put("n0", "x", 1)), detector=det)
    sigs = res[-1]
    assert [s.kind for s in sigs] == [FaultKind.NODE_SILENT] and sigs[
        0
    ].suggested_tier is Tier.MEDIUM
    res = c.run(80, lambda c: c.put("n0", "x", 1), detector=det)
    sigs = res[-1]
    assert [s.kind for s in sigs] == [FaultKind.NODES_LOST]
    assert sigs[0].suggested_tier is Tier.HEAVY and sigs[0].extra["nodes"] == ["n1", "n2"]


# -- GPU health -------------------------------------------------------------------------------


def test_new_critical_xid_fires_with_code_and_holds_then_clears() -> None:
    c = Cluster()
    det = GpuHealthDetector(c.policy)
    c.run(10, lambda c: c.put("n1", m.GPU_XID_CRITICAL_EVENTS_TOTAL, 0, gpu="0"), detector=det)

    def xid(c: Cluster) -> None:
        c.put("n1", m.GPU_XID_CRITICAL_EVENTS_TOTAL, 1, gpu="0")
        c.put("n1", m.GPU_XID_LAST_CODE, 79, gpu="0")

    res = c.run(1, xid, detector=det)
    assert res[0][0].kind is FaultKind.GPU_XID and res[0][0].extra["xid"] == 79
    res = c.run(130, xid, detector=det)
    assert res[100] and res[-1] == []  # held for event_hold_seconds, then gone


def test_counters_already_nonzero_at_start_are_a_baseline() -> None:
    c = Cluster()
    det = GpuHealthDetector(c.policy)
    res = c.run(30, lambda c: c.put("n0", m.GPU_ECC_UNCORRECTED_TOTAL, 7, gpu="1"), detector=det)
    assert first_firing(res) is None
    res = c.run(1, lambda c: c.put("n0", m.GPU_ECC_UNCORRECTED_TOTAL, 8, gpu="1"), detector=det)
    assert res[0][0].kind is FaultKind.GPU_ECC_UNCORRECTABLE


def test_counter_reset_after_agent_restart_is_not_an_event() -> None:
    c = Cluster()
    det = GpuHealthDetector(c.policy)
    c.run(10, lambda c: c.put("n0", m.GPU_XID_CRITICAL_EVENTS_TOTAL, 3, gpu="0"), detector=det)
    res = c.run(
        10, lambda c: c.put("n0", m.GPU_XID_CRITICAL_EVENTS_TOTAL, 0, gpu="0"), detector=det
    )
    assert first_firing(res) is None


def test_throttling_must_be_sustained() -> None:
    c = Cluster()
    det = GpuHealthDetector(c.policy)
    c.run(5, lambda c: c.put("n1", m.GPU_THROTTLE_THERMAL, 0, gpu="1"), detector=det)
    res = c.run(50, lambda c: c.put("n1", m.GPU_THROTTLE_THERMAL, 1, gpu="1"), detector=det)
    assert first_firing(res) is None
    res = c.run(15, lambda c: c.put("n1", m.GPU_THROTTLE_THERMAL, 1, gpu="1"), detector=det)
    assert res[-1][0].kind is FaultKind.GPU_THROTTLED


def test_row_remap_failure_and_gpu_lost() -> None:
    c = Cluster()
    det = GpuHealthDetector(c.policy)

    def second(c: Cluster) -> None:
        c.put("n2", m.GPU_REMAPPED_ROWS_FAILURE, 1, gpu="0")
        c.put("n2", m.GPU_LOST, 1, gpu="1")

    res = c.run(1, second, detector=det)
    assert sorted(s.kind.value for s in res[0]) == ["gpu_lost", "gpu_row_remap_failure"]
    assert {s.subject.gpu for s in res[0]} == {"0", "1"}


# -- failures reported by the job, storage, drift ---------------------------------------------


def test_step_failure_counts_same_step() -> None:
    c = Cluster()
    det = JobFailureDetector(c.policy)
    t = {"job": JOB, "role": "trainer", "rank": "0"}
    c.run(5, lambda c: c.put("n0", m.TRAIN_STEP_FAILURES_TOTAL, 0, **t), detector=det)

    def fail(n: int):
        def f(c: Cluster) -> None:
            c.put("n0", m.TRAIN_STEP_FAILURES_TOTAL, n, **t)
            c.put("n0", m.TRAIN_LAST_FAILED_STEP, 42, **t)

        return f

    res = c.run(1, fail(1), detector=det)
    assert res[0][0].kind is FaultKind.STEP_FAILED and res[0][0].step == 42
    assert res[0][0].extra["same_step_failures"] == 1
    res = c.run(1, fail(2), detector=det)
    assert res[0][0].extra["same_step_failures"] == 2


def test_state_log_write_errors_mean_storage_unwritable_heavy() -> None:
    c = Cluster()
    det = JobFailureDetector(c.policy)
    t = {"job": JOB, "role": "trainer", "rank": "0"}
    c.run(3, lambda c: c.put("n0", m.STATE_LOG_WRITE_ERRORS_TOTAL, 0, **t), detector=det)
    res = c.run(1, lambda c: c.put("n0", m.STATE_LOG_WRITE_ERRORS_TOTAL, 4, **t), detector=det)
    assert res[0][0].kind is FaultKind.STORAGE_UNWRITABLE and res[0][0].suggested_tier is Tier.HEAVY


def test_checkpoint_write_errors_mean_storage_unwritable_heavy() -> None:
    c = Cluster()
    det = JobFailureDetector(c.policy)
    t = {"job": JOB, "role": "trainer", "rank": "0"}
    c.run(3, lambda c: c.put("n0", m.CHECKPOINT_WRITE_ERRORS_TOTAL, 0, **t), detector=det)
    assert (
        first_firing(
            c.run(3, lambda c: c.put("n0", m.CHECKPOINT_WRITE_ERRORS_TOTAL, 0, **t), detector=det)
        )
        is None
    )  # a steady zero is no fault
    res = c.run(1, lambda c: c.put("n0", m.CHECKPOINT_WRITE_ERRORS_TOTAL, 1, **t), detector=det)
    sig = res[0][0]
    assert sig.kind is FaultKind.STORAGE_UNWRITABLE and sig.suggested_tier is Tier.HEAVY
    assert sig.evidence.metric == m.CHECKPOINT_WRITE_ERRORS_TOTAL
    assert sig.subject.to_dict() == {"node": "n0", "job": JOB, "role": "trainer", "rank": 0}


def test_env_drift_names_the_differing_keys() -> None:
    c = Cluster()
    det = EnvDriftDetector(c.policy)
    c.participant("trainer", 0, "n0")
    c.participant("rollout", 0, "n1")
    c.fingerprints = {
        "n0": {"torch": "2.4.1", "cuda": "12.4", "hostname": "a"},
        "n1": {"torch": "2.4.1", "cuda": "12.4", "hostname": "b"},
    }
    assert det.detect(c.world()) == []  # hostname is ignored
    c.fingerprints["n1"]["torch"] = "2.3.0"
    [sig] = det.detect(c.world())
    assert sig.kind is FaultKind.ENV_DRIFT and sig.extra["differing_keys"] == ["torch"]
    assert "torch=2.3.0" in sig.evidence.detail
