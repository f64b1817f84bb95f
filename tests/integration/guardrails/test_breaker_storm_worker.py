"""A storm of faults on five nodes on the real stack (server with the policy tick, a real Celery
worker on PostgreSQL + Redis, the fake launcher): the job's breaker (max_nodes 3 in the policy
file the Stack writes) lets three restarts through, the fourth node trips it (one heavy
incident, ``breaker_tripped`` on its timeline), the fifth is not run at all, and the launcher's
count of executed restarts stops there until an approver resets the breaker through the REST
API; after the reset the next fault is restarted again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session

from app.auth.tokens import create_node_token
from tests.harness import RedisServer
from tests.harness.stack import JOB, Stack, fast_policy
from tests.integration.policy.test_policy_scenarios import _base_cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]

NODES = ("n0", "n1", "n2", "n3", "n4")
# One rollout rank per node (rank 10 on n0, whose trainers _base_cluster already feeds).
RANKS = [(node, JOB, "rollout", 10 if node == "n0" else i) for i, node in enumerate(NODES)]
JOB_BREAKER = {"max_actions": 20, "max_nodes": 3, "window_seconds": 600}


def add_nodes(stack: Stack, *nodes: str) -> None:
    """Node tokens for the nodes the Stack does not register itself (it has n0 and n1)."""
    with Session(stack.engine) as s:
        for node in nodes:
            if node not in stack.node_tokens:
                stack.node_tokens[node] = create_node_token(s, node=node, actor="test")[1]
        s.commit()


def restarts_done(stack: Stack) -> int:
    return sum(
        1 for c in stack.launcher_calls() if c["action"] == "restart_role" and c["event"] == "done"
    )


def restart_calls(stack: Stack) -> int:
    """Every launcher call for a restart, started or finished."""
    return sum(1 for c in stack.launcher_calls() if c["action"] == "restart_role")


def incident_on(stack: Stack, node: str, status: str = "open") -> dict[str, Any] | None:
    for inc in stack.incidents(status=status):
        if inc["kind"] == "heartbeat_lost" and inc["job"] == JOB and inc["node"] == node:
            return stack.get(f"/api/v1/incidents/{inc['id']}", stack.viewer)
    return None


def events(inc: dict[str, Any], type_: str) -> list[dict[str, Any]]:
    return [e for e in inc["timeline"] if e["type"] == type_]


@pytest.fixture
def storm_stack(
    request: pytest.FixtureRequest, tmp_path: Path, postgres_url: str, own_redis: RedisServer
) -> Iterator[Stack]:
    """The limit on the job's breaker, or (``indirect`` param "cluster") on the cluster's with
    the job's out of reach."""
    scope = getattr(request, "param", "job")
    limits = (
        {"guardrails.job_breaker": JOB_BREAKER}
        if scope == "job"
        else {"guardrails.job_breaker": {**JOB_BREAKER, "max_nodes": 50, "max_actions": 50},
              "guardrails.cluster_breaker": JOB_BREAKER}
    )  # fmt: skip
    policy = fast_policy(tmp_path / "policy.yaml", **limits)
    s = Stack(tmp_path, database_url=postgres_url, redis=own_redis, policy=policy)
    try:
        yield s
    finally:
        s.close()


def restart_and_recover(stack: Stack, rank: tuple[str, str, str, int], n: int) -> None:
    """Freeze ``rank``'s heartbeat, wait for the n-th executed restart, bring it back."""
    stack.feeder.freeze_heartbeat(*rank)
    stack.wait(lambda: restarts_done(stack) == n, 60, f"automatic restart {n} on {rank[0]}")
    stack.feeder.thaw_heartbeat(*rank)
    stack.wait(lambda: incident_on(stack, rank[0]) is None, 60, f"incident on {rank[0]} resolved")


