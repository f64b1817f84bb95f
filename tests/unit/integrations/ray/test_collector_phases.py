"""The collector's phases and samples for one snapshot, and its refusal of an old snapshot."""

from __future__ import annotations

from integrations.ray.collector import RayCollector
from integrations.ray.presets import load_preset
from integrations.ray.state import (
    ActorRecord,
    ClusterSnapshot,
    JobRecord,
    NodeRecord,
    RayUnavailable,
)


def rec(
    aid: str, name: str, state: str, reason: str | None = None, job: str = "01000000"
) -> ActorRecord:
    return ActorRecord(aid, "vLLMHttpServer", state, job, name, "n1", 7, 1, reason, "msg")


SNAP = ClusterSnapshot(
    actors=(
        rec("a", "vllm_server_0_0", "ALIVE"),
        rec("b", "vllm_server_1_0", "RESTARTING", "WORKER_DIED"),
        rec("c", "vllm_server_2_0", "DEAD", "NODE_DIED"),
        rec("d", "vllm_server_3_0", "DEAD", "OUT_OF_SCOPE"),
        rec("e", "vllm_server_4_0", "PENDING_CREATION"),
        rec("g", "vllm_server_5_0", "DEAD", "RAY_KILL"),
        rec("f", "vllm_server_0_0", "DEAD", "OWNER_DIED", job="09000000"),
    ),
    nodes=(
        NodeRecord("n1", "10.0.0.1", "ALIVE", True),
        NodeRecord("n2", "10.0.0.2", "DEAD", False),
    ),
    jobs=(
        JobRecord("01000000", None, "RUNNING", "", {}),
        JobRecord("09000000", "old", "SUCCEEDED", "", {"rlguard_job": "done-job"}),
    ),
)


def test_phases_say_what_ray_says() -> None:
    collector = RayCollector(load_preset("verl"), job_name=None)
    samples, participants = collector.from_snapshot(SNAP, 100.0)
    phases = {(p.job, p.rank): p.phase for p in participants}
    assert phases == {
        ("ray-01000000", 0): "RUNNING",
        ("ray-01000000", 1): "RAY_RESTARTING",
        ("ray-01000000", 2): "RAY_DEAD",
        ("ray-01000000", 3): "DONE",  # released on purpose
        ("ray-01000000", 4): "STARTING",
        ("ray-01000000", 5): "DONE",  # ray.kill(no_restart=True): ended on purpose
        ("done-job", 0): "DONE",  # its job finished
    }
    dead = {
        s["labels"]["rank"]: s["labels"]["reason"] for s in samples if s["name"] == "ray_actor_dead"
    }
    assert dead == {"1": "WORKER_DIED", "2": "NODE_DIED"}
    nodes = {s["labels"]["ray_node"]: s["value"] for s in samples if s["name"] == "ray_node_alive"}
    assert nodes == {"10.0.0.1": 1.0, "10.0.0.2": 0.0}


def test_an_old_snapshot_sends_no_participants() -> None:
    now = [1000.0]
    collector = RayCollector(
        load_preset("verl"), reader=lambda: SNAP, clock=lambda: now[0], interval=1
    )
    assert collector.poll_once()
    assert len(collector.collect()[1]) == 7
    now[0] += collector.max_age + 1
    samples, participants = collector.collect()
    assert participants == [] and samples[0]["name"] == "ray_collector_up"


def test_nothing_is_said_of_ray_before_the_first_read_has_finished() -> None:
    answers: list[ClusterSnapshot] = []

    def reader() -> ClusterSnapshot:
        if not answers:
            raise RayUnavailable("Ray at auto did not answer: refused")
        return answers[0]

    collector = RayCollector(load_preset("verl"), reader=reader, clock=lambda: 1000.0, interval=1)
    assert collector.collect() == ([], [])  # not "up": nothing is known yet
    assert collector.poll_once() is False
    samples, participants = collector.collect()
    assert [(s["name"], s["value"]) for s in samples] == [("ray_collector_up", 0.0)]
    answers.append(SNAP)
    assert collector.poll_once() is True
    samples, participants = collector.collect()
    assert samples[0]["name"] == "ray_collector_up" and samples[0]["value"] == 1.0
    assert len(participants) == 7
