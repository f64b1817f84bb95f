"""Inhibition on the real stack (server process with the policy tick, a real Celery worker that
sends the alerts, PostgreSQL, a Redis of our own, a local HTTP receiver as the webhook): node n1
is taken out by the scheduler (``slurm_node_unavailable``, the node still reports) and then all
eight of its GPUs report an XID. One alert goes out, the node incident's; the eight per-GPU
incidents are opened (their faults are recorded) but queue no delivery, and the node incident's
timeline names each of them (``inhibits``) as its evidence."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.harness.alerting import delivered, deliveries
from tests.harness.stack import Stack
from tests.unit.app.alerts._recording_server import RecordingServer

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]
GPUS = [str(g) for g in range(8)]
XID = "gpu_xid_critical_events_total"


@pytest.fixture
def inhibit_stack(webhook_stack: Callable[..., Stack]) -> Stack:
    # Eight GPUs of one node failing together are one node_gpus_failed incident
    # (test_node_gpus_failed_e2e.py); this test is about the per-GPU incidents a node-level
    # incident inhibits, so that folding is off here (min_gpus above the node's eight GPUs).
    return webhook_stack(
        **{
            "detection.gpu.correlated.min_gpus": 9,
            "detection.gpu.correlated.settle_seconds": 0,
        }
    )


def test_a_lost_node_with_eight_gpu_faults_sends_one_alert_with_the_gpus_as_evidence(
    inhibit_stack: Stack, server: RecordingServer
) -> None:
    stack = inhibit_stack
    stack.start_server()
    stack.start_worker("--node", "n0", "--node", "n1", "--cluster")
    f = stack.feeder
    f.set("n1", "slurm_node_unavailable", 0)
    for gpu in GPUS:
        f.set("n1", XID, 0, gpu=gpu)
        f.set("n1", "gpu_utilization_ratio", 0.8, gpu=gpu)
    f.start()
    stack.wait_baselines()  # the detectors saw every XID counter at its baseline
    f.set("n1", "slurm_node_unavailable", 1)  # the scheduler takes the node out
    node = stack.wait(lambda: stack.incident("node_unavailable", job=None), 60, "the node incident")
    for gpu in GPUS:
        f.set("n1", "gpu_xid_last_code", 79, gpu=gpu)
        f.set("n1", XID, 1, gpu=gpu)

    def gpu_incidents() -> list[dict[str, Any]] | None:
        found = [i for i in stack.incidents() if i["kind"] == "gpu_xid"]
        return found if len(found) == len(GPUS) else None

    gpu_incs = stack.wait(gpu_incidents, 60, "eight per-GPU incidents")

    def evidence() -> list[dict[str, Any]] | None:
        inc = stack.get(f"/api/v1/incidents/{node['id']}", stack.viewer)
        found = [e for e in inc["timeline"] if e["type"] == "inhibits"]
        return found if len(found) == len(GPUS) else None

    taken = stack.wait(evidence, 30, "eight inhibits entries on the node incident")
    assert sorted(e["detail"]["incident_id"] for e in taken) == sorted(i["id"] for i in gpu_incs)
    assert {e["detail"]["kind"] for e in taken} == {"gpu_xid"}
    for inc in gpu_incs:
        detail = stack.get(f"/api/v1/incidents/{inc['id']}", stack.viewer)
        [why] = [e for e in detail["timeline"] if e["type"] == "inhibited"]
        assert why["detail"]["incident_id"] == node["id"], detail["timeline"]

    # One alert: the node incident's. The per-GPU incidents queued no delivery at all (muted in
    # the incident writer's transaction), so none can go out later; the node's is delivered.
    [alert] = stack.wait(
        lambda: delivered(stack, server), 60, "the node incident's alert at the receiver"
    )
    assert alert["incident_id"] == node["id"] and alert["fault_kind"] == "node_unavailable"
    assert {r.incident_id for r in deliveries(stack)} == {node["id"]}
