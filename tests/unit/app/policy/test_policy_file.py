from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from app.policy.plans import ActionName
from app.policy.policy_file import DEFAULT_POLICY_PATH, PolicyFileError, load_policy, parse_policy
from app.policy.signals import FaultKind, Tier

pytestmark = pytest.mark.timeout(30)


def _data() -> dict:
    return yaml.safe_load(DEFAULT_POLICY_PATH.read_text())


def test_shipped_policy_has_design_defaults() -> None:
    p = load_policy()
    g = p.golden_metrics
    assert (g["rollout_pending_ratio"].healthy, g["rollout_pending_ratio"].warning) == (0.1, 0.3)
    assert (
        g["actor_shard_rebuild_count_5m"].warning == 2
        and g["actor_shard_rebuild_count_5m"].inclusive
    )
    assert (g["state_log_write_latency_ms"].healthy, g["state_log_write_latency_ms"].warning) == (
        50,
        200,
    )
    d = p.detection
    assert d.trainer.idle_timeout_seconds == 300 and d.rollout.stall_timeout_seconds == 60
    assert (d.heartbeat.suspect_seconds, d.heartbeat.confirm_seconds) == (15, 60)
    assert d.startup.phases == ("STARTING",)
    assert d.startup.grace_seconds("rollout") == 600 and d.startup.grace_seconds("trainer") == 120
    assert d.startup.grace_seconds("critic") == d.startup.default_grace_seconds == 120
    assert p.recovery.rollout_retry_times == 3 and p.recovery.rollout_timeout_sec == 120
    assert p.tick_seconds == 1.0
    assert set(p.tiers) == set(FaultKind)
    assert p.tiers[FaultKind.STEP_FAILED].tier is Tier.LIGHT
    assert p.tiers[FaultKind.NODE_SILENT].tier is Tier.MEDIUM
    assert p.tiers[FaultKind.NODES_LOST].tier is Tier.HEAVY
    assert p.tiers[FaultKind.STORAGE_UNWRITABLE].tier is Tier.HEAVY
    assert p.escalation.plan == (ActionName.ENTER_SAFE_MODE, ActionName.RESTART_JOB)
    # issue 20: three automatic role restarts per rank per 30 min, then a person decides
    budget = p.guardrails.budgets[ActionName.RESTART_ROLE]
    assert (budget.per_rank, budget.window_seconds) == (3, 1800)
    assert (p.guardrails.job_breaker.max_actions, p.guardrails.cluster_breaker.max_actions) == (
        20,
        60,
    )


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d["tiers"]["step_failed"].__setitem__("tier", "lite"), "tiers.step_failed.tier"),
        (
            lambda d: d["detection"]["heartbeat"].__setitem__("suspekt_seconds", 3),
            "detection.heartbeat.suspekt_seconds: unknown key",
        ),
        (
            lambda d: d["detection"]["heartbeat"].__setitem__("suspect_seconds", -1),
            "detection.heartbeat.suspect_seconds",
        ),
        (
            lambda d: d["detection"]["heartbeat"].__setitem__("exited_phases", ["DONE"]),
            "['DONE'] cannot be both finished and exited",
        ),
        (lambda d: d["tiers"].pop("gpu_lost"), "no rule for fault kind(s) gpu_lost"),
        (lambda d: d["tiers"].__setitem__("gpu_on_fire", {"tier": "heavy"}), "tiers.gpu_on_fire"),
        (
            lambda d: d["tiers"]["node_silent"].__setitem__("plan", ["reboot_everything"]),
            "tiers.node_silent.plan.0",
        ),
        (
            lambda d: d["golden_metrics"].__setitem__(
                "gpu_temp", d["golden_metrics"]["rollout_pending_ratio"]
            ),
            "golden_metrics.gpu_temp: not a golden metric",
        ),
        (
            lambda d: d["golden_metrics"]["rollout_pending_ratio"].__setitem__("healthy", 0.9),
            "healthy (0.9) must not exceed warning",
        ),
        (lambda d: d.__setitem__("version", 2), "version"),
        (lambda d: d["approval"].__setitem__("expire_seconds", "soon"), "approval.expire_seconds"),
        (
            lambda d: d["alertmanager"]["subject_labels"].__setitem__("pod", "pod"),
            "alertmanager.subject_labels.pod",
        ),
        (
            lambda d: d["guardrails"]["budgets"]["restart_role"].__setitem__("per_rank", 0),
            "guardrails.budgets.restart_role.per_rank",
        ),
        (
            lambda d: d["guardrails"]["budgets"]["restart_role"].__setitem__("per_role", 2),
            "per_role (2) must not be below per_rank (3)",
        ),
        (
            lambda d: d["guardrails"]["budgets"].__setitem__("reboot", {"per_rank": 1}),
            "guardrails.budgets.reboot",
        ),
        (
            lambda d: d["guardrails"]["budgets"].__setitem__("release_safe_mode", {}),
            "budgets.release_safe_mode: a release is never automatic",
        ),
        (
            lambda d: d["guardrails"]["job_breaker"].__setitem__("window_seconds", 0),
            "guardrails.job_breaker.window_seconds",
        ),
        (
            lambda d: d["guardrails"]["cluster_breaker"].__setitem__("max_action", 3),
            "guardrails.cluster_breaker.max_action: unknown key",
        ),
        (
            lambda d: d["guardrails"]["budgets"]["restart_role"].__setitem__("backoff_seconds", -1),
            "guardrails.budgets.restart_role.backoff_seconds",
        ),
        (
            lambda d: d["detection"]["startup"]["startup_grace_seconds"].__setitem__("rollout", -5),
            "detection.startup.startup_grace_seconds.rollout: Input should be greater than or "
            "equal to 0 (got -5)",
        ),
        (
            lambda d: d["detection"]["startup"]["startup_grace_seconds"].__setitem__(
                "trainer", "a while"
            ),
            "detection.startup.startup_grace_seconds.trainer",
        ),
        (
            lambda d: d["detection"]["startup"]["startup_grace_seconds"].__setitem__(
                "rollout", float("inf")
            ),
            "detection.startup.startup_grace_seconds.rollout",
        ),
        (
            lambda d: d["detection"]["startup"].__setitem__("default_grace_seconds", -1),
            "detection.startup.default_grace_seconds",
        ),
        (
            lambda d: d["detection"]["startup"].__setitem__("grace_seconds", 10),
            "detection.startup.grace_seconds: unknown key",
        ),
        (
            lambda d: d["detection"]["startup"].__setitem__("phases", ["STARTING", "EXITED"]),
            "startup.phases: phase(s) ['EXITED'] cannot be start-up and finished or exited",
        ),
        (  # the file alone, not only the environment's overrides (suspects at 15 s)
            lambda d: d["detection"]["heartbeat"].__setitem__("confirm_seconds", 10),
            "detection.heartbeat: confirm_seconds (10.0) must not be shorter than "
            "suspect_seconds (15.0)",
        ),
    ],
)
def test_bad_policy_is_refused_naming_the_key(mutate, needle: str) -> None:
    data = _data()
    mutate(data)
    with pytest.raises(PolicyFileError) as err:
        parse_policy(data, source="test.yaml")
    assert needle in str(err.value)
    assert "test.yaml" in str(err.value)