@pytest.mark.timeout(300)
def test_a_storm_on_five_nodes_trips_the_job_breaker_until_an_approver_resets_it(
    storm_stack: Stack,
) -> None:
    stack = storm_stack
    add_nodes(stack, *NODES)
    stack.start_server()
    stack.start_worker(*[a for node in NODES for a in ("--node", node)], "--cluster")
    _base_cluster(stack)
    for node, job, role, rank in RANKS:
        stack.feeder.participant(node, role, rank, job=job, phase="ROLLOUT")
        stack.feeder.set(node, "gpu_utilization_ratio", 0.8, gpu="0")
    stack.feeder.start()
    stack.wait_baselines()
    for n, rank in enumerate(RANKS[:3], start=1):  # three nodes: within the breaker's limits
        restart_and_recover(stack, rank, n)

    # The fourth node takes the job's automation over three nodes in the window: it trips.
    stack.feeder.freeze_heartbeat(*RANKS[3])

    def tripped() -> dict[str, Any] | None:
        inc = incident_on(stack, "n3")
        return inc if inc is not None and inc["tier"] == "heavy" else None

    inc = stack.wait(tripped, 60, "the fourth node's incident to trip the breaker")
    [trip] = events(inc, "breaker_tripped")
    assert trip["detail"]["breaker"] == f"job:{JOB}"
    assert trip["detail"]["reason"] == (
        f"not run: circuit breaker job:{JOB} tripped, automatic actions on 4 nodes in 10 min "
        "(limit 3); automation stops for it until an approver resets it"
    )
    [restart] = [a for a in inc["actions"] if a["action"] == "restart_role"]
    assert restart["status"] == "pending_approval"
    [brk] = [b for b in stack.get("/api/v1/breakers", stack.viewer) if b["scope"] == f"job:{JOB}"]
    assert brk["open"] is True and brk["incident_id"] == inc["id"]

    # The fifth node: the open breaker blocks its restart (no row written, nothing to send).
    stack.feeder.freeze_heartbeat(*RANKS[4])

    def blocked() -> dict[str, Any] | None:
        inc5 = incident_on(stack, "n4")
        return inc5 if inc5 is not None and events(inc5, "action_not_run") else None

    inc5 = stack.wait(blocked, 60, "the fifth node's restart to be blocked")
    assert inc5["actions"] == [] and inc5["tier"] != "heavy"
    [not_run] = events(inc5, "action_not_run")
    assert not_run["detail"]["reason"].startswith(f"not run: circuit breaker job:{JOB} open since")
    # Exactly one heavy incident says why: the one that tripped the breaker.
    heavy = [i for i in stack.incidents() if i["tier"] == "heavy"]
    assert [i["id"] for i in heavy] == [inc["id"]]
    # Nothing more ran: the launcher saw the three restarts only (start + done each), and the
    # worker and dispatcher had every chance to send more (the fifth incident's verdict was
    # committed after the trip; the dispatcher runs every 0.5 s).
    assert restarts_done(stack) == 3 and restart_calls(stack) == 6

    # An approver resets the breaker through the REST API; a viewer may not.
    r = stack.post(f"/api/v1/breakers/job:{JOB}/reset", stack.viewer, json={"comment": "x"})
    assert r.status_code == 403, r.text
    assert restart_calls(stack) == 6
    r = stack.post(f"/api/v1/breakers/job:{JOB}/reset", json={"comment": "storage is back"})
    assert r.status_code == 200 and r.json()["open"] is False, r.text
    # After the reset automation acts again: n4 recovers, fails again, and is restarted.
    stack.feeder.thaw_heartbeat(*RANKS[4])
    stack.wait(lambda: incident_on(stack, "n4") is None, 60, "the blocked incident resolved")
    restart_and_recover(stack, RANKS[4], 4)
    assert [b["open"] for b in stack.get("/api/v1/breakers", stack.viewer)] == [False]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("storm_stack", ["job", "cluster"], indirect=True)
def test_five_nodes_failing_at_once_trip_the_breaker_after_three_restarts(
    storm_stack: Stack, request: pytest.FixtureRequest
) -> None:
    """The same storm at once: the incidents may open in one policy tick, so the gate must see
    the restarts of the incidents written before in that tick (same transaction). Once with the
    job's breaker, once with the cluster's (the job's limits out of reach)."""
    stack = storm_stack
    add_nodes(stack, *NODES)
    stack.start_server()
    stack.start_worker(*[a for node in NODES for a in ("--node", node)], "--cluster")
    _base_cluster(stack)
    for node, job, role, rank in RANKS:
        stack.feeder.participant(node, role, rank, job=job, phase="ROLLOUT")
    stack.feeder.start()
    stack.wait_baselines()
    for rank in RANKS:
        stack.feeder.freeze_heartbeat(*rank)

    def judged() -> list[dict[str, Any]] | None:
        incs = [incident_on(stack, node) for node in NODES]
        if any(i is None for i in incs):
            return None
        ok = all(i["actions"] or events(i, "action_not_run") for i in incs if i is not None)
        return [i for i in incs if i is not None] if ok else None

    incs = stack.wait(judged, 90, "every node's incident to be judged")
    automatic = [
        a for i in incs for a in i["actions"]
        if a["action"] == "restart_role" and a["status"] != "pending_approval"
    ]  # fmt: skip
    assert len(automatic) == 3, [(i["node"], i["actions"], i["timeline"]) for i in incs]
    tripped = [i for i in incs if events(i, "breaker_tripped")]
    assert len(tripped) == 1 and tripped[0]["tier"] == "heavy"
    assert [i["id"] for i in stack.incidents() if i["tier"] == "heavy"] == [tripped[0]["id"]]
    blocked = [i for i in incs if events(i, "action_not_run")]
    assert len(blocked) == 1 and blocked[0]["actions"] == []
    # Every row is written: the three automatic restarts run, and nothing after them.
    stack.wait(lambda: restarts_done(stack) == 3, 60, "the three automatic restarts")
    assert restart_calls(stack) == 6
    tripped_scope = (
        f"job:{JOB}" if request.node.callspec.params["storm_stack"] == "job" else "cluster"
    )
    breakers = stack.get("/api/v1/breakers", stack.viewer)
    assert [(b["scope"], b["open"], b["incident_id"]) for b in breakers] == [
        (tripped_scope, True, tripped[0]["id"])
    ]
