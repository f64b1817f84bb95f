"""A TRL GRPO job (examples/trl_grpo/train.py, tiny size) under the real ``rlguard launch``,
watched by a real stack (``app.cli.demo.DemoStack``: ``rlguard up`` = server + policy engine +
Celery worker on embedded SQLite, and a node agent), and what the tests read from it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from app.cli.demo import DemoStack
from integrations.trl.checkpoints import MARKER_NAME, newest_complete_checkpoint
from recovery.report import heartbeat_path, read_heartbeat
from tests.harness import kill_group, spawn, wait_for

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "trl_grpo" / "train.py"


def use_launch_hook(stack: DemoStack) -> None:
    """Make ``rlguard launch`` (integrations.launch) the stack's launcher hook."""
    subprocess.run(
        [sys.executable, "-m", "integrations.launch", "write-hook",
         str(stack.workdir / "launcher-hook"), "--run-root", str(stack.run_root)],
        cwd=ROOT, env=stack._env(), check=True, timeout=60, capture_output=True,
    )  # fmt: skip


class TRLJob:
    """One launch of the example: ``rlguard launch --integration trl -- python train.py ...``."""

    def __init__(
        self,
        stack: DemoStack,
        job: str,
        *,
        max_steps: int,
        save_steps: int,
        extra: tuple[str, ...] = (),
        snapshots: bool = False,
    ) -> None:
        self.stack = stack
        self.job = job
        self.run_dir = stack.run_root / job
        self.out = stack.workdir / f"{job}-out"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.out.mkdir(parents=True, exist_ok=True)
        self.max_steps = max_steps
        self.argv = [
            sys.executable, "-m", "integrations.launch", "--job", job, "--role", "trainer",
            "--run-dir", str(self.run_dir), "--integration", "trl", "--max-restarts", "4",
            "--backoff", "0.2", "--timeout", "400", "--",
            sys.executable, str(EXAMPLE), "--output_dir", str(self.out), "--max_steps", str(max_steps),
            "--save_steps", str(save_steps), "--size", "tiny", "--min_step_seconds", "0.2",
            # Without memory snapshots a restart resumes from checkpoint-N, the path these
            # tests are about; test_trl_snapshots.py turns them on.
            "--snapshots", "on" if snapshots else "off", *extra,
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # Its own agent, watching this job's run directory.
        self.stack.job = self.job
        self.stack.stop_one("agent")
        self.stack.start_agent()
        self.proc = self.stack._spawn(f"launch-{self.job}", self.argv)

    # ---- reading ------------------------------------------------------------------------------

    def heartbeat(self) -> dict[str, Any]:
        return read_heartbeat(heartbeat_path(self.run_dir, "trainer", 0)) or {}

    def trainer_pid(self) -> int | None:
        """The pid of the training process reporting for itself now (not the launcher's
        STARTING placeholder, not an exited one)."""
        beat = self.heartbeat()
        if beat.get("phase") in (None, "STARTING", "EXITED", "INIT", "DONE"):
            return None
        pid = beat.get("pid")
        return pid if isinstance(pid, int) else None

    def steps(self) -> list[dict[str, Any]]:
        path = self.out / "steps.jsonl"
        if not path.exists():
            return []
        lines = path.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def sealed(self, step: int) -> bool:
        return (self.out / f"checkpoint-{step}" / MARKER_NAME).exists()

    def newest_complete(self) -> int | None:
        newest = newest_complete_checkpoint(self.out)
        return None if newest is None else newest.global_step

    def server_step(self) -> int:
        r = self.stack.api("GET", f"/api/v1/jobs/{self.job}")
        if r.status_code != 200:
            return -1
        return max((p["step"] for p in r.json()["participant_list"]), default=-1)

    def incident(self, kind: str) -> dict[str, Any] | None:
        for inc in self.stack.incidents():
            if inc["kind"] == kind and inc["job"] == self.job:
                return self.stack.incident(inc["id"])
        return None

    def action_done(self, kind: str, action: str) -> dict[str, Any] | None:
        inc = self.incident(kind)
        done = [a for a in (inc or {}).get("actions", []) if a["action"] == action]
        return inc if done and all(a["status"] == "succeeded" for a in done) else None

    # ---- waiting ------------------------------------------------------------------------------

    def wait(self, pred: Callable[[], Any], timeout: float, what: str) -> Any:
        return wait_for(pred, timeout, what, interval=0.05, context=self.logs)

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the launch did not finish\n{self.logs()}") from None

    def logs(self) -> str:
        parts = []
        files = [*sorted((self.run_dir / "logs").glob("*.log")),
                 self.stack.workdir / "logs" / f"launch-{self.job}.log",
                 self.stack.workdir / "logs" / "server.log"]  # fmt: skip
        for f in files:
            if f.exists():
                parts.append(f"--- {f.name}\n{f.read_text(errors='replace')[-2500:]}")
        parts.append(f"--- heartbeat {self.heartbeat()}")
        parts.append(
            f"--- incidents {[(i['kind'], i['job'], i['status']) for i in self.stack.incidents()]}"
        )
        return "\n".join(parts)

    def stop(self) -> None:
        """SIGTERM the launcher (it stops its trainer), SIGKILL what is left."""
        pid = self.heartbeat().get("pid")
        self.stack.stop_one(f"launch-{self.job}")
        if isinstance(pid, int):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def opened_at(inc: dict[str, Any]) -> float:
    return datetime.fromisoformat(inc["opened_at"].replace("Z", "+00:00")).timestamp()


def freeze(pid: int) -> None:
    """SIGSTOP ``pid`` so the test reads a state that cannot move under it before a kill."""
    os.kill(pid, signal.SIGSTOP)


@dataclass
class TRLStack(DemoStack):
    """The demo's stack with detection tuned to the tiny job: a hang is judged after
    max(6 s, 10 x the median step) once two step times are seen, and a silent heartbeat only
    after 15 + 105 s, so that a SIGSTOPped trainer is seen hung (train_hang) before it is seen
    lost. The steps take 0.2 s on an idle machine and 3.5 s were seen on a loaded CI machine
    (four test workers): a 35 s hang limit, more than the 30 s silence limit first chosen, and
    the trainer was seen lost first. 120 s leaves room for steps up to 12 s. An exit is seen at
    once either way (EXITED), so the kill tests do not wait on the silence limit."""

    def _env(self) -> dict[str, str]:
        env = super()._env()
        path = Path(env["RLGUARD_RECOVERY_POLICY_FILE"])
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        data["detection"]["trainer"].update(
            hang_min_seconds=6, hang_step_factor=10, hang_min_steps=2
        )
        data["detection"]["heartbeat"].update(suspect_seconds=15, confirm_seconds=105)
        path.write_text(yaml.safe_dump(data), encoding="utf-8")
        return env


class LaunchedRun:
    """One ``rlguard launch --integration trl`` of the example (tiny size) with memory
    snapshots, on its own: RLGuard's restart request is made with the real launcher hook
    (``python -m integrations.launch hook restart_role``), the command the server's worker runs,
    so the kill tests need no server. What a run did is read from its files."""

    def __init__(
        self,
        root: Path,
        job: str,
        *,
        max_steps: int = 6,
        save_steps: int = 3,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.root = root
        self.job = job
        self.run_dir = root / job
        self.out = root / f"{job}-out"
        self.log = root / f"launch-{job}.log"
        self.max_steps = max_steps
        self.argv = [
            sys.executable, "-m", "integrations.launch", "--job", job, "--role", "trainer",
            "--run-dir", str(self.run_dir), "--integration", "trl", "--max-restarts", "4",
            "--backoff", "0.2", "--timeout", "400", "--",
            sys.executable, str(EXAMPLE), "--output_dir", str(self.out), "--max_steps", str(max_steps),
            "--save_steps", str(save_steps), "--size", "tiny", "--snapshots", "on", *extra,
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None
        self._restarts = 0

    def start(self) -> None:
        from integrations.snapshot_owner import segment_path

        self.segment = segment_path(Path("/dev/shm"), self.job, self.run_dir)
        self.proc = spawn(self.argv, log=self.log, cwd=ROOT)

    def events(self, kind: str) -> list[dict[str, Any]]:
        path = self.run_dir / "events.jsonl"
        if not path.exists():
            return []
        lines = path.read_text(encoding="utf-8").splitlines()
        return [e for e in (json.loads(x) for x in lines if x.strip()) if e.get("kind") == kind]

    def wait_exits(self, count: int, timeout: float = 240) -> None:
        wait_for(lambda: len(self.events("child_exit")) >= count, timeout,
                 f"{count} trainer exit(s)", interval=0.05, context=self.logs)  # fmt: skip

    def restart(self) -> None:
        """Ask the launcher to restart the trainer, as RLGuard's restart_role action does."""
        self._restarts += 1
        done = subprocess.run(
            [sys.executable, "-m", "integrations.launch", "hook", "restart_role",
             f"--job={self.job}", "--role=trainer", "--rank=0",
             f"--idempotency-key={self.job}-restart-{self._restarts}",
             f"--run-root={self.root}", "--wait=120"],
            cwd=ROOT, capture_output=True, timeout=180,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()

    def finish(self, timeout: float = 300) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the launch did not finish\n{self.logs()}") from None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            kill_group(self.proc)
        pid = (read_heartbeat(heartbeat_path(self.run_dir, "trainer", 0)) or {}).get("pid")
        if isinstance(pid, int):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(getattr(self, "segment", self.root / "none"), ignore_errors=True)

    # ---- reading ------------------------------------------------------------------------------

    def heartbeat(self) -> dict[str, Any]:
        return read_heartbeat(heartbeat_path(self.run_dir, "trainer", 0)) or {}

    def steps(self) -> list[tuple[int, int]]:
        """``(step, pid)`` of every optimizer step that finished, in order."""
        path = self.out / "steps.jsonl"
        if not path.exists():
            return []
        lines = path.read_text(encoding="utf-8").splitlines()
        return [(d["step"], d["pid"]) for d in (json.loads(x) for x in lines if x.strip())]

    def trainer_log(self) -> str:
        path = self.run_dir / "logs" / "trainer-0.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self) -> str:
        launch = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
        return f"--- launch\n{launch}\n--- trainer\n{self.trainer_log()[-5000:]}"

    def final(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The final parameters and the per-step log (step, loss, reward) of the run."""
        from safetensors.torch import load_file

        last = self.out / f"checkpoint-{self.max_steps}"
        params = load_file(str(last / "model.safetensors"))
        history = json.loads((last / "trainer_state.json").read_text(encoding="utf-8"))
        logged = [
            {k: entry.get(k) for k in ("step", "loss", "reward", "reward_std", "kl")}
            for entry in history["log_history"]
            if "loss" in entry
        ]
        return params, logged
