"""TRL's real ``GRPOTrainer`` generating on a real vLLM engine that RLGuard heals: the engine is
the job's rollout role (``rlguard launch --role rollout -- python -m integrations.vllm.host``),
the trainer its trainer role (``rlguard launch --integration trl -- train.py --vllm_server
URL``), watched by the real node agent (which finds the engine from its announcement), server,
policy engine and Celery worker.

The engine's Worker is SIGKILLed mid-run. RLGuard sees the engine dead, restarts the rollout
role through the launcher hook (the new host kills what is left of the old tree and starts a
fresh engine on the same port), the trainer's weight sync refits the replacement to the current
version before it samples from it, and training finishes: every step trained once, by the one
trainer process (waiting for its engine it reports ``WAIT_ENGINE``, not a hang), and the engine
ends serving the last step's version.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.cli.demo import DemoStack
from recovery.report import heartbeat_path, read_heartbeat
from tests.harness import free_port
from tests.integration.integrations._trl import TRLJob

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "trl_grpo" / "train.py"
MAX_STEPS = 6
# Engine start-up is 20-60 s here and over 100 s on a loaded CI machine.
ENGINE_START_S = 300


class EngineRole:
    """``rlguard launch --role rollout`` of one engine host for a job's run directory."""

    def __init__(self, stack: DemoStack, job: str, model_dir: Path) -> None:
        self.stack = stack
        self.job = job
        self.port = free_port()
        self.run_dir = stack.run_root / job
        self.name = f"launch-{job}-rollout"
        self.argv = [
            sys.executable, "-m", "integrations.launch", "--job", job, "--role", "rollout",
            "--run-dir", str(self.run_dir), "--max-restarts", "3", "--backoff", "0.2", "--",
            sys.executable, "-m", "integrations.vllm.host", "--model", str(model_dir),
            "--port", str(self.port), "--max-model-len", "64",
            "--", "--logprobs-mode", "processed_logprobs",
        ]  # fmt: skip

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.stack._spawn(self.name, self.argv)

    def announcement(self) -> dict[str, Any]:
        path = self.run_dir / "engines" / "rollout-0.json"
        try:
            body: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return {}
        return body

    def ready_pids(self) -> dict[str, int] | None:
        body = self.announcement()
        return body["pids"] if body.get("ready") else None

    def served_versions(self) -> list[Any]:
        body = {"method": "rlguard_weight_version", "args": []}
        answer = httpx.post(f"{self.url}/collective_rpc", json=body, timeout=30).json()
        results = answer.get("results") if isinstance(answer, dict) else answer
        return [r.get("version") if isinstance(r, dict) else r for r in results]

    def stop(self) -> None:
        pids = self.announcement().get("pids") or {}
        self.stack.stop_one(self.name)
        for pid in pids.values():  # a tree whose host was killed dies with it; be sure
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trl-engine-model")
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--output_dir", str(out), "--size", "engine",
         "--write_initial_model"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def engine(stack: DemoStack, model_dir: Path) -> Iterator[EngineRole]:
    role = EngineRole(stack, "trl-engine", model_dir)
    role.start()
    yield role
    role.stop()


def _rollout_incident(job: TRLJob) -> dict[str, Any] | None:
    """The incident about the job's rollout whose restart_role succeeded."""
    for row in job.stack.incidents():
        if row["job"] != job.job or row["subject"].get("role") != "rollout":
            continue
        inc = job.stack.incident(row["id"])
        restarts = [a for a in inc["actions"] if a["action"] == "restart_role"]
        if restarts and all(a["status"] == "succeeded" for a in restarts):
            return inc
    return None


def test_a_killed_engine_is_healed_by_rlguard_and_trl_trains_on_without_a_restart(
    stack: DemoStack, engine: EngineRole
) -> None:
    job = TRLJob(stack, engine.job, max_steps=MAX_STEPS, save_steps=100,
                 extra=("--size", "engine", "--vllm_server", engine.url,
                        "--vllm_engine_wait", "600"))  # fmt: skip
    try:
        first = job.wait(engine.ready_pids, ENGINE_START_S, "the engine host to announce it ready")
        job.start()
        job.wait(lambda: job.server_step() >= 2, 300, "the server to see the trainer's step 2")
        trainer_pid = job.trainer_pid()
        os.kill(first["worker"], signal.SIGKILL)

        inc = job.wait(lambda: _rollout_incident(job), 120, "the dead engine -> restart_role")
        assert inc["kind"] in ("rollout_engine_dead", "heartbeat_lost"), inc["kind"]
        # Carried out by the engine's launcher at the first try: the trainer's launcher, in the
        # same run directory, leaves a request for a role it does not run.
        assert [a["action"] for a in inc["actions"]].count("restart_role") == 1, inc["actions"]
        assert inc["tier"] == "medium"
        replaced = job.wait(
            lambda: (p := engine.ready_pids()) and p["api_server"] != first["api_server"] and p,
            ENGINE_START_S, "a replacement engine announced ready",
        )  # fmt: skip
        for pid in first.values():  # nothing of the old tree is left
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        assert job.wait_exit(400) == 0, job.logs()

        steps = job.steps()
        assert [s["step"] for s in steps] == list(range(1, MAX_STEPS + 1))
        assert {s["pid"] for s in steps} == {trainer_pid}  # the trainer was never restarted
        trainer_incidents = [
            (i["kind"], i["subject"]) for i in stack.incidents()
            if i["job"] == job.job and i["subject"].get("role") == "trainer"
        ]  # fmt: skip
        assert trainer_incidents == []  # waiting for its engine, it was not taken for hung
        # The replacement serves the version of the last step's generation (v0 for step 1).
        assert engine.served_versions() == [MAX_STEPS - 1]
        assert engine.ready_pids() == replaced
        beat = read_heartbeat(heartbeat_path(engine.run_dir, "rollout", 0)) or {}
        assert beat.get("phase") == "ROLLOUT", beat
        trainer_log = (engine.run_dir / "logs" / "trainer-0.log").read_text(errors="replace")
        assert "retrying once it serves" in trainer_log or "waiting for it" in trainer_log
    finally:
        job.stop()
