"""Start-up grace per role (detection.startup): silence and idleness while starting are not
judged; a participant still STARTING after its grace never sent its first heartbeat."""

from __future__ import annotations

import pytest
import yaml

from app.policy.detectors import (
    HeartbeatDetector,
    InferenceEngineDownDetector,
    RolloutStallDetector,
    TrainerIdleDetector,
)
from app.policy.policy_file import DEFAULT_POLICY_PATH, Policy, parse_policy
from app.policy.replay import replay
from app.policy.signals import FaultKind
from recovery.protocol import metric_names as m
from tests.policy_traces import make_traces

from .._helpers import JOB, Cluster, first_firing

pytestmark = pytest.mark.timeout(30)

P = {"job": JOB, "role": "rollout", "rank": "0"}


def _policy(**grace: float) -> Policy:
    data = yaml.safe_load(DEFAULT_POLICY_PATH.read_text())
    data["detection"]["startup"]["startup_grace_seconds"] = grace
    return parse_policy(data)


# -- heartbeat --------------------------------------------------------------------------------


def test_starting_with_a_stale_heartbeat_is_not_lost_within_its_grace() -> None:
    c = Cluster(_policy(rollout=300, trainer=60))
    det = HeartbeatDetector(c.policy)
    started = c.now

    def starting(c: Cluster) -> None:
        c.put("n1", m.GPU_UTILIZATION_RATIO, 0.0, gpu="0")  # the node reports
        c.participant("rollout", 0, "n1", phase="STARTING", heartbeat=started)

    res = c.run(290, starting, detector=det)
    assert first_firing(res) is None and det.suspected == []


def test_still_starting_after_its_grace_never_sent_its_first_heartbeat() -> None:
    c = Cluster(_policy(rollout=300, trainer=60))
    det = HeartbeatDetector(c.policy)

    def starting(c: Cluster) -> None:  # the launcher keeps the heartbeat fresh
        c.put("n0", m.GPU_UTILIZATION_RATIO, 0.0, gpu="0")
        c.participant("trainer", 0, "n0", phase="STARTING")

    res = c.run(70, starting, detector=det)
    fired = first_firing(res)
    assert fired is not None and 60 <= fired <= 61  # the trainer's grace, not the rollout's
    sig = res[fired - 1][0]
    assert sig.kind is FaultKind.HEARTBEAT_LOST and sig.extra["never_reported"] is True
    assert sig.subject.role == "trainer" and "first heartbeat never came" in sig.evidence.detail


def test_grace_goes_on_after_start_then_silence_is_judged_again() -> None:
    c = Cluster(_policy(rollout=200))
    det = HeartbeatDetector(c.policy)
    c.run(10, lambda c: c.participant("rollout", 0, "n1", phase="STARTING"), detector=det)
    reported = c.now

    def compiling(c: Cluster) -> None:  # reported once, then silent while it compiles
        c.put("n1", m.GPU_UTILIZATION_RATIO, 0.9, gpu="0")
        c.participant("rollout", 0, "n1", phase="ROLLOUT", heartbeat=reported)

    res = c.run(185, compiling, detector=det)
    assert first_firing(res) is None
    res = c.run(10, compiling, detector=det)  # grace over (200 s after it was first seen)
    fired = first_firing(res)
    assert fired is not None and fired <= 7
    assert res[fired - 1][0].kind is FaultKind.HEARTBEAT_LOST


def test_a_step_done_ends_the_grace_and_a_hang_after_it_is_judged_at_once() -> None:
    c = Cluster(_policy(trainer=200))
    det = HeartbeatDetector(c.policy)
    c.run(5, lambda c: c.participant("trainer", 0, "n1", phase="STARTING", step=0), detector=det)
    c.run(5, lambda c: c.participant("trainer", 0, "n1", phase="TRAIN", step=3), detector=det)
    c.run(5, lambda c: c.participant("trainer", 0, "n1", phase="TRAIN", step=4), detector=det)
    hung = c.now

    def stopped(c: Cluster) -> None:  # its last heartbeat, 15 s into a 200 s grace
        c.put("n1", m.GPU_UTILIZATION_RATIO, 0.9, gpu="0")
        c.participant("trainer", 0, "n1", phase="TRAIN", step=4, heartbeat=hung)

    res = c.run(120, stopped, detector=det)
    fired = first_firing(res)
    # the heartbeat's own windows (suspect 15 s + confirm 60 s), not the grace's 185 s left
    assert fired is not None and fired <= 80
    assert res[fired - 1][0].kind is FaultKind.HEARTBEAT_LOST


def test_exit_while_starting_is_lost_at_once() -> None:
    c = Cluster()
    det = HeartbeatDetector(c.policy)
    c.run(5, lambda c: c.participant("rollout", 0, "n1", phase="STARTING"), detector=det)
    exited_at = c.now

    def exited(c: Cluster) -> None:
        c.put("n1", m.GPU_UTILIZATION_RATIO, 0.0, gpu="0")
        c.participant("rollout", 0, "n1", phase="EXITED", heartbeat=exited_at)

    res = c.run(2, exited, detector=det)
    assert first_firing(res) == 1 and res[0][0].extra["exited"] is True


