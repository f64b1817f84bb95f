"""Correlated GPU faults: several GPUs of one node failing together are one node-level incident
(``node_gpus_failed``) with the GPUs as its evidence; single faults far apart stay per GPU."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
import yaml

from app.policy.engine import DecisionType, IncidentDecision, PolicyEngine
from app.policy.plans import ActionName
from app.policy.policy_file import DEFAULT_POLICY_PATH, Policy, PolicyFileError, parse_policy
from app.policy.signals import FaultKind, Subject, Tier
from recovery.protocol import metric_names as m

from ._helpers import JOB, Cluster

pytestmark = pytest.mark.timeout(60)

GPUS = [str(g) for g in range(8)]


def _policy(**correlated: object) -> Policy:
    data = yaml.safe_load(DEFAULT_POLICY_PATH.read_text())
    data["detection"]["gpu"]["correlated"].update(correlated)
    return parse_policy(data)


class Node:
    """Node n1 with eight GPUs and one rollout; ``fail`` makes a GPU report an XID (and, for
    79, fall off the bus a second later), as the agent does."""

    def __init__(self, policy: Policy | None = None) -> None:
        self.c = Cluster(policy)
        self.e = PolicyEngine(self.c.policy)
        self.xids: dict[str, int] = {}
        self.lost: dict[str, float] = {}

    def feed(self, c: Cluster) -> None:
        c.participant("rollout", 0, "n1", phase="ROLLOUT", step=20)
        c.put("n1", m.ROLLOUT_TOKENS_PER_SECOND, 1000, job=JOB, role="rollout", rank="0")
        for g in GPUS:
            c.put("n1", m.GPU_LOST, 1 if c.now >= self.lost.get(g, float("inf")) else 0, gpu=g)
            c.put("n1", m.GPU_XID_CRITICAL_EVENTS_TOTAL, 0, gpu=g)
            if g in self.xids:
                c.put("n1", m.GPU_XID_EVENTS_TOTAL, 1, gpu=g, xid=str(self.xids[g]))

    def fail(self, gpus: Iterable[str], code: int = 79) -> None:
        for g in gpus:
            self.xids[g] = code
            if code == 79:
                self.lost[g] = self.c.now + 2  # the next second's sample already says lost

    def run(self, seconds: int) -> list[IncidentDecision]:
        return self.c.run(seconds, self.feed, engine=self.e)

    def opened(self, seconds: int) -> list[IncidentDecision]:
        return [d for d in self.run(seconds) if d.type is DecisionType.OPEN]


def _warm(node: Node) -> Node:
    assert node.run(5) == []
    return node


def test_xid_79_on_all_eight_gpus_is_one_heavy_node_incident_with_the_gpus_as_evidence() -> None:
    node = _warm(Node())
    node.fail(GPUS)
    [opened] = node.opened(3)
    assert opened.kind is FaultKind.NODE_GPUS_FAILED and opened.subject == Subject(node="n1")
    assert opened.tier is Tier.HEAVY
    sig = opened.signal
    assert sig is not None and sig.extra["gpus"] == GPUS
    assert sig.extra["xids"] == {g: [79] for g in GPUS} and sig.extra["xid"] == 79
    assert len(sig.related) == 8 and {r.subject.gpu for r in sig.related} == set(GPUS)
    assert "8 of 8 GPUs of n1 failed" in sig.evidence.detail
    assert "gpu 7: XID 79" in sig.evidence.detail
    # The plan is the node's: safe mode at once, the rest approved; the GPUs' own plans (a
    # restart_role of every process on the node for each lost GPU) are not added.
    actions = {a.action: a for a in opened.actions}
    assert set(actions) == {
        ActionName.ENTER_SAFE_MODE,
        ActionName.RESCHEDULE_BATCHES,
        ActionName.RESTORE_CHECKPOINT,
    }
    assert not actions[ActionName.ENTER_SAFE_MODE].needs_approval
    assert actions[ActionName.RESTORE_CHECKPOINT].needs_approval
    # Past the XIDs' hold the GPUs stay lost: still that one incident, no per-GPU one.
    assert node.opened(200) == []
    assert list(node.e.open_incidents) == [opened.key]


def test_a_staggered_failure_within_the_window_is_still_one_node_incident() -> None:
    node = _warm(Node())
    node.fail(GPUS[:1])  # one GPU alone first: a per-GPU incident, as it should be
    [first] = node.opened(1)
    assert first.kind is FaultKind.GPU_XID
    node.run(20)
    node.fail(GPUS[1:])
    [opened] = node.opened(3)
    assert opened.kind is FaultKind.NODE_GPUS_FAILED
    assert opened.signal is not None and opened.signal.extra["gpus"] == GPUS


def test_different_failures_meeting_on_every_gpu_are_not_one_cause() -> None:
    node = _warm(Node())
    node.fail(GPUS[:4])  # off the bus
    node.run(2)
    node.fail(GPUS[4:], code=48)  # a double-bit ECC error on each of the others
    opened = node.opened(10)
    assert sorted((d.kind.value, d.subject.gpu) for d in opened) == [("gpu_xid", g) for g in GPUS]


def test_the_same_xid_bucket_on_every_gpu_is_one_cause() -> None:
    node = _warm(Node())
    node.fail(GPUS, code=74)  # NVLink errors on every GPU: the node's fabric
    [opened] = node.opened(3)
    assert opened.kind is FaultKind.NODE_GPUS_FAILED
    assert opened.signal is not None and opened.signal.extra["lost"] == []
    assert opened.signal.extra["xid"] == 74


def test_a_node_whose_gpus_report_over_two_rounds_opens_no_per_gpu_incident_first() -> None:
    node = _warm(Node())
    node.fail(GPUS[:3])
    assert node.opened(1) == []  # a burst below min_gpus waits settle_seconds for the rest
    node.fail(GPUS[3:])
    [opened] = node.opened(3)
    assert opened.kind is FaultKind.NODE_GPUS_FAILED
    assert opened.signal is not None and opened.signal.extra["gpus"] == GPUS


def test_a_partial_failure_below_min_gpus_stays_per_gpu_after_the_settle_time() -> None:
    node = _warm(Node())  # min_gpus: null = all eight
    node.fail(GPUS[:4])
    assert node.opened(4) == []  # waiting for the rest of the node (settle_seconds: 5)
    opened = node.opened(3)
    assert sorted((d.kind.value, d.subject.gpu) for d in opened) == [
        ("gpu_xid", g) for g in GPUS[:4]
    ]
    assert node.opened(60) == []


def test_min_gpus_folds_a_partial_failure() -> None:
    node = _warm(Node(_policy(min_gpus=4)))
    node.fail(GPUS[:4])
    [opened] = node.opened(3)
    assert opened.kind is FaultKind.NODE_GPUS_FAILED
    assert opened.signal is not None and opened.signal.extra["gpus"] == GPUS[:4]
    assert "4 of 8 GPUs" in opened.signal.evidence.detail


def test_single_faults_far_apart_are_not_folded() -> None:
    node = _warm(Node())
    opened: list[IncidentDecision] = []
    for g in GPUS:  # one GPU every 90 s: each alone within the 60 s window
        node.fail([g])
        opened += node.opened(90)
    assert sorted((d.kind.value, d.subject.gpu) for d in opened) == [("gpu_xid", g) for g in GPUS]
    assert {d.tier for d in opened} == {Tier.MEDIUM}


def test_application_errors_on_every_gpu_are_the_jobs_not_the_nodes() -> None:
    node = _warm(Node())
    node.fail(GPUS, code=13)  # RESTART_APP: the job's code crashed on every rank
    opened = node.opened(3)
    assert sorted((d.kind.value, d.tier) for d in opened) == [("gpu_xid", Tier.LIGHT)] * 8


def test_a_window_too_short_for_the_burst_keeps_it_per_gpu() -> None:
    node = _warm(Node(_policy(window_seconds=5)))
    opened: list[IncidentDecision] = []
    for g in GPUS:  # eight GPUs, ten seconds apart
        node.fail([g])
        opened += node.opened(10)
    assert all(d.kind is FaultKind.GPU_XID for d in opened) and len(opened) == 8


@pytest.mark.parametrize(
    "bad",
    [{"min_gpus": 1}, {"window_seconds": 0}, {"xid_buckets": ["X"]}, {"settle_seconds": -1}],
)
def test_bad_correlated_keys_do_not_load(bad: dict[str, object]) -> None:
    with pytest.raises(PolicyFileError, match="detection.gpu.correlated"):
        _policy(**bad)
