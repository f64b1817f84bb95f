from __future__ import annotations

from pathlib import Path

import pytest

from recovery.checkpoint.engine import CheckpointEngine
from recovery.checkpoint.errors import CheckpointInputError, RestoreError
from recovery.checkpoint.restore import (
    WeightSyncPlanner,
    buffer_freshness,
    restore,
    wait_until_weights_live,
)
from recovery.checkpoint.version import Ordering, VersionVector
from recovery.errors import RecoveryTimeout
from tests.harness.training_state import assert_same, small_training_state

pytestmark = pytest.mark.timeout(60)
V = VersionVector


@pytest.fixture
def eng(tmp_path: Path) -> CheckpointEngine:
    e = CheckpointEngine(tmp_path, keep=5)
    yield e
    e.close()


def test_plan_rolls_back_ahead_restores_behind(eng: CheckpointEngine) -> None:
    state = {**small_training_state(), "kv_cache": [1], "dataloader_position": 7}
    eng.save(state, version=V(50, 10)).wait(30)
    result = restore(
        eng,
        participants={
            "trainer": V(57, 12),
            "rollout-0": V(50, 10),
            "rollout-1": V(45, 9),
            "buffer": V(52, 9),
        },
        extra_transient=["prefetch"],
    )
    assert result.target == V(50, 10)
    assert {p.name: p.action for p in result.participants} == {
        "trainer": "rollback",
        "rollout-0": "keep",
        "rollout-1": "restore",
        "buffer": "restore",
    }
    assert [p.relation for p in result.participants if p.name == "buffer"] == [Ordering.CONCURRENT]
    assert result.action_for("trainer") == "rollback"
    assert result.transient_to_clear == (
        "dataloader_position", "kv_cache", "prefetch", "request_queue",
    )  # fmt: skip
    expected = {k: v for k, v in state.items() if k not in ("kv_cache", "dataloader_position")}
    assert_same(expected, result.state)


def test_checkpoint_from_an_uncommitted_round_is_skipped(eng: CheckpointEngine) -> None:
    state = small_training_state()
    eng.save({**state, "step": 50}, version=V(50, 10)).wait(30)
    eng.save({**state, "step": 100}, version=V(100, 20)).wait(30)  # its round aborted later
    result = restore(eng, participants={"trainer": V(100, 20)}, committed_version=V(50, 10))
    assert result.target == V(50, 10) and result.state["step"] == 50
    assert "never committed" in result.skipped[0].reason
    assert result.action_for("trainer") == "rollback"


def test_no_valid_checkpoint_names_the_reasons(eng: CheckpointEngine) -> None:
    with pytest.raises(RestoreError, match="none saved"):
        restore(eng, participants={})
    info = eng.save(small_training_state(), version=V(1, 1)).wait(30)
    (info.path / "core.bin").write_bytes(b"garbage")
    with pytest.raises(RestoreError, match="core.bin is 7 bytes"):
        restore(eng, participants={})


def test_bad_participant_version(eng: CheckpointEngine) -> None:
    with pytest.raises(CheckpointInputError, match="'trainer'"):
        restore(eng, participants={"trainer": (1, 2)})  # type: ignore[dict-item]


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_trainer_held_until_every_rollout_serves_restored_weights() -> None:
    t = FakeTime()
    reports = [
        {"r0": V(40, 8), "r1": V(60, 12)},  # r1 still on rolled-back weights
        {"r0": V(50, 10)},
        {"r0": V(50, 10), "r1": V(50, 10)},
    ]
    calls = iter(reports)
    got = wait_until_weights_live(
        lambda: next(calls), 10, expected=["r0", "r1"], timeout=5, clock=t.clock, sleep=t.sleep
    )
    assert set(got) == {"r0", "r1"}
    assert t.now == pytest.approx(0.2)


def test_weights_not_live_times_out_naming_rollouts() -> None:
    t = FakeTime()
    with pytest.raises(RecoveryTimeout, match=r"'r1': 9"):
        wait_until_weights_live(
            lambda: {"r0": V(50, 10), "r1": V(45, 9)}, 10, expected=["r0", "r1"],
            timeout=1, clock=t.clock, sleep=t.sleep,
        )  # fmt: skip
    with pytest.raises(CheckpointInputError):
        wait_until_weights_live(lambda: {}, 1, expected=[], timeout=1)


def test_first_sync_after_recovery_is_full() -> None:
    planner = WeightSyncPlanner()
    assert [planner.next_sync() for _ in range(3)] == ["full", "incremental", "incremental"]
    planner.after_recovery()
    assert planner.next_sync() == "full"


def test_buffer_freshness_drop_above_threshold() -> None:
    # 4 of 10 samples (40 %) come from versions older than 10; one from the rolled-back 11.
    versions = [10, 10, 10, 10, 10, 8, 7, 9, 9, 11]
    d = buffer_freshness(versions, current_version=10)
    assert d.action == "drop" and d.stale == 4 and d.from_future == 1
    assert d.stale_fraction == pytest.approx(0.4)
    assert d.kept == [0, 1, 2, 3, 4]


def test_buffer_freshness_downweight_and_below_threshold() -> None:
    versions = [10, 10, 10, 10, 10, 8, 7, 9, 9, 10]
    d = buffer_freshness(versions, current_version=10, mode="downweight", stale_weight=0.25)
    assert d.action == "downweight"
    assert d.weights == (1, 1, 1, 1, 1, 0.25, 0.25, 0.25, 0.25, 1)
    few = buffer_freshness([10, 10, 10, 9], current_version=10)  # 25 % stale: kept
    assert few.action == "keep" and few.weights == (1, 1, 1, 1)
    lag = buffer_freshness([8, 9, 10], current_version=10, max_lag=2)
    assert lag.stale == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"threshold": 1.5}, "threshold"),
        ({"mode": "ignore"}, "mode"),
        ({"stale_weight": 0}, "stale_weight"),
        ({"max_lag": -1}, "max_lag"),
    ],
)
def test_buffer_freshness_bad_input(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(CheckpointInputError, match=message):
        buffer_freshness([1], current_version=1, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(CheckpointInputError, match="non-negative ints"):
        buffer_freshness([1, -1], current_version=1)
