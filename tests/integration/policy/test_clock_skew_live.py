"""A node whose clock is 40 s behind, on the real stack (server with the policy tick, embedded
SQLite and broker, a worker): the server moves its stamps onto its own clock, so its rollout
is not judged silent or stalled (with the stamps as sent, its heartbeat would look 40 s old,
past the 45 s less a few seconds the test policy allows once the node has reported a while), and the skew itself is one light
``clock_skew`` incident on the node."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import REPO, kill_group, spawn
from tests.harness.stack import JOB, PY, Stack, fast_policy, on_a_clock_behind
from tests.integration.policy.test_policy_scenarios import _base_cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture
def skew_stack(tmp_path: Path) -> Iterator[Stack]:
    """The embedded stack, with the skew said after 5 s instead of 60 (the test's length)."""
    # A node behind is corrected once three of its batches agree; before that its heartbeats
    # look 40 s old, which the test's usual 3.5 s silence limit would judge lost at once. The
    # shipped limits (75 s) allow far more; 45 s here.
    policy = fast_policy(
        tmp_path / "policy.yaml",
        **{
            "detection.clock.sustain_seconds": 5,
            "detection.heartbeat.suspect_seconds": 15,
            "detection.heartbeat.confirm_seconds": 30,
        },
    )
    stack = Stack(tmp_path, database_url=f"sqlite:///{tmp_path / 'rlguard.db'}", redis=None,
                  policy=policy)  # fmt: skip
    try:
        yield stack
    finally:
        stack.close()


def test_a_node_40_s_behind_is_not_silent_and_its_skew_is_one_light_incident(
    skew_stack: Stack,
) -> None:
    stack = skew_stack
    stack.feeder.clock_behind["n1"] = 40.0  # n1 runs the rollout
    stack.start_server()
    stack.start_worker("--node", "n0", "--node", "n1", "--cluster")
    _base_cluster(stack)
    stack.feeder.start()
    stack.wait_baselines()

    def skew() -> dict[str, Any] | None:
        return stack.incident("clock_skew", job=None)

    inc = stack.wait(skew, 60, "the clock_skew incident (sustained 5 s here)")
    assert inc["node"] == "n1" and inc["tier"] == "light"
    assert "40." in inc["summary"] and "behind" in inc["summary"], inc["summary"]
    # n1's rollout reported all along on a clock 40 s late: nothing else was opened.
    assert [(i["kind"], i["node"]) for i in stack.incidents()] == [("clock_skew", "n1")]
    assert stack.feeder.errors == []


def test_a_real_agent_and_job_on_a_clock_40_s_late_open_only_clock_skew(
    tmp_path: Path,
) -> None:
    """The same with real node agents (and the job's heartbeats written on the node's clock):
    n1's agent and its rollout run 40 s late (tests.harness.wrong_clock), n0's trainer on time. The
    rollout's throughput and heartbeat, stamped 40 s in the past, would be a stalled rollout
    (stall timeout 10 s here) with a silent heartbeat; corrected, n1 is healthy and only
    ``clock_skew`` opens, and stays the only incident while the rollout keeps reporting."""
    policy = fast_policy(
        tmp_path / "policy.yaml",
        **{
            "detection.clock.sustain_seconds": 5,
            "detection.heartbeat.suspect_seconds": 15,
            "detection.heartbeat.confirm_seconds": 30,
            "detection.rollout.stall_timeout_seconds": 10,
        },
    )
    stack = Stack(tmp_path, database_url=f"sqlite:///{tmp_path / 'rlguard.db'}", redis=None,
                  policy=policy)  # fmt: skip
    jobs: list[subprocess.Popen[bytes]] = []
    try:
        stack.start_server()
        for node, role, rank, behind in (("n0", "trainer", 0, None), ("n1", "rollout", 0, 40.0)):
            run_dir = stack.run_root / node / JOB
            run_dir.mkdir(parents=True)
            python = on_a_clock_behind(behind) if behind else [PY]
            jobs.append(spawn([*python, "-m", "tests.integration.policy._job_on_node",
                               str(run_dir), JOB, role, str(rank)], env=stack.env, cwd=REPO,
                              log=tmp_path / f"job-{node}.log"))  # fmt: skip
            stack.start_agent(node, run_dir, clock_behind=behind)

        inc = stack.wait(lambda: stack.incident("clock_skew", job=None), 60,
                         "the clock_skew incident of n1")  # fmt: skip
        assert inc["node"] == "n1" and inc["tier"] == "light"
        assert "behind" in inc["summary"], inc["summary"]
        offsets = stack.get("/api/v1/series?node=n1&name=agent_clock_offset_seconds&since=-120",
                            stack.viewer)["data"]  # fmt: skip
        assert offsets and 39 <= offsets[0]["points"][-1][1] <= 42, offsets
        # A stall timeout and a half (and three times the 5 s of stale samples) more of n1's
        # rollout reporting: still nothing but the skew.
        seen = stack.get("/api/v1/series?node=n1&name=rollout_tokens_per_second&since=-120",
                         stack.viewer)["data"]  # fmt: skip
        assert seen and seen[0]["points"], "the rollout's throughput reached the server"
        until = time.monotonic() + 15
        while time.monotonic() < until:
            got = stack.incidents()
            assert [(i["kind"], i["node"]) for i in got] == [("clock_skew", "n1")], [
                (i["summary"], i["opened_at"]) for i in got
            ]
            time.sleep(1)
    finally:
        for proc in jobs:
            kill_group(proc)
        stack.close()
