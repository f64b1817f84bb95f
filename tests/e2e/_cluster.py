"""A real ``rlguard server`` with fleet data for the browser tests, and Playwright helpers."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.harness import run_cli

ROOT = Path(__file__).resolve().parents[2]


CHROMIUM = "/usr/bin/chromium"


CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


SCREENSHOTS = ROOT / "artifacts" / "screenshots"


PASSWORDS = {"alice": "alice-approves-42", "vera": "vera-only-looks-42"}


NODES = ("gpu-node-a", "gpu-node-b")


@dataclass
class Cluster:
    """The running server and what the tests need to talk to it."""

    base_url: str
    data_dir: Path
    env: dict[str, str]
    node_tokens: dict[str, str]
    user_tokens: dict[str, str]
    process: subprocess.Popen[bytes]
    log_path: Path
    seq: dict[str, int] = field(default_factory=dict)

    def ingest(
        self,
        node: str,
        samples: list[dict[str, object]],
        participants: list[dict[str, object]] | None = None,
    ) -> None:
        """One agent batch, exactly as the node agent posts it; fails the test unless accepted."""
        self.seq[node] = self.seq.get(node, 0) + 1
        body = {
            "agent_id": f"agent-{node}",
            "node": node,
            "seq": self.seq[node],
            "sent_at": time.time(),
            "samples": samples,
            "participants": participants or [],
            "fingerprint": {
                "python": "3.11",
                "torch": "2.13.0",
                "driver": "570.124",
                "cuda": "12.8",
            },
        }
        r = httpx.post(
            f"{self.base_url}/api/v1/ingest",
            json=body,
            headers={"Authorization": f"Bearer {self.node_tokens[node]}"},
            timeout=10,
        )
        assert r.status_code == 200, r.text
        assert r.json()["duplicate"] is False

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


def _cli(env: dict[str, str], *args: str, stdin: str | None = None) -> str:
    done = run_cli(*args, env=env, stdin=stdin)
    assert done.returncode == 0, f"rlguard {' '.join(args)} failed: {done.stderr}"
    return done.stdout.strip()


def sign_in(page: object, base_url: str, name: str) -> None:
    """Log in through the form, as a person would."""
    page.goto(f"{base_url}/login")  # type: ignore[attr-defined]
    page.fill("#username", name)  # type: ignore[attr-defined]
    page.fill("#password", PASSWORDS[name])  # type: ignore[attr-defined]
    with page.expect_navigation():  # type: ignore[attr-defined]
        page.click("button[type=submit]")  # type: ignore[attr-defined]


def screenshot(page: object, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)  # type: ignore[attr-defined]
    return path
