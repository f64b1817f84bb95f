from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pydantic import ValidationError

from app.core.config import (
    DEFAULT_SECRET_KEY,
    POLICY_OVERRIDE_PATHS,
    ConfigError,
    Settings,
    get_settings,
    policy_variable,
)
from app.policy.policy_file import default_policy


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for k in list(os.environ):
        if k.startswith("RLGUARD_"):
            monkeypatch.delenv(k)
    get_settings.cache_clear()


def test_defaults_follow_the_design(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    s = Settings()
    assert s.data_dir == tmp_path / "data"
    assert s.db_url == f"sqlite:///{tmp_path / 'data' / 'rlguard.db'}"
    assert s.redis_url is None
    # RLGUARD_POLICY__* override the policy file; unset, the file's values stand.
    assert s.policy.overridden() == {} and s.policy.file_overrides() == {}
    assert s.policy.checkpoint_interval_steps == 50
    assert s.recovery.run_root is None and s.recovery.action_lease_seconds == 180
    assert s.alerts.file is None and s.policy_scheduler is True


def test_worker_and_alert_variables_keep_their_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLGUARD_RECOVERY_RUN_ROOT", str(tmp_path / "runs"))
    monkeypatch.setenv("RLGUARD_RECOVERY_ACTION_LEASE_SECONDS", "60")
    monkeypatch.setenv("RLGUARD_ALERTS_FILE", str(tmp_path / "alerts.yaml"))
    monkeypatch.setenv("RLGUARD_ALERTS_EXTERNAL_BASE_URL", "https://rlguard.example.com")
    monkeypatch.setenv("RLGUARD_POLICY_SCHEDULER", "0")
    s = get_settings()
    assert s.recovery.run_root == tmp_path / "runs" and s.recovery.task_time_limit == 48
    assert s.alerts.file == tmp_path / "alerts.yaml"
    assert s.alerts.external_base_url == "https://rlguard.example.com"
    assert s.policy_scheduler is False


SHAPE = {
    "detection": {"heartbeat": {"suspect_seconds": 5}},
    "recovery": {"rollout_retry_times": 1},
    "golden_metrics": {"actor_shard_rebuild_count_5m": {"warning": 4}},
}


def test_a_policy_override_is_named_by_its_path_in_the_policy_file(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("RLGUARD_POLICY__DETECTION__HEARTBEAT__SUSPECT_SECONDS", "5")
    monkeypatch.setenv("RLGUARD_POLICY__RECOVERY__ROLLOUT_RETRY_TIMES", "1")
    monkeypatch.setenv("RLGUARD_POLICY__GOLDEN_METRICS__ACTOR_SHARD_REBUILD_COUNT_5M__WARNING", "4")
    policy = Settings().policy
    assert policy.file_overrides() == SHAPE
    assert policy.overridden() == {
        "detection.heartbeat.suspect_seconds": 5,
        "recovery.rollout_retry_times": 1,
        "golden_metrics.actor_shard_rebuild_count_5m.warning": 4,
    }
    assert [policy_variable(p) for p in policy.overridden()] == [
        "RLGUARD_POLICY__DETECTION__HEARTBEAT__SUSPECT_SECONDS",
        "RLGUARD_POLICY__RECOVERY__ROLLOUT_RETRY_TIMES",
        "RLGUARD_POLICY__GOLDEN_METRICS__ACTOR_SHARD_REBUILD_COUNT_5M__WARNING",
    ]
    assert "deprecated" not in caplog.text
    # every overridable path is a path of the shipped policy file
    shipped = default_policy().model_dump(mode="json")
    for path in POLICY_OVERRIDE_PATHS:
        node = shipped
        for part in path.split("."):
            node = node[part]
        assert isinstance(node, int | float), path


def test_the_previous_names_still_work_for_a_release_with_a_warning_naming_the_new_one(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("RLGUARD_POLICY__HEARTBEAT_SUSPECT_AFTER", "5")
    monkeypatch.setenv("RLGUARD_POLICY__ROLLOUT_RETRY_TIMES", "1")
    monkeypatch.setenv(
        "RLGUARD_POLICY__SEVERITY_THRESHOLDS__ACTOR_SHARD_REBUILD_COUNT_5M_WARNING", "4"
    )
    with caplog.at_level(logging.WARNING, logger="rlguard.config"):
        policy = Settings().policy
    assert policy.file_overrides() == SHAPE
    assert policy.heartbeat_suspect_after is None  # moved to its path, read from there only
    assert sorted(r.getMessage() for r in caplog.records) == [
        "RLGUARD_POLICY__HEARTBEAT_SUSPECT_AFTER is deprecated and goes in the next release: "
        "use RLGUARD_POLICY__DETECTION__HEARTBEAT__SUSPECT_SECONDS",
        "RLGUARD_POLICY__ROLLOUT_RETRY_TIMES is deprecated and goes in the next release: "
        "use RLGUARD_POLICY__RECOVERY__ROLLOUT_RETRY_TIMES",
        "RLGUARD_POLICY__SEVERITY_THRESHOLDS__ACTOR_SHARD_REBUILD_COUNT_5M_WARNING is "
        "deprecated and goes in the next release: use "
        "RLGUARD_POLICY__GOLDEN_METRICS__ACTOR_SHARD_REBUILD_COUNT_5M__WARNING",
    ]


def test_an_old_and_a_new_name_that_disagree_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLGUARD_POLICY__HEARTBEAT_SUSPECT_AFTER", "5")
    monkeypatch.setenv("RLGUARD_POLICY__DETECTION__HEARTBEAT__SUSPECT_SECONDS", "6")
    with pytest.raises(
        ValidationError,
        match=(
            "RLGUARD_POLICY__HEARTBEAT_SUSPECT_AFTER \\(5.0\\) and "
            "RLGUARD_POLICY__DETECTION__HEARTBEAT__SUSPECT_SECONDS \\(6.0\\) disagree"
        ),
    ):
        Settings()
    monkeypatch.setenv("RLGUARD_POLICY__DETECTION__HEARTBEAT__SUSPECT_SECONDS", "5")
    assert Settings().policy.overridden() == {"detection.heartbeat.suspect_seconds": 5}


def test_environment_with_prefix_and_nesting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLGUARD_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("RLGUARD_DATABASE_URL", "postgresql+psycopg://u@h/db")
    monkeypatch.setenv("RLGUARD_REDIS_URL", "redis://h:6379/0")
    monkeypatch.setenv("RLGUARD_PORT", "9000")
    monkeypatch.setenv("RLGUARD_POLICY__DETECTION__TRAINER__IDLE_TIMEOUT_SECONDS", "120")
    monkeypatch.setenv("RLGUARD_INGEST__MAX_SAMPLES", "10")
    s = get_settings()
    assert get_settings() is s  # cached
    assert s.db_url == "postgresql+psycopg://u@h/db"
    assert s.redis_url == "redis://h:6379/0"
    assert s.port == 9000
    assert s.policy.detection.trainer.idle_timeout_seconds == 120
    assert s.ingest.max_samples == 10


@pytest.mark.parametrize(
    ("env", "value", "needle"),
    [
        ("RLGUARD_PORT", "70000", "port"),
        ("RLGUARD_POLICY__HEARTBEAT_SUSPECT_AFTER", "-1", "heartbeat_suspect_after"),
        ("RLGUARD_POLICY__DETECTION__HEARTBEAT__SUSPECT_SECONDS", "0", "suspect_seconds"),
        ("RLGUARD_POLICY__DETECTION__HEARTBEAT__SUSPECT_SECOND", "5", "suspect_second\\b"),
        ("RLGUARD_POLICY__TICK_SECOND", "5", "tick_second\\b"),
        (
            "RLGUARD_POLICY__SEVERITY_THRESHOLDS__ROLLOUT_PENDING_RATIO_WARN",
            "1",
            "unknown threshold 'rollout_pending_ratio_warn'",
        ),
        ("RLGUARD_POLICY__TICK_SECONDS", "0", "tick_seconds"),
        ("RLGUARD_INGEST__MAX_SAMPLES", "0", "max_samples"),
        ("RLGUARD_SQLITE_SYNCHRONOUS", "sometimes", "sqlite_synchronous"),
    ],
)
def test_bad_values_are_refused(
    env: str, value: str, needle: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ValidationError, match=needle):
        Settings()


def test_default_secret_refused_outside_dev(tmp_path: Path) -> None:
    s = Settings(data_dir=tmp_path)
    assert s.secret_key == DEFAULT_SECRET_KEY
    with pytest.raises(ConfigError, match="RLGUARD_SECRET_KEY"):
        s.check_secret()
    Settings(data_dir=tmp_path, dev=True).check_secret()
    with pytest.raises(ConfigError, match="shorter than 16"):
        Settings(data_dir=tmp_path, secret_key="short").check_secret()


def test_secret_is_read_from_the_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "secret_key").write_text("k" * 40 + "\n")
    s = Settings(data_dir=tmp_path)
    assert s.secret_key == "k" * 40
    s.check_secret()
    monkeypatch.setenv("RLGUARD_SECRET_KEY", "e" * 32)
    assert Settings(data_dir=tmp_path).secret_key == "e" * 32  # the environment wins


def test_global_dry_run_is_off_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().automation.dry_run is False
    monkeypatch.setenv("RLGUARD_AUTOMATION__DRY_RUN", "1")
    assert Settings().automation.dry_run is True
    monkeypatch.setenv("RLGUARD_AUTOMATION__DRY_RUN", "maybe")
    with pytest.raises(ValidationError, match="automation.dry_run"):
        Settings()
