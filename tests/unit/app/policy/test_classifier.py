from __future__ import annotations

import pytest

from app.policy.classifier import Classifier, choose_actions
from app.policy.plans import ActionName, queue_for
from app.policy.policy_file import default_policy
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject, Tier

from ._helpers import JOB, Cluster

pytestmark = pytest.mark.timeout(30)


def sig(kind: FaultKind, subject: Subject, **extra) -> FaultSignal:
    return FaultSignal(
        kind,
        subject,
        Evidence(metric=None),
        Tier.LIGHT,
        0.0,
        step=extra.pop("step", None),
        extra=extra,
    )


@pytest.fixture
def cluster() -> Cluster:
    c = Cluster()
    c.participant("trainer", 0, "n0", step=20)
    c.participant("trainer", 1, "n0", step=20)
    c.participant("rollout", 0, "n1", phase="ROLLOUT", step=20)
    c.participant("rollout", 1, "n2", phase="ROLLOUT", step=20)
    return c


def test_tiers_come_from_the_policy_rules() -> None:
    cl = Classifier(default_policy())
    s = Subject(node="n0", job=JOB, role="trainer", rank=0)
    assert cl.classify(sig(FaultKind.STEP_FAILED, s), job_step=20).tier is Tier.LIGHT
    assert cl.classify(sig(FaultKind.ROLLOUT_DOWN, s), job_step=20).tier is Tier.MEDIUM
    assert cl.classify(sig(FaultKind.STORAGE_UNWRITABLE, s), job_step=20).tier is Tier.HEAVY


def test_escalation_rules() -> None:
    cl = Classifier(default_policy())
    s = Subject(node="n0", job=JOB, role="trainer", rank=0)
    first = cl.classify(sig(FaultKind.STEP_FAILED, s), job_step=1)
    assert first.tier is Tier.HEAVY and first.escalated and "first step" in first.reasons[0]
    assert first.actions == (ActionName.ENTER_SAFE_MODE, ActionName.RESTART_JOB)
    again = cl.classify(sig(FaultKind.STEP_FAILED, s, step=42, same_step_failures=2), job_step=50)
    assert again.escalated and "step 42 failed 2 times" in again.reasons[0]
    twice = cl.classify(sig(FaultKind.ROLLOUT_DOWN, s), job_step=50, recovery_failures=2)
    assert twice.escalated and "local recovery failed 2 times" in twice.reasons[0]
    once = cl.classify(sig(FaultKind.ROLLOUT_DOWN, s), job_step=50, recovery_failures=1)
    assert not once.escalated and once.tier is Tier.MEDIUM


def test_alert_only_faults_never_escalate_in_the_first_step() -> None:
    cl = Classifier(default_policy())
    c = cl.classify(sig(FaultKind.GPU_THROTTLED, Subject(node="n1", gpu="0")), job_step=0)
    assert c.tier is Tier.LIGHT and not c.escalated


def test_light_plan_targets_the_failing_node(cluster: Cluster) -> None:
    p = cluster.policy
    s = sig(FaultKind.STEP_FAILED, Subject(node="n0", job=JOB, role="trainer", rank=1), step=42)
    cls = Classifier(p).classify(s, job_step=42)
    [a] = choose_actions(policy=p, classification=cls, signal=s, world=cluster.world())
    assert a.action is ActionName.SKIP_FAILED_STEP and a.queue == "node.n0"
    assert a.params == {"step": 42, "role": "trainer", "rank": 1} and not a.needs_approval


def test_retry_batch_carries_the_retry_bounds(cluster: Cluster) -> None:
    p = cluster.policy
    s = sig(FaultKind.ROLLOUT_BATCH_TIMEOUT, Subject(node="n1", job=JOB, role="rollout", rank=0))
    [a] = choose_actions(
        policy=p,
        classification=Classifier(p).classify(s, job_step=20),
        signal=s,
        world=cluster.world(),
    )
    assert a.params["max_retries"] == 3 and a.params["timeout_sec"] == 120


def test_heavy_plan_safe_mode_everywhere_now_restore_after_approval(cluster: Cluster) -> None:
    p = cluster.policy
    s = sig(FaultKind.NODES_LOST, Subject(job=JOB), nodes=["n1", "n2"])
    cls = Classifier(p).classify(s, job_step=20)
    acts = choose_actions(policy=p, classification=cls, signal=s, world=cluster.world())
    safe = [a for a in acts if a.action is ActionName.ENTER_SAFE_MODE]
    assert sorted(a.node for a in safe) == ["n0", "n1", "n2"]
    assert all(not a.needs_approval and a.queue == f"node.{a.node}" for a in safe)
    [restore] = [a for a in acts if a.action is ActionName.RESTORE_CHECKPOINT]
    assert restore.needs_approval and restore.queue == "cluster"


def test_node_level_signal_restarts_each_role_on_the_node(cluster: Cluster) -> None:
    p = cluster.policy
    s = sig(FaultKind.GPU_LOST, Subject(node="n0", gpu="1"))
    acts = choose_actions(
        policy=p,
        classification=Classifier(p).classify(s, job_step=20),
        signal=s,
        world=cluster.world(),
    )
    restarts = [
        (a.params["role"], a.params["rank"]) for a in acts if a.action is ActionName.RESTART_ROLE
    ]
    assert restarts == [("trainer", 0), ("trainer", 1)]
    [resched] = [a for a in acts if a.action is ActionName.RESCHEDULE_BATCHES]
    assert resched.params == {"away_from": "n0"} and resched.queue == "cluster"


def test_node_local_action_without_node_is_refused() -> None:
    with pytest.raises(ValueError, match="enter_safe_mode needs a node"):
        queue_for(ActionName.ENTER_SAFE_MODE, None)
