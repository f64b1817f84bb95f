"""Exit causes in the policy: an exited participant whose launcher read a cause in its output
opens the cause's kind, tier and plan and says why; an unknown exit stays heartbeat_lost; an
earlier exit's cause is not this one's; the same cause at the same step again escalates; a
collective timeout is about the role; a bad catalogue stops the policy from loading."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from app.policy.classifier import Classifier
from app.policy.detectors.heartbeat import HeartbeatDetector
from app.policy.policy_file import PolicyFileError, default_policy, parse_policy
from app.policy.signals import FaultKind, Tier
from recovery.supervision.exit_causes import EXIT_CAUSE_KINDS
from tests.unit.app.policy._helpers import JOB, Cluster

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def _exit(
    c: Cluster,
    role: str,
    rank: int,
    at: float,
    cause: tuple[str, str] | None,
    step: int = 20,
    node: str = "n0",
) -> None:
    c.put(node, "x", 1)
    c.participant(role, rank, node, phase="EXITED", step=step, heartbeat=at)
    if cause is not None:
        c.put(
            node,
            "participant_exit_cause",
            at,
            job=JOB,
            role=role,
            rank=str(rank),
            cause=cause[0],
            kind=cause[1],
            line=OOM if cause[0] == "cuda_oom" else "a line",
        )


def test_every_kind_the_launcher_accepts_is_a_fault_kind_with_a_rule() -> None:
    assert EXIT_CAUSE_KINDS <= {k.value for k in FaultKind}
    policy = default_policy()
    for name, rule in policy.exit_causes.items():
        assert rule.kind in policy.tiers, name


def test_an_exit_with_a_known_cause_takes_the_causes_kind_tier_and_line() -> None:
    c = Cluster()
    det = HeartbeatDetector(c.policy)
    at = c.now + 1
    [[sig]] = c.run(1, lambda c: _exit(c, "trainer", 0, at, ("cuda_oom", "cuda_oom")), detector=det)
    assert sig.kind is FaultKind.CUDA_OOM and sig.suggested_tier is Tier.MEDIUM
    assert sig.extra["exit_cause"] == "cuda_oom" and sig.extra["line"] == OOM
    assert sig.extra["same_step_failures"] == 1 and sig.since == at
    assert f"exit_cause: cuda_oom, its output said: {OOM}" in sig.evidence.detail
    assert sig.subject.to_dict() == {"node": "n0", "job": JOB, "role": "trainer", "rank": 0}
    plan = Classifier(c.policy).classify(sig, job_step=20)
    assert plan.tier is Tier.MEDIUM and [a.value for a in plan.actions] == ["restart_role"]


def test_a_full_disk_is_storage_unwritable_heavy() -> None:
    c = Cluster()
    det = HeartbeatDetector(c.policy)
    at = c.now + 1
    [[sig]] = c.run(
        1, lambda c: _exit(c, "trainer", 1, at, ("disk_full", "storage_unwritable")), detector=det
    )
    assert sig.kind is FaultKind.STORAGE_UNWRITABLE and sig.suggested_tier is Tier.HEAVY
    actions = Classifier(c.policy).classify(sig, job_step=20).actions
    assert [a.value for a in actions] == ["enter_safe_mode", "restore_checkpoint"]


def test_an_exit_without_a_cause_and_an_earlier_exits_cause_stay_heartbeat_lost() -> None:
    c = Cluster()
    det = HeartbeatDetector(c.policy)
    old = c.now - 100  # the cause of an exit 100 s ago, restarted since
    c.put(
        "n0",
        "participant_exit_cause",
        old,
        ts=old,
        job=JOB,
        role="trainer",
        rank="0",
        cause="cuda_oom",
        kind="cuda_oom",
        line=OOM,
    )
    at = c.now + 1
    [[sig]] = c.run(1, lambda c: _exit(c, "trainer", 0, at, None), detector=det)
    assert sig.kind is FaultKind.HEARTBEAT_LOST and "exit_cause" not in sig.extra


def test_the_same_cause_at_the_same_step_again_escalates_and_another_step_does_not() -> None:
    c = Cluster()
    det = HeartbeatDetector(c.policy)
    classify = Classifier(c.policy).classify
    first = c.now + 1
    [[a]] = c.run(
        1, lambda c: _exit(c, "trainer", 0, first, ("cuda_oom", "cuda_oom")), detector=det
    )
    # restarted, trains again from its checkpoint, dies of the same OOM at the same step
    c.run(
        5, lambda c: (c.put("n0", "x", 1), c.participant("trainer", 0, "n0", step=18)), detector=det
    )
    second = c.now + 1
    [[b]] = c.run(
        1, lambda c: _exit(c, "trainer", 0, second, ("cuda_oom", "cuda_oom")), detector=det
    )
    assert b.extra["same_step_failures"] == 2
    assert classify(a, job_step=20).tier is Tier.MEDIUM
    verdict = classify(b, job_step=20)
    assert verdict.tier is Tier.HEAVY and verdict.escalated
    third = c.now + 1
    [[d]] = c.run(
        1, lambda c: _exit(c, "trainer", 0, third, ("cuda_oom", "cuda_oom"), step=21), detector=det
    )
    assert d.extra["same_step_failures"] == 1 and not classify(d, job_step=21).escalated


def test_a_collective_timeout_is_about_the_role_with_every_ranks_stacks() -> None:
    c = Cluster()
    det = HeartbeatDetector(c.policy)
    at = c.now + 1

    def both(c: Cluster) -> None:
        for rank in (0, 1):
            _exit(c, "trainer", rank, at, ("collective_timeout", "collective_timeout"))

    [sigs] = c.run(1, both, detector=det)
    assert {s.kind for s in sigs} == {FaultKind.COLLECTIVE_TIMEOUT}
    assert {s.incident_key for s in sigs} == {f"collective_timeout:job={JOB}/role=trainer"}
    assert "collective_timeout" in c.policy.forensics.stacks_kinds


def test_a_kind_the_server_does_not_know_is_heartbeat_lost() -> None:
    c = Cluster()
    det = HeartbeatDetector(c.policy)
    at = c.now + 1
    [[sig]] = c.run(
        1, lambda c: _exit(c, "trainer", 0, at, ("mystery", "no_such_kind")), detector=det
    )
    assert sig.kind is FaultKind.HEARTBEAT_LOST


def test_a_policy_may_override_a_causes_rule() -> None:
    data = yaml.safe_load(Path("app/policy/policy.yaml").read_text())
    data["exit_causes"] = {
        "cuda_oom": {"kind": "cuda_oom", "tier": "heavy", "plan": ["enter_safe_mode"]}
    }
    policy = parse_policy(data)
    assert policy.exit_causes["cuda_oom"].tier is Tier.HEAVY
    assert policy.exit_causes["disk_full"].kind is FaultKind.STORAGE_UNWRITABLE  # the rest kept
    data["exit_causes"] = {"cuda_oom": {"kind": "cuda_oom", "tier": "heavy", "plan": ["reboot"]}}
    with pytest.raises(PolicyFileError, match="exit_causes"):
        parse_policy(data)


def test_a_catalogue_with_an_unknown_action_stops_the_policy_naming_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import recovery.supervision.exit_causes as ec

    bad = tmp_path / "causes.yaml"
    bad.write_text(
        "causes:\n  - {cause: a, pattern: x, kind: cuda_oom, tier: light,\n"
        "     plan: [reboot_everything], source: s}\n"
    )
    monkeypatch.setattr(ec, "DEFAULT_CATALOGUE", bad)
    with pytest.raises(PolicyFileError) as exc:
        default_policy()
    assert f"{bad}, line 2: plan of 'a' names unknown action 'reboot_everything'" in str(exc.value)
