"""One real stack for a module of TRL integration tests (server start-up is the slow part);
each test runs its own job, with its own run directory and node agent."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from app.demo import DemoStack
from tests.harness import free_port
from tests.integration.integrations._trl import use_launch_hook


@dataclass
class TRLStack(DemoStack):
    """The demo's stack with detection tuned to the tiny job (0.2-2 s per step, idle to busy
    machine): a hang is judged after max(6 s, 10 x the median step) once two step times are
    seen, and a silent heartbeat only after 15 + 15 s, so that a SIGSTOPped trainer is seen
    hung (train_hang) before it is seen lost. An exit is seen at once either way (EXITED)."""

    def _env(self) -> dict[str, str]:
        env = super()._env()
        path = Path(env["RLGUARD_RECOVERY_POLICY_FILE"])
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        data["detection"]["trainer"].update(
            hang_min_seconds=6, hang_step_factor=10, hang_min_steps=2
        )
        data["detection"]["heartbeat"].update(suspect_seconds=15, confirm_seconds=15)
        path.write_text(yaml.safe_dump(data), encoding="utf-8")
        return env


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoStack]:
    workdir: Path = tmp_path_factory.mktemp("trl-stack")
    s = TRLStack(workdir, free_port(), job="trl-boot", schedule=None)
    try:
        s.start_server()
        use_launch_hook(s)
        yield s
    finally:
        s.stop()
