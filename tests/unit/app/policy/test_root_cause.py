"""One incident per root cause: an XID 79 and the GPU it threw off the bus are one fault.

The agent reports an XID 79 twice: as a critical XID (``gpu_xid``) and as a GPU lost from the
bus (``gpu_lost``). Before the fold they opened two medium incidents for one GPU.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.policy.classifier import Classifier
from app.policy.engine import DecisionType, PolicyEngine
from app.policy.plans import ActionName
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject, Tier
from recovery.protocol import metric_names as m

from ._helpers import JOB, Cluster

pytestmark = pytest.mark.timeout(60)

R = {"job": JOB, "role": "rollout", "rank": "0"}


def _base(c: Cluster) -> None:
    c.participant("rollout", 0, "n1", phase="ROLLOUT", step=20)
    c.put("n1", m.ROLLOUT_TOKENS_PER_SECOND, 1000, **R)
    c.put("n1", m.GPU_XID_CRITICAL_EVENTS_TOTAL, 0, gpu="1")  # GPU 1: healthy throughout
    c.put("n1", m.GPU_LOST, 0, gpu="1")


def _xid(gpu: str, count: int = 1):  # type: ignore[no-untyped-def]
    def f(c: Cluster) -> None:
        c.put("n1", m.GPU_XID_CRITICAL_EVENTS_TOTAL, count, gpu=gpu)
        c.put("n1", m.GPU_XID_LAST_CODE, 79, gpu=gpu)

    return f


def _lost(gpu: str, value: int = 1):  # type: ignore[no-untyped-def]
    return lambda c: c.put("n1", m.GPU_LOST, value, gpu=gpu)


def _engine() -> tuple[Cluster, PolicyEngine]:
    c = Cluster()
    e = PolicyEngine(c.policy)
    c.run(5, lambda c: (_base(c), _xid("0", 0)(c), _lost("0", 0)(c)), engine=e)
    return c, e


def test_xid_79_and_its_lost_gpu_open_one_incident_with_both_signals() -> None:
    c, e = _engine()
    ds = c.run(1, lambda c: (_base(c), _xid("0")(c), _lost("0")(c)), engine=e)
    [opened] = ds
    assert opened.type is DecisionType.OPEN and opened.kind is FaultKind.GPU_XID
    assert opened.tier is Tier.MEDIUM and opened.subject == Subject(node="n1", gpu="0")
    assert opened.signal is not None and opened.signal.extra["xid"] == 79
    assert [r.kind for r in opened.signal.related] == [FaultKind.GPU_LOST]
    assert "also gpu_lost: GPU fell off the bus" in opened.signal.evidence.detail
    stored = opened.signal.to_dict()  # what the incident keeps as its evidence
    assert [r["kind"] for r in stored["related"]] == ["gpu_lost"]
    # The recovery of both: the XID's rescheduling and the lost GPU's restart of the node's
    # participants, each once.
    assert [a.action for a in opened.actions] == [
        ActionName.RESCHEDULE_BATCHES,
        ActionName.RESTART_ROLE,
    ]
    # The XID's hold ends (120 s) while the GPU stays lost: still that one incident.
    ds = c.run(150, lambda c: (_base(c), _xid("0")(c), _lost("0")(c)), engine=e)
    assert ds == [] and list(e.open_incidents) == [opened.key]
    # The GPU comes back: the incident resolves after the quiet period, and nothing else opens.
    ds = c.run(40, lambda c: (_base(c), _xid("0")(c), _lost("0", 0)(c)), engine=e)
    assert [(d.type, d.key) for d in ds] == [(DecisionType.RESOLVE, opened.key)]


@pytest.mark.parametrize("first", [FaultKind.GPU_XID, FaultKind.GPU_LOST])
def test_the_second_signal_a_tick_later_joins_the_first_ones_incident(first: FaultKind) -> None:
    c, e = _engine()
    xid_first = first is FaultKind.GPU_XID
    [opened] = c.run(
        1,
        lambda c: (
            _base(c),
            _xid("0", 1 if xid_first else 0)(c),
            _lost("0", 0 if xid_first else 1)(c),
        ),
        engine=e,
    )
    assert opened.kind is first and opened.signal is not None and not opened.signal.related
    ds = c.run(10, lambda c: (_base(c), _xid("0")(c), _lost("0")(c)), engine=e)
    assert ds == [] and list(e.open_incidents) == [opened.key]


def test_an_xid_on_one_gpu_and_another_gpu_lost_stay_two_incidents() -> None:
    c, e = _engine()
    # A third, healthy GPU: two GPUs of a two-GPU node failing together would be the whole
    # node (node_gpus_failed, tests/unit/app/policy/test_correlated.py); two of three wait
    # detection.gpu.correlated.settle_seconds for the rest of the node, then open their own.
    ds = c.run(
        7,
        lambda c: (_base(c), _xid("0")(c), _lost("0", 0)(c), _lost("1")(c), _lost("2", 0)(c)),
        engine=e,
    )
    opened = [d for d in ds if d.type is DecisionType.OPEN]
    assert sorted((d.kind.value, d.subject.gpu) for d in opened) == [
        ("gpu_lost", "1"),
        ("gpu_xid", "0"),
    ]


def _signal(kind: FaultKind, **extra: object) -> FaultSignal:
    return FaultSignal(
        kind=kind,
        subject=Subject(node="n1", gpu="0"),
        evidence=Evidence(metric=None),
        suggested_tier=Tier.MEDIUM,
        detected_at=1.0,
        since=1.0,
        extra=dict(extra),
    )


def test_a_folded_signal_adds_its_plan_to_the_incidents_plan() -> None:
    classifier = Classifier(Cluster().policy)
    xid = _signal(FaultKind.GPU_XID, xid=79)
    alone = classifier.classify(xid, job_step=20)
    folded = classifier.classify(replace(xid, related=(_signal(FaultKind.GPU_LOST),)), job_step=20)
    assert alone.actions == (ActionName.RESCHEDULE_BATCHES, ActionName.DRAIN_NODE)
    assert folded.actions == (
        ActionName.RESCHEDULE_BATCHES,
        ActionName.DRAIN_NODE,
        ActionName.RESTART_ROLE,
    )
    assert folded.tier is Tier.MEDIUM and not folded.escalated
