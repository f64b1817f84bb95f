"""Stragglers and an engine dead inside a live worker, end to end on a live server: agent
batches through ``POST /api/v1/ingest`` (the harness's feeder), the server's own policy
scheduler, incidents read back through the REST API. Embedded mode (SQLite): what is under
test is the detectors in the running server, not the database or the broker."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.stack import JOB, Stack, fast_policy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

SUSTAIN = 4  # detection.straggler.sustain_seconds here (120 in policy.yaml)
STALL = 3  # detection.rollout.stall_timeout_seconds here (60 in policy.yaml)


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Stack]:
    # Heartbeats suspect after 10 s and samples stale after 30 s, not the harness's 1.5 s and
    # 5 s: on a loaded machine a feeder batch can come a few seconds late, and these tests are
    # about throughput and pending work, not silence (a late batch must neither drop a peer
    # from the median nor make a stalled rollout's heartbeat look late: rollout_down).
    policy = fast_policy(
        tmp_path / "policy.yaml",
        **{
            "detection.straggler.sustain_seconds": SUSTAIN,
            "detection.rollout.stall_timeout_seconds": STALL,
            "detection.heartbeat.suspect_seconds": 10,
            "detection.heartbeat.confirm_seconds": 10,
            "detection.stale_sample_seconds": 30,
        },
    )
    stack = Stack(
        tmp_path, database_url=f"sqlite:///{tmp_path / 'rlguard.db'}", redis=None, policy=policy
    )
    try:
        yield stack
    finally:
        stack.close()


def _rollout(
    stack: Stack, node: str, rank: int, tokens: float, pending: float | None = None
) -> None:
    stack.feeder.participant(node, "rollout", rank, phase="ROLLOUT")
    labels = {"job": JOB, "role": "rollout", "rank": str(rank)}
    stack.feeder.set(node, "rollout_tokens_per_second", tokens, **labels)
    if pending is not None:
        stack.feeder.set(node, "rollout_pending_count", pending, **labels)


def _incidents(stack: Stack, kind: str) -> dict[int, dict[str, Any]]:
    """Open incidents of ``kind`` by rank, with their detail."""
    return {
        inc["subject"]["rank"]: stack.get(f"/api/v1/incidents/{inc['id']}", stack.viewer)
        for inc in stack.incidents()
        if inc["kind"] == kind and inc["status"] != "resolved"
    }


def _planned(stack: Stack, kind: str, rank: int) -> dict[str, Any] | None:
    inc = _incidents(stack, kind).get(rank)
    return inc if inc is not None and inc["actions"] else None


def test_a_straggler_rollout_gets_a_light_incident_and_its_peers_none(live: Stack) -> None:
    stack = live
    stack.start_server()
    # Five rollouts of one job on two nodes: rank 2 generates a sixth of its peers' tokens.
    for node, rank, tokens in (
        ("n0", 0, 900),
        ("n0", 1, 950),
        ("n0", 2, 150),
        ("n1", 3, 1000),
        ("n1", 4, 880),
    ):
        _rollout(stack, node, rank, tokens)
    stack.feeder.start()

    slow = stack.wait(lambda: _incidents(stack, "straggler").get(2), 60, "rank 2's straggler")
    assert slow["tier"] == "light" and slow["node"] == "n0" and slow["actions"] == []
    extra = slow["evidence"]["extra"]
    assert (
        extra["figure"] == 150 and extra["peers"] == 4 and extra["peer_median"] == 925
    )  # (900 + 950) / 2
    assert "vs its peers' median" in slow["evidence"]["evidence"]["detail"]

    # Rank 4 slows down now: its incident comes at least SUSTAIN later, by which time the
    # fast ranks have been judged for twice the sustain time without one.
    _rollout(stack, "n1", 4, 200)
    stack.wait(lambda: 4 in _incidents(stack, "straggler"), 60, "rank 4's straggler")
    assert sorted(_incidents(stack, "straggler")) == [2, 4]
    assert stack.feeder.errors == []


def test_an_engine_dead_inside_a_live_worker_is_rollout_engine_down_a_tool_wait_is_not(
    live: Stack,
) -> None:
    stack = live
    stack.start_server()
    # Rank 0: no tokens, heartbeat alive, 6 rollouts pending and its step frozen: its engine
    # died inside the worker. Rank 1: no tokens, nothing pending: it waits on a tool.
    _rollout(stack, "n0", 0, 0, pending=6)
    _rollout(stack, "n1", 1, 0, pending=0)
    stack.feeder.start()

    # Waits for the plan too: in embedded mode (SQLite) the incident row can be seen a moment
    # before its timeline and actions (its insert's SAVEPOINT is released, and so committed,
    # ahead of the rest of the tick's transaction: reported with this branch).
    dead = stack.wait(lambda: _planned(stack, "rollout_engine_down", 0), 60, "engine down planned")
    assert dead["tier"] == "medium" and dead["node"] == "n0"
    assert [a["action"] for a in dead["actions"]] == ["restart_role"], json.dumps(dead)
    assert dead["evidence"]["extra"]["reason"] == "no_progress"
    assert "heartbeat is alive" in dead["evidence"]["evidence"]["detail"]

    # The tool wait (sent from the start, like rank 0) is judged on every tick: once the server
    # holds its zero throughput over three stall timeouts, it still has no incident.
    stack.wait(
        lambda: _held_over(stack, "n1", "rollout_tokens_per_second", 3 * STALL),
        60,
        "rank 1's tool wait held over three stall timeouts",
    )
    assert set(_incidents(stack, "rollout_engine_down")) == {0}
    assert not any(i["kind"] == "rollout_down" for i in stack.incidents())
    assert stack.feeder.errors == []


def _held_over(stack: Stack, node: str, name: str, span: float) -> bool:
    """The server holds ``name`` of ``node`` over at least ``span`` seconds."""
    body = stack.get(f"/api/v1/series?node={node}&name={name}&since=0&limit=1000", stack.viewer)
    return any(s["points"] and s["points"][-1][0] - s["points"][0][0] >= span for s in body["data"])
