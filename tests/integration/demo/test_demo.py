"""`rlguard demo` for a bounded time: the light, heavy and medium incidents appear and are
handled (the heavy one approved through the REST API), training continues, and Ctrl-C (SIGINT)
leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import free_port, spawn, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[3]


def _descendants(root: int) -> set[int]:
    """Every live process below ``root`` (by parent pid, whatever session it started)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {root}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_demo_handles_light_heavy_medium_and_stops_clean(tmp_path: Path) -> None:
    port = free_port()
    workdir = tmp_path / "demo"
    out = (tmp_path / "demo.out").open("ab")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLGUARD_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = spawn(
        [
            sys.executable,
            "-c",
            "from app.cli import main; main()",
            "demo",
            "--dir",
            str(workdir),
            "--port",
            str(port),
            "--steps",
            "10",
            "--duration",
            "280",
        ],
        cwd=ROOT,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )

    def log() -> str:
        parts = [(tmp_path / "demo.out").read_text(errors="replace")[-2000:]]
        for f in sorted((workdir / "logs").glob("*.log")) if (workdir / "logs").is_dir() else []:
            parts.append(f"--- {f.name}\n{f.read_text(errors='replace')[-2000:]}")
        return "\n".join(parts)

    def wait(pred: Any, timeout: float, what: str) -> Any:
        def checked() -> Any:
            assert proc.poll() is None, f"demo exited {proc.returncode}: {log()}"
            return pred()

        return wait_for(checked, timeout, what, interval=0.5, context=log)

    try:
        login = wait(
            lambda: (
                (workdir / "demo-login.txt").exists()
                and dict(
                    line.split(": ", 1)
                    for line in (workdir / "demo-login.txt").read_text().splitlines()
                )
            ),
            120,
            "the demo login",
        )
        assert (tmp_path / "demo.out").read_text().count(f"http://127.0.0.1:{port}/") >= 1
        http = httpx.Client(
            base_url=login["url"],
            headers={"Authorization": f"Bearer {login['api_token']}"},
            timeout=10,
        )

        def incident(kind: str, tier: str, **subject: str) -> dict[str, Any] | None:
            for inc in http.get("/api/v1/incidents").json()["incidents"]:
                if (
                    inc["kind"] == kind
                    and inc["tier"] == tier
                    and all(str(inc["subject"].get(k)) == v for k, v in subject.items())
                ):
                    return dict(http.get(f"/api/v1/incidents/{inc['id']}").json())
            return None

        light = wait(lambda: incident("gpu_throttled", "light"), 90, "the light incident")
        assert light["actions"] == []  # light: recorded and alerted, nothing to run
        heavy = wait(
            lambda: incident("heartbeat_lost", "heavy", role="trainer"), 90, "the heavy incident"
        )
        assert any("first step" in r for r in heavy["reasons"]), heavy["reasons"]
        wait(
            lambda: (incident("heartbeat_lost", "heavy", role="trainer") or {}).get("safe_mode"),
            30,
            "SAFE_MODE (automatic for the heavy tier)",
        )
        assert (
            json.loads((workdir / "runs" / "grpo-demo" / "control.json").read_text())["mode"]
            == "safe_mode"
        )
        pending = wait(lambda: http.get("/api/v1/approvals").json(), 30, "the approval request")
        r = http.post(
            f"/api/v1/approvals/{pending[0]['id']}/approve", json={"comment": "test approves"}
        )
        assert r.status_code == 200, r.text

        def action_status(inc_kind: str, tier: str, action: str, **subject: str) -> str | None:
            inc = incident(inc_kind, tier, **subject)
            acts = [a for a in (inc or {}).get("actions", []) if a["action"] == action]
            return (
                acts[0]["status"] if acts and acts[0]["status"] in ("succeeded", "failed") else None
            )

        assert (
            wait(
                lambda: action_status("heartbeat_lost", "heavy", "restart_job", role="trainer"),
                60,
                "the approved restart_job",
            )
            == "succeeded"
        )
        medium = wait(
            lambda: incident("heartbeat_lost", "medium", role="rollout", rank="1"),
            120,
            "the medium incident (rollout killed)",
        )
        assert medium["tier"] == "medium"
        assert (
            wait(
                lambda: action_status(
                    "heartbeat_lost", "medium", "restart_role", role="rollout", rank="1"
                ),
                60,
                "the rollout's restart",
            )
            == "succeeded"
        )
        # Training went on past the medium fault (scheduled at step 4).
        wait(lambda: (workdir / "runs" / "grpo-demo" / "DONE").exists(), 150, "the job to finish")
        http.close()
    finally:
        tree = _descendants(proc.pid)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        finally:
            out.close()
    assert len(tree) >= 5, f"expected server, worker, agent, launcher and job processes, got {tree}"
    wait_for(
        lambda: not [p for p in tree if _alive(p)],
        10,
        "every demo process to exit after Ctrl-C",
        context=lambda: f"left behind: {[p for p in tree if _alive(p)]}",
    )
