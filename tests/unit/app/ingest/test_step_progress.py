from __future__ import annotations

from app.ingest.step_progress import StepChange, StepTracker


def test_only_rank_0_changes_are_recorded_and_late_replays_are_ignored() -> None:
    t = StepTracker()
    t.seed([("j", "trainer", 4, 100.0)])
    assert t.observe("j", "trainer", 0, 4, 101.0) is None  # same step as seeded
    assert t.observe("j", "trainer", 1, 5, 102.0) is None  # rank 1 does not speak for the role
    assert t.observe("j", "trainer", 0, 5, 103.0) == StepChange("j", "trainer", 0, 5, 103.0)
    assert t.observe("j", "trainer", 0, 3, 102.5) is None  # a late replay
    # A restore to an older checkpoint is a change like any other.
    assert t.observe("j", "trainer", 0, 2, 110.0) == StepChange("j", "trainer", 0, 2, 110.0)
    assert t.observe("j", "rollout", 0, 7, 90.0) == StepChange("j", "rollout", 0, 7, 90.0)


def test_a_process_still_starting_has_no_step_to_record() -> None:
    # A restarted trainer: the launcher vouches for it (STARTING), then it reports INIT before
    # it resumed; the agent sends step 0 for both. Only its resumed step is a change.
    t = StepTracker()
    assert t.observe("j", "trainer", 0, 20, 100.0, phase="TRAIN") is not None
    assert t.observe("j", "trainer", 0, 0, 101.0, phase="STARTING") is None
    assert t.observe("j", "trainer", 0, 0, 105.0, phase="INIT") is None
    assert t.observe("j", "trainer", 0, 18, 110.0, phase="TRAIN") == StepChange(
        "j", "trainer", 0, 18, 110.0
    )
