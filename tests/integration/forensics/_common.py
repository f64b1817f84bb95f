"""What the hang-forensics tests share: the demo stack with short hang windows, finding a
process's captured stacks on its incident, and the incident page in Chromium."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from app.cli.demo import DemoStack
from tests.harness.chromium import sign_in_as


class HangStack(DemoStack):
    """The demo stack with the hang detector's windows short enough for a test."""

    def _env(self) -> dict[str, str]:
        env = super()._env()
        data = yaml.safe_load(Path(env["RLGUARD_RECOVERY_POLICY_FILE"]).read_text())
        data["detection"]["trainer"].update(hang_min_seconds=4, hang_min_steps=3)
        data["incidents"]["quiet_period_seconds"] = 3
        path = self.workdir / "forensics-policy.yaml"
        path.write_text(yaml.safe_dump(data))
        env["RLGUARD_RECOVERY_POLICY_FILE"] = str(path)
        return env


def stacks_of(stack: DemoStack, job: str, pid: int) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(incident, its stacks_captured entry) for the capture of ``pid``, once there."""
    for row in stack.incidents():
        if row["subject"].get("job") != job:
            continue
        inc = stack.incident(row["id"])
        for e in inc["timeline"]:
            if e["type"] == "stacks_captured" and e["detail"].get("pid") == pid:
                return inc, e
    return None


def shown_in_chromium(stack: DemoStack, browser: object, incident_id: int, function: str) -> None:
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})  # type: ignore[attr-defined]
    page = ctx.new_page()
    page.set_default_timeout(15_000)
    sign_in_as(page, stack.url, stack.user, stack.password)
    page.goto(f"{stack.url}/incidents/{incident_id}")
    from playwright.sync_api import expect

    block = page.locator("[data-testid=stacks]").first
    pre = block.locator("pre")
    if not pre.is_visible():  # a long dump starts collapsed: open it as a person would
        block.locator("summary").click()
    expect(pre).to_be_visible()
    assert function in pre.inner_text()
    # The page polls its timeline while the incident is live: the dump stays open across polls
    # (it folded again at the next poll before hx-preserve).
    poll = page.locator("#incident-live").get_attribute("hx-trigger")
    if poll:
        seconds = float(poll.removeprefix("every ").removesuffix("s"))
        page.evaluate(
            "window.__swaps = 0; document.body.addEventListener("
            "'htmx:afterSettle', () => { window.__swaps += 1; })"
        )
        page.wait_for_function("window.__swaps > 0", timeout=(seconds + 10) * 1000)
        assert pre.is_visible() and block.get_attribute("open") is not None
    assert page.locator("li[data-event='Python stacks captured']").count() >= 1
    ctx.close()
