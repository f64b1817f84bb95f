"""Hang forensics in the plan: a restart_role of a hung or stalled participant asks its launcher
for the process's stacks first (bounds from the policy); other restarts do not."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from app.policy.classifier import Classifier, choose_actions
from app.policy.plans import ActionName, PlannedAction
from app.policy.policy_file import DEFAULT_POLICY_PATH, Policy, PolicyFileError, load_policy
from app.policy.signals import FaultKind, FaultSignal, Subject
from tests.unit.app.policy.test_classifier import cluster, sig  # noqa: F401  (fixture)

from ._helpers import JOB, Cluster

TRAINER = Subject(node="n0", job=JOB, role="trainer", rank=1)


def _restarts(c: Cluster, s: FaultSignal, policy: Policy | None = None) -> list[PlannedAction]:
    p = policy or c.policy
    acts = choose_actions(
        policy=p, classification=Classifier(p).classify(s, job_step=20), signal=s, world=c.world()
    )
    return [a for a in acts if a.action is ActionName.RESTART_ROLE]


@pytest.mark.parametrize(
    "kind",
    [
        FaultKind.TRAIN_HANG,
        FaultKind.TRAINER_IDLE,
        FaultKind.HEARTBEAT_LOST,
        FaultKind.ROLLOUT_DOWN,
        FaultKind.ROLLOUT_ENGINE_DOWN,
    ],
)
def test_a_hung_or_stalled_participant_is_dumped_before_its_restart(
    cluster: Cluster,  # noqa: F811
    kind: FaultKind,
) -> None:
    [a] = _restarts(cluster, sig(kind, TRAINER))
    assert a.params == {
        "role": "trainer",
        "rank": 1,
        "capture_stacks": {"timeout_seconds": 10, "max_bytes": 65536},
    }
    # The identity (hence the idempotency key) is the restart's, forensics or not.
    assert a.identity() == f"restart_role:{JOB}:n0:trainer:1"


def test_a_node_level_restart_asks_for_no_stacks(cluster: Cluster) -> None:  # noqa: F811
    restarts = _restarts(cluster, sig(FaultKind.GPU_LOST, Subject(node="n0", gpu="1")))
    assert restarts and all("capture_stacks" not in a.params for a in restarts)


def test_a_fault_folded_into_one_that_wants_stacks_gets_them(cluster: Cluster) -> None:  # noqa: F811
    lost = replace(sig(FaultKind.GPU_LOST, TRAINER), related=(sig(FaultKind.TRAIN_HANG, TRAINER),))
    [a] = _restarts(cluster, lost)
    assert "capture_stacks" in a.params


def _policy(tmp_path, **forensics) -> Policy:
    data = yaml.safe_load(DEFAULT_POLICY_PATH.read_text())
    data["forensics"].update(forensics)
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_policy(path)


def test_the_policy_sets_the_kinds_and_bounds(cluster: Cluster, tmp_path) -> None:  # noqa: F811
    p = _policy(
        tmp_path, stacks_kinds=["heartbeat_lost"], stacks_timeout_seconds=3, stacks_max_bytes=4096
    )
    [hang] = _restarts(cluster, sig(FaultKind.TRAIN_HANG, TRAINER), p)
    [lost] = _restarts(cluster, sig(FaultKind.HEARTBEAT_LOST, TRAINER), p)
    assert "capture_stacks" not in hang.params
    assert lost.params["capture_stacks"] == {"timeout_seconds": 3, "max_bytes": 4096}


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("stacks_timeout_seconds", 0),
        ("stacks_timeout_seconds", 600),
        ("stacks_max_bytes", 10),
        ("stacks_kinds", ["no_such_kind"]),
    ],
)
def test_bad_forensics_keys_are_refused_by_name(tmp_path, key: str, value: object) -> None:
    with pytest.raises(PolicyFileError, match=key):
        _policy(tmp_path, **{key: value})


def test_a_first_step_hang_held_for_a_person_is_dumped_when_safe_mode_is_entered(
    cluster: Cluster,  # noqa: F811
) -> None:
    """A hang in the job's first step escalates (SAFE_MODE, restart_job waiting for an
    approver): no restart_role to capture before, so SAFE_MODE on the hung rank's node does,
    at once; the other nodes' SAFE_MODE and the approved restart_job ask for nothing."""
    cluster.participant("rollout", 0, "n1", phase="ROLLOUT", step=0)
    s = sig(FaultKind.TRAIN_HANG, TRAINER, step=0)
    cls = Classifier(cluster.policy).classify(s, job_step=0)
    acts = choose_actions(
        policy=cluster.policy, classification=cls, signal=s, world=cluster.world()
    )
    safe = {a.node: a for a in acts if a.action is ActionName.ENTER_SAFE_MODE}
    assert safe["n0"].params == {
        "reason": "train_hang",
        "role": "trainer",
        "rank": 1,
        "capture_stacks": {"timeout_seconds": 10, "max_bytes": 65536},
    }
    assert not safe["n0"].needs_approval  # automatic: taken now, not when a person approves
    assert all("capture_stacks" not in a.params for a in acts if a.node != "n0")
    [job] = [a for a in acts if a.action is ActionName.RESTART_JOB]
    assert "capture_stacks" not in job.params and job.needs_approval


def test_a_heavy_fault_that_wants_no_stacks_enters_safe_mode_plainly(
    cluster: Cluster,  # noqa: F811
) -> None:
    s = sig(FaultKind.STEP_FAILED, TRAINER, step=0)
    cls = Classifier(cluster.policy).classify(s, job_step=0)
    acts = choose_actions(
        policy=cluster.policy, classification=cls, signal=s, world=cluster.world()
    )
    safe = [a for a in acts if a.action is ActionName.ENTER_SAFE_MODE]
    assert safe and all(a.params == {"reason": "step_failed"} for a in safe)
