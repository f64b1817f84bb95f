from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from app.core.config import DEFAULT_SECRET_KEY, ConfigError, Settings, get_settings


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
    p = s.policy
    assert (p.trainer_idle_timeout, p.rollout_stall_timeout) == (300, 60)
    assert (p.heartbeat_suspect_after, p.heartbeat_confirm_after) == (15, 60)
    assert (p.rollout_retry_times, p.rollout_timeout_sec, p.tick_seconds) == (3, 120, 1)
    assert (p.snapshot_interval_steps, p.checkpoint_interval_steps) == (25, 50)
    g = p.severity_thresholds
    assert (g.rollout_pending_ratio_healthy, g.rollout_pending_ratio_warning) == (0.1, 0.3)
    assert (g.actor_shard_rebuild_count_5m_healthy, g.actor_shard_rebuild_count_5m_warning) == (0, 2)
    assert (g.state_log_write_latency_ms_healthy, g.state_log_write_latency_ms_warning) == (50, 200)


def test_environment_with_prefix_and_nesting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLGUARD_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("RLGUARD_DATABASE_URL", "postgresql+psycopg://u@h/db")
    monkeypatch.setenv("RLGUARD_REDIS_URL", "redis://h:6379/0")
    monkeypatch.setenv("RLGUARD_PORT", "9000")
    monkeypatch.setenv("RLGUARD_POLICY__TRAINER_IDLE_TIMEOUT", "120")
    monkeypatch.setenv("RLGUARD_INGEST__MAX_SAMPLES", "10")
    s = get_settings()
    assert get_settings() is s  # cached
    assert s.db_url == "postgresql+psycopg://u@h/db"
    assert s.redis_url == "redis://h:6379/0"
    assert s.port == 9000
    assert s.policy.trainer_idle_timeout == 120
    assert s.ingest.max_samples == 10


@pytest.mark.parametrize(
    ("env", "value", "needle"),
    [
        ("RLGUARD_PORT", "70000", "port"),
        ("RLGUARD_POLICY__HEARTBEAT_CONFIRM_AFTER", "5", "heartbeat_confirm_after"),
        ("RLGUARD_INGEST__MAX_SAMPLES", "0", "max_samples"),
        ("RLGUARD_SQLITE_SYNCHRONOUS", "sometimes", "sqlite_synchronous"),
    ],
)
def test_bad_values_are_refused(env: str, value: str, needle: str, monkeypatch: pytest.MonkeyPatch) -> None:
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
