"""app.runtime: the one policy the engine runs and the dashboard draws, and what each command
runs."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from app.core import migrate
from app.core.child_processes import ChildSpec
from app.core.config import Settings
from app.main import create_app
from app.policy.policy_file import PolicyFileError, default_policy
from app.runtime import SERVER_LIFESPANS, UP_CHILDREN, load_running_policy, up_children
from app.scheduler import PolicyScheduler, policy_lifespan
from app.tasks.worker import embedded_worker_spec
from app.views.models.admin import settings_view
from app.views.models.jobs import golden_thresholds

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith("RLGUARD_"):
            monkeypatch.delenv(k)


def test_without_overrides_the_policy_file_stands(tmp_path: Path) -> None:
    assert load_running_policy(Settings(data_dir=tmp_path)) == default_policy()


def test_overrides_reach_the_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLGUARD_POLICY__DETECTION__HEARTBEAT__SUSPECT_SECONDS", "5")
    monkeypatch.setenv("RLGUARD_POLICY__DETECTION__TRAINER__IDLE_TIMEOUT_SECONDS", "120")
    monkeypatch.setenv("RLGUARD_POLICY__GOLDEN_METRICS__ROLLOUT_PENDING_RATIO__WARNING", "0.5")
    policy = load_running_policy(Settings(data_dir=tmp_path))
    assert policy.detection.heartbeat.suspect_seconds == 5
    assert policy.detection.heartbeat.confirm_seconds == 60  # the file's, not overridden
    assert policy.detection.trainer.idle_timeout_seconds == 120
    assert policy.golden_metrics["rollout_pending_ratio"].warning == 0.5
    assert policy.golden_metrics["rollout_pending_ratio"].healthy == 0.1


def test_an_override_that_breaks_the_policy_names_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    variable = "RLGUARD_POLICY__GOLDEN_METRICS__STATE_LOG_WRITE_LATENCY_MS__HEALTHY"
    monkeypatch.setenv(variable, "500")
    with pytest.raises(PolicyFileError) as err:
        load_running_policy(Settings(data_dir=tmp_path))
    message = str(err.value)
    assert variable in message
    assert "golden_metrics.state_log_write_latency_ms" in message and "must not exceed" in message
    monkeypatch.delenv(variable)
    # the file suspects at 15 s: the policy file's own rule refuses the merged policy
    monkeypatch.setenv("RLGUARD_POLICY__DETECTION__HEARTBEAT__CONFIRM_SECONDS", "5")
    with pytest.raises(
        PolicyFileError,
        match="RLGUARD_POLICY__DETECTION__HEARTBEAT__CONFIRM_SECONDS.*confirm_seconds "
        "\\(5.0\\) must not be shorter than suspect_seconds \\(15.0\\)",
    ):
        load_running_policy(Settings(data_dir=tmp_path))


def test_the_dashboard_and_the_engine_read_one_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLGUARD_POLICY__DETECTION__HEARTBEAT__SUSPECT_SECONDS", "7")
    monkeypatch.setenv("RLGUARD_POLICY__GOLDEN_METRICS__ROLLOUT_PENDING_RATIO__WARNING", "0.45")
    url = f"sqlite:///{tmp_path / 'rlguard.db'}"
    migrate.upgrade(url)
    settings = Settings(dev=True, database_url=url, data_dir=tmp_path / "data")
    app = create_app(settings)

    async def engine_policy() -> object:
        async with app.router.lifespan_context(app):
            sched: PolicyScheduler = app.state.policy_scheduler
            return sched.policy

    running = asyncio.run(engine_policy())
    assert running is app.state.policy  # the scheduler's engine runs what the pages read
    assert app.state.policy.detection.heartbeat.suspect_seconds == 7
    view = settings_view(settings, policy=app.state.policy)
    assert ("rollout_pending_ratio", 0.1, 0.45) in view.golden
    assert view.golden == golden_thresholds(app.state.policy)
    assert (
        "detection.heartbeat.suspect_seconds",
        "7.0 (RLGUARD_POLICY__DETECTION__HEARTBEAT__SUSPECT_SECONDS)",
    ) in view.policy
    assert ("detection.heartbeat.confirm_seconds", "60.0") in view.policy


def test_each_command_runs_what_the_wiring_file_lists(tmp_path: Path) -> None:
    assert SERVER_LIFESPANS == (policy_lifespan,)
    assert UP_CHILDREN == (embedded_worker_spec,)
    settings = Settings(data_dir=tmp_path, recovery={"embedded_nodes": "n1,n2"})
    [worker] = up_children(settings)
    assert worker.name == "worker" and worker.argv[-2:] == ["--node=n1", "--node=n2"]


def test_up_children_skip_a_factory_that_declines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.runtime as runtime

    spec = ChildSpec("demo", ["true"])

    def factory(settings: Settings) -> ChildSpec | None:
        return spec if settings.redis_url else None

    monkeypatch.setattr(runtime, "UP_CHILDREN", (factory,))
    assert up_children(Settings(data_dir=tmp_path, redis_url="redis://x")) == [spec]
    assert up_children(Settings(data_dir=tmp_path)) == []