def test_a_restart_starts_a_new_grace() -> None:
    c = Cluster(_policy(rollout=100))
    det = HeartbeatDetector(c.policy)
    res = c.run(80, lambda c: c.participant("rollout", 0, "n1", phase="STARTING"), detector=det)
    res += c.run(20, lambda c: c.participant("rollout", 0, "n1", phase="ROLLOUT"), detector=det)
    res += c.run(80, lambda c: c.participant("rollout", 0, "n1", phase="STARTING"), detector=det)
    assert first_firing(res) is None
    res = c.run(25, lambda c: c.participant("rollout", 0, "n1", phase="STARTING"), detector=det)
    assert first_firing(res) is not None


def test_no_participant_starting_behaves_as_before() -> None:
    c = Cluster()
    det = HeartbeatDetector(c.policy)
    c.participant("trainer", 1, "n0")
    silent = c.now

    def node_alive(c: Cluster) -> None:
        c.put("n0", m.GPU_UTILIZATION_RATIO, 0.8, gpu="0")
        c.participant("trainer", 1, "n0", heartbeat=silent)

    fired = first_firing(c.run(80, node_alive, detector=det))
    assert fired is not None and 74 <= fired <= 76  # suspect 15 s + confirm 60 s


# -- trainer idle, rollout stall, engine down -------------------------------------------------


def test_trainer_idle_not_judged_within_its_grace() -> None:
    c = Cluster(_policy(trainer=400))
    det = TrainerIdleDetector(c.policy)
    c.run(1, lambda c: c.participant("trainer", 0, "n0", phase="STARTING"), detector=det)

    def compiling(c: Cluster) -> None:
        for gpu in ("0", "1"):
            c.put("n0", m.GPU_UTILIZATION_RATIO, 0.0, gpu=gpu)
        c.participant("trainer", 0, "n0", phase="TRAIN")

    assert first_firing(c.run(390, compiling, detector=det)) is None
    res = c.run(20, compiling, detector=det)
    assert first_firing(res) is not None and res[-1][0].kind is FaultKind.TRAINER_IDLE


def test_rollout_stall_not_judged_within_its_grace() -> None:
    c = Cluster(_policy(rollout=300))
    det = RolloutStallDetector(c.policy)
    c.run(1, lambda c: c.participant("rollout", 0, "n1", phase="STARTING"), detector=det)
    reported = c.now

    def loading(c: Cluster) -> None:  # no tokens, heartbeat silent, node reporting
        c.put("n1", m.ROLLOUT_TOKENS_PER_SECOND, 0.0, **P)
        c.participant("rollout", 0, "n1", phase="ROLLOUT", heartbeat=reported)

    assert first_firing(c.run(290, loading, detector=det)) is None
    res = c.run(15, loading, detector=det)
    assert first_firing(res) is not None and res[-1][0].kind is FaultKind.ROLLOUT_DOWN


def test_engine_health_probe_not_judged_within_its_grace() -> None:
    c = Cluster(_policy(rollout=300))
    det = InferenceEngineDownDetector(c.policy)
    c.run(1, lambda c: c.participant("rollout", 0, "n1", phase="STARTING"), detector=det)

    def loading(c: Cluster) -> None:  # /health does not answer while weights load
        c.put("n1", m.ROLLOUT_ENGINE_UP, 0.0, engine="vllm", **P)
        c.participant("rollout", 0, "n1", phase="STARTING")

    assert first_firing(c.run(290, loading, detector=det)) is None
    # grace over and still STARTING: the heartbeat detector's case, not the engine's
    assert first_firing(c.run(20, loading, detector=det)) is None

    def up_then_down(c: Cluster) -> None:
        c.put("n1", m.ROLLOUT_ENGINE_UP, 0.0, engine="vllm", **P)
        c.participant("rollout", 0, "n1", phase="ROLLOUT")

    res = c.run(40, up_then_down, detector=det)
    assert first_firing(res) is not None and res[-1][0].kind is FaultKind.ROLLOUT_ENGINE_DOWN


# -- the corpus cases, replayed ---------------------------------------------------------------


def test_slow_start_trace_is_quiet_only_thanks_to_the_grace() -> None:
    data = yaml.safe_load(DEFAULT_POLICY_PATH.read_text())
    data["detection"]["startup"]["phases"] = []  # no start-up phase: no grace at all
    without = parse_policy(data)
    sim, expect, _ = make_traces.slow_start(0)
    batches = make_traces.simulate(sim)
    assert expect == [] and replay(batches).opened == []
    assert [d.kind for d in replay(batches, policy=without).opened] == [FaultKind.HEARTBEAT_LOST]


def test_flapping_rollout_is_one_heartbeat_lost_incident() -> None:
    sim, expect, _ = make_traces.flapping(0)
    opened = replay(make_traces.simulate(sim)).opened
    assert [(d.kind, d.subject.role, d.subject.rank) for d in opened] == [
        (FaultKind.HEARTBEAT_LOST, "rollout", 0)
    ]
    assert opened[0].at - expect[0]["start"] <= 2
