"""A baseboard loss on the real stack (server process with the policy tick, a real Celery worker
that sends the alerts, PostgreSQL, a Redis of our own, a local HTTP receiver as the webhook):
every one of node n1's eight GPUs reports XID 79 and falls off the bus, as the agent reports it
(the per-code XID counter, the critical-XID counter and newest code, ``gpu_lost``). That is one
incident, ``node_gpus_failed``, with the eight GPUs and their XIDs as its evidence, and one
alert; before issue 21 it was sixteen incidents (a ``gpu_xid`` and a ``gpu_lost`` per GPU)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.harness.alerting import delivered, deliveries
from tests.harness.stack import Stack
from tests.unit.app.alerts._recording_server import RecordingServer

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]
GPUS = [str(g) for g in range(8)]


def test_xid_79_on_all_eight_gpus_of_a_node_is_one_incident_and_one_alert(
    webhook_stack: Callable[..., Stack], server: RecordingServer
) -> None:
    stack = webhook_stack()  # the shipped correlation rule: every GPU the node reports
    stack.start_server()
    stack.start_worker("--node", "n1", "--cluster")
    f = stack.feeder
    for gpu in GPUS:
        f.set("n1", "gpu_utilization_ratio", 0.8, gpu=gpu)
        f.set("n1", "gpu_lost", 0, gpu=gpu)
        f.set("n1", "gpu_xid_critical_events_total", 0, gpu=gpu)
    f.start()
    stack.wait_baselines()  # the detectors saw every GPU and XID counter at its baseline
    for gpu in GPUS:  # one GPU after the other: a batch may go out half way through
        f.set("n1", "gpu_xid_events_total", 1, gpu=gpu, xid="79")
        f.set("n1", "gpu_xid_critical_events_total", 1, gpu=gpu)
        f.set("n1", "gpu_xid_last_code", 79, gpu=gpu)
        f.set("n1", "gpu_lost", 1, gpu=gpu)

    node = stack.wait(
        lambda: stack.incident("node_gpus_failed", job=None), 60, "the node_gpus_failed incident"
    )
    [alert] = stack.wait(lambda: delivered(stack, server), 60, "its alert at the receiver")

    # Exactly one incident: no per-GPU gpu_xid or gpu_lost opened beside it, before or after
    # the alert went out (the per-GPU signals are its evidence).
    incidents = stack.incidents()
    assert [(i["id"], i["kind"]) for i in incidents] == [(node["id"], "node_gpus_failed")]
    assert node["tier"] == "heavy" and node["node"] == "n1"
    extra: dict[str, Any] = node["evidence"]["extra"]
    assert extra["gpus"] == GPUS and extra["lost"] == GPUS
    assert extra["xids"] == {g: [79] for g in GPUS}
    assert "8 of 8 GPUs of n1 failed" in node["evidence"]["evidence"]["detail"]
    assert sorted(r["subject"]["gpu"] for r in node["evidence"]["related"]) == GPUS

    # Exactly one alert, the node incident's.
    assert alert["incident_id"] == node["id"] and alert["fault_kind"] == "node_gpus_failed"
    assert {r.incident_id for r in deliveries(stack)} == {node["id"]}
    assert not f.errors, f.errors
