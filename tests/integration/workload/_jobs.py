"""Helpers to run the reference job in tests: start the launcher, wait on its timeline."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.harness import spawn, wait_for
from workload.job import RunDir, read_events, read_json

ROOT = Path(__file__).resolve().parents[3]


class Job:
    def __init__(self, run_dir: Path, steps: int, *extra: str, decode_ms: float = 5.0) -> None:
        self.run = RunDir(run_dir)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.log = open(run_dir.parent / f"{run_dir.name}-launch.log", "ab")  # noqa: SIM115
        self.proc = spawn(
            [
                sys.executable,
                "-m",
                "workload.launch",
                "--run-dir",
                str(run_dir),
                "--steps",
                str(steps),
                "--decode-ms",
                str(decode_ms),
                "--timeout",
                "200",
                *extra,
            ],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [e for e in read_events(self.run) if kind is None or e["kind"] == kind]

    def wait(self, pred: Callable[[], Any], timeout: float, what: str) -> Any:
        def checked() -> Any:
            value = pred()
            if not value and self.proc.poll() is not None:
                raise AssertionError(
                    f"launcher exited {self.proc.returncode} while waiting for {what}: "
                    f"{self.logs()}"
                )
            return value

        return wait_for(checked, timeout, what, context=self.logs)

    def wait_step(self, step: int, timeout: float = 120.0) -> None:
        self.wait(
            lambda: any(e.get("step", -1) >= step for e in self.events("step")),
            timeout,
            f"step {step}",
        )

    def hook(self, action: str, *args: str, key: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "workload.launch",
                "hook",
                action,
                "--job",
                self.run.root.name,
                "--run-root",
                str(self.run.root.parent),
                "--idempotency-key",
                key,
                *args,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )

    def finish(self, timeout: float = 180.0) -> dict[str, Any]:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"job did not finish: {self.logs()}") from exc
        assert code == 0, self.logs()
        final = read_json(self.run.final)
        assert final is not None
        return final

    def logs(self) -> str:
        out = []
        for f in sorted((self.run.root / "logs").glob("*.log")):
            out.append(f"--- {f.name}\n{f.read_text(errors='replace')[-1500:]}")
        launch = self.run.root.parent / f"{self.run.root.name}-launch.log"
        out.append(f"--- launch\n{launch.read_text(errors='replace')[-1500:]}")
        return "\n".join(out)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        else:
            try:  # children that outlived a crashed launcher (never expected)
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.log.close()


def consumed(job: Job | RunDir) -> dict[tuple[int, str], str]:
    """(step, batch) → sha256 of what the trainer consumed (last consumption wins), of a job
    these helpers launched or of any run directory (a job submitted to Ray's Jobs API)."""
    run = job.run if isinstance(job, Job) else job
    return {
        (e["step"], e["batch"]): e["sha256"] for e in read_events(run) if e["kind"] == "consumed"
    }


def assert_same_end(faulty: Job, clean: Job, steps: int, *, timeout: float = 180.0) -> None:
    """Both runs to their end (each within ``timeout`` s from here): the same final step
    (``steps``) and parameters, bit for bit, and every batch the faulty run's trainer consumed
    byte-identical to the clean run's."""
    final_faulty, final_clean = faulty.finish(timeout), clean.finish(timeout)
    assert final_faulty["step"] == final_clean["step"] == steps
    assert final_faulty["params_sha256"] == final_clean["params_sha256"]
    assert consumed(faulty) == consumed(clean)


def dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True)