def test_unreadable_and_non_yaml_files(tmp_path: Path) -> None:
    with pytest.raises(PolicyFileError, match="cannot read policy file"):
        load_policy(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("tiers: [unclosed\n")
    with pytest.raises(PolicyFileError, match="not valid YAML"):
        load_policy(bad)
    top = tmp_path / "list.yaml"
    top.write_text("- 1\n- 2\n")
    with pytest.raises(PolicyFileError, match="top level must be a mapping"):
        load_policy(top)


def test_custom_policy_file_changes_thresholds(tmp_path: Path) -> None:
    data = _data()
    data["detection"]["heartbeat"]["suspect_seconds"] = 5
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(data))
    assert load_policy(f).detection.heartbeat.suspect_seconds == 5


def test_a_file_from_an_earlier_release_takes_the_shipped_rule_for_a_new_fault_kind(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An operator's file that does not name a fault kind (or XID bucket) added since it was
    written still loads; the shipped rule applies and a warning names each key taken."""
    data = _data()
    data["tiers"]["node_silent"]["tier"] = "heavy"  # the operator's own rule stays theirs
    own_tier = data["tiers"]["node_silent"]["tier"]
    del data["tiers"]["gpu_lost"]
    del data["xid_buckets"]["RESET_GPU"]
    f = tmp_path / "old.yaml"
    f.write_text(yaml.safe_dump(data))
    shipped = load_policy()
    with caplog.at_level("WARNING", logger="rlguard.policy"):
        policy = load_policy(f)
    assert policy.tier_rule(FaultKind.GPU_LOST) == shipped.tier_rule(FaultKind.GPU_LOST)
    assert policy.tier_rule(FaultKind.NODE_SILENT).tier.value == own_tier
    assert "tiers.gpu_lost" in caplog.text and "xid_buckets.RESET_GPU" in caplog.text
    assert str(f) in caplog.text


def test_a_file_whose_tiers_are_not_a_mapping_is_still_refused(tmp_path: Path) -> None:
    data = _data()
    data["tiers"] = ["gpu_lost"]
    f = tmp_path / "bad-tiers.yaml"
    f.write_text(yaml.safe_dump(data))
    with pytest.raises(PolicyFileError, match="tiers"):
        load_policy(f)
    data = _data()
    del data["tiers"]
    f.write_text(yaml.safe_dump(data))
    with pytest.raises(PolicyFileError, match="tiers: Field required"):
        load_policy(f)
