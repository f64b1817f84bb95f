"""The dashboard in real Chromium against a real ``rlguard server``, fed only through ingest.

One server for the module; the tests run in file order because they follow one incident's life:
the fault appears on the overview without a reload, a viewer and a CSRF-less request cannot
decide it, an approver approves it from the approvals page and the open incident page shows it.
Screenshots land in ``artifacts/screenshots/`` (the committed copies are in docs/screenshots/).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.e2e import fleet
from tests.e2e._cluster import NODES, Cluster, screenshot, sign_in

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(240)]

DESKTOP = {"width": 1440, "height": 900}
PHONE = {"width": 390, "height": 844}
WAIT_MS = 45_000  # the policy tick, the outbox and a 3-5 s polling interval, on a loaded machine


@dataclass
class Story:
    cluster: Cluster
    agents: fleet.Agents
    incident_id: int | None = None
    approval_id: int | None = None


@pytest.fixture(scope="module")
def story(cluster: Cluster) -> Iterator[Story]:
    fleet.backfill(cluster)
    agents = fleet.Agents(cluster).start()
    try:
        yield Story(cluster, agents)
    finally:
        agents.stop()


def _page(browser: object, *, phone: bool = False) -> object:
    ctx = browser.new_context(  # type: ignore[attr-defined]
        viewport=PHONE if phone else DESKTOP,
        device_scale_factor=2 if phone else 1,
        is_mobile=phone,
        has_touch=phone,
    )
    page = ctx.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on(
        "console",
        lambda msg: (
            errors.append(msg.text) if msg.type == "error" and "403" not in msg.text else None
        ),
    )
    page.js_errors = errors  # type: ignore[attr-defined]
    return page


def _pending_approval(story: Story, page: object) -> tuple[int, int]:
    """Waits (on the approvals page, as a person would) for the heavy incident's approval."""
    base = story.cluster.base_url
    page.goto(f"{base}/approvals")  # type: ignore[attr-defined]
    card = page.wait_for_selector("[data-approval][data-status=pending]")  # type: ignore[attr-defined]
    approval_id = int(card.get_attribute("data-approval"))
    href = card.query_selector("a[href^='/incidents/']").get_attribute("href")
    incident_id = int(href.rsplit("/", 1)[1])
    story.approval_id, story.incident_id = approval_id, incident_id
    return approval_id, incident_id


def _csrf(page: object) -> str:
    headers = page.get_attribute("body", "hx-headers")  # type: ignore[attr-defined]
    match = re.search(r'"X-CSRF-Token": "([^"]+)"', headers or "")
    assert match, headers
    return match.group(1)


def _post(page: object, path: str, headers: dict[str, str]) -> dict[str, object]:
    """A request made by the page itself (same origin, its cookies), bypassing the UI."""
    return page.evaluate(  # type: ignore[attr-defined,no-any-return]
        """async ([path, headers]) => {
            const body = new URLSearchParams({comment: "trying"});
            const r = await fetch(path, {method: "POST", headers: {...headers, "HX-Request": "true"}, body});
            return {status: r.status, reason: r.headers.get("X-RLGuard-Reason")};
        }""",
        [path, headers],
    )


def test_login_and_overview_shows_a_fault_without_reload(story: Story, browser: object) -> None:
    base = story.cluster.base_url
    page = _page(browser)
    page.goto(f"{base}/")  # type: ignore[attr-defined]
    assert "/login" in page.url  # type: ignore[attr-defined]
    sign_in(page, base, "alice")
    assert page.url == f"{base}/"  # type: ignore[attr-defined]
    for node in NODES:
        page.wait_for_selector(f'[data-node="{node}"]')  # type: ignore[attr-defined]
    assert page.locator(".node-card .gpu-dot").count() == 16  # type: ignore[attr-defined]
    page.wait_for_selector("#overview-incidents")  # type: ignore[attr-defined]
    assert page.locator("#overview-incidents .badge.heavy").count() == 0  # type: ignore[attr-defined]
    page.evaluate("window.__sameDocument = true")  # type: ignore[attr-defined]

    story.agents.break_storage(NODES[0])  # the trainer's run directory stops being writable

    row = page.wait_for_selector("#overview-incidents [data-incident]:has(.badge.heavy)")  # type: ignore[attr-defined]
    assert "storage" in row.inner_text().lower() or "state" in row.inner_text().lower(), (
        row.inner_text()
    )
    page.wait_for_selector(f'[data-node="{NODES[0]}"][data-level="bad"]')  # type: ignore[attr-defined]
    page.wait_for_function(  # type: ignore[attr-defined]
        "document.querySelector('[data-testid=pending-approvals]').textContent.trim() !== '0'"
    )
    assert page.evaluate("window.__sameDocument === true")  # type: ignore[attr-defined]
    screenshot(page, "overview-desktop")
    assert page.js_errors == []  # type: ignore[attr-defined]


def test_viewer_cannot_approve(story: Story, browser: object) -> None:
    page = _page(browser)
    sign_in(page, story.cluster.base_url, "vera")
    approval_id, _ = _pending_approval(story, page)
    card = page.locator(f"#approval-{approval_id}")  # type: ignore[attr-defined]
    assert card.get_by_role("button", name="Approve").count() == 0
    assert "can see this request but not decide it" in card.inner_text()
    # Even a hand-made request with a valid CSRF token is refused for this role.
    answer = _post(page, f"/approvals/{approval_id}/approve", {"X-CSRF-Token": _csrf(page)})
    assert answer["status"] == 403, answer
    assert "approver role" in str(answer["reason"])
    page.reload()  # type: ignore[attr-defined]
    assert page.locator(f"#approval-{approval_id}").get_attribute("data-status") == "pending"  # type: ignore[attr-defined]


def test_approve_without_csrf_token_is_rejected(story: Story, browser: object) -> None:
    page = _page(browser)
    sign_in(page, story.cluster.base_url, "alice")
    approval_id, _ = _pending_approval(story, page)
    answer = _post(page, f"/approvals/{approval_id}/approve", {})
    assert answer == {"status": 403, "reason": "CSRF token missing"}
    answer = _post(page, f"/approvals/{approval_id}/approve", {"X-CSRF-Token": "x" + _csrf(page)})
    assert answer == {"status": 403, "reason": "CSRF token invalid"}
    page.reload()  # type: ignore[attr-defined]
    assert page.locator(f"#approval-{approval_id}").get_attribute("data-status") == "pending"  # type: ignore[attr-defined]


def test_mobile_viewport_renders_the_approval_page(story: Story, browser: object) -> None:
    page = _page(browser, phone=True)
    base = story.cluster.base_url
    sign_in(page, base, "alice")
    approval_id, _ = _pending_approval(story, page)
    screenshot(page, "approvals-phone")
    page.goto(f"{base}/approvals/{approval_id}")  # type: ignore[attr-defined]  # the alert's link
    approve = page.get_by_role("button", name="Approve")  # type: ignore[attr-defined]
    reject = page.get_by_role("button", name="Reject")  # type: ignore[attr-defined]
    assert approve.is_visible() and reject.is_visible()
    for button in (approve, reject):
        box = button.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
        assert box["height"] >= 40  # a finger can hit it
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]  # type: ignore[attr-defined]
    comment = page.get_by_label("Comment (kept in the audit log)")  # type: ignore[attr-defined]
    assert comment.is_visible()
    # Keyboard: from the comment box, Tab reaches Approve, and the focus ring is visible.
    comment.click()
    page.keyboard.press("Tab")  # type: ignore[attr-defined]
    focused = page.evaluate(  # type: ignore[attr-defined]
        "(() => { const e = document.activeElement, s = getComputedStyle(e);"
        " return [e.textContent.trim(), s.outlineStyle, s.outlineWidth]; })()"
    )
    assert focused[0] == "Approve" and focused[1] == "solid" and focused[2] != "0px", focused
    assert page.js_errors == []  # type: ignore[attr-defined]


def test_approver_approves_and_the_incident_timeline_updates(story: Story, browser: object) -> None:
    base = story.cluster.base_url
    watcher = _page(browser)
    sign_in(watcher, base, "alice")
    approver = _page(browser)
    sign_in(approver, base, "alice")
    approval_id, incident_id = _pending_approval(story, approver)
    screenshot(approver, "approvals-desktop")

    watcher.goto(f"{base}/incidents/{incident_id}")  # type: ignore[attr-defined]
    watcher.wait_for_selector('[data-event="Approval requested"]')  # type: ignore[attr-defined]
    assert watcher.locator('[data-event="Approved"]').count() == 0  # type: ignore[attr-defined]
    watcher.evaluate("window.__sameDocument = true")  # type: ignore[attr-defined]

    card = approver.locator(f"#approval-{approval_id}")  # type: ignore[attr-defined]
    card.get_by_label("Comment (kept in the audit log)").fill(
        "Checkpoint verified; restore approved"
    )
    approver.once("dialog", lambda dialog: dialog.accept())  # type: ignore[attr-defined]
    card.get_by_role("button", name="Approve").click()
    approver.wait_for_selector(f'#approval-{approval_id}[data-status="approved"]')  # type: ignore[attr-defined]
    verdict = approver.locator(f"#approval-{approval_id} [data-testid=verdict]").inner_text()  # type: ignore[attr-defined]
    assert "Approved by alice" in verdict and "Checkpoint verified" in verdict

    # The incident page that was already open picks the decision up by itself.
    event = watcher.wait_for_selector('[data-event="Approved"]')  # type: ignore[attr-defined]
    assert "user:alice" in event.inner_text()
    assert watcher.evaluate("window.__sameDocument === true")  # type: ignore[attr-defined]
    screenshot(watcher, "incident-desktop")
    assert approver.js_errors == [] and watcher.js_errors == []  # type: ignore[attr-defined]


def _check_timeline_and_checkpoints(page: object) -> None:
    """The phases the agents reported while the tests ran, and the trainer's checkpoints."""
    for who in ("trainer/0", "rollout/1"):
        role = who.split("/")[0]
        bands = page.eval_on_selector_all(  # type: ignore[attr-defined]
            f'[data-testid=phase-timeline] [data-lane="{who}"] .band',
            "els => els.map(e => [e.dataset.phase, parseFloat(e.style.left), parseFloat(e.style.width)])",
        )
        phases = [b[0] for b in bands]
        assert len(set(phases)) >= 2, (who, phases)  # the tests ran through a phase change
        cycle = [p for p, _ in fleet.PHASE_CYCLE[role]]
        assert set(phases) <= set(cycle), phases
        # Only changes are recorded (a report every 2 s repeats the phase most of the time), and
        # mostly in the cycle's order (a slow round on a loaded machine may skip a short phase).
        pairs = list(zip(phases, phases[1:], strict=False))
        assert all(before != after for before, after in pairs), phases
        in_order = [a == cycle[(cycle.index(b) + 1) % len(cycle)] for b, a in pairs]
        assert sum(in_order) >= len(in_order) / 2, phases
        for (_, left, width), (_, nxt, _) in zip(bands, bands[1:], strict=False):
            assert abs(left + width - nxt) < 0.05  # bands follow each other without gaps
        last = bands[-1]
        assert abs(last[1] + last[2] - 100) < 0.05  # the current phase runs to now
        lane = page.locator(f'[data-lane="{who}"]')  # type: ignore[attr-defined]
        assert lane.get_attribute("data-current") == phases[-1]
    card = page.locator('[data-checkpoint="trainer/0"]')  # type: ignore[attr-defined]
    assert card.locator("[data-testid=ckpt-step]").inner_text() == "50"
    assert card.locator("[data-testid=ckpt-inference]").inner_text() == "12"
    commits = page.eval_on_selector_all(  # type: ignore[attr-defined]
        "[data-testid=checkpoint-versions] tr[data-commit]", "els => els.map(e => e.dataset.commit)"
    )
    assert commits[:2] == ["50", "25"], commits


def test_screenshots_of_job_and_phone_pages(story: Story, browser: object) -> None:
    base = story.cluster.base_url
    desktop = _page(browser)
    sign_in(desktop, base, "alice")
    # By now the backfilled minutes are rolled up: the overview again, with its sparklines.
    desktop.wait_for_selector(".node-card .js-chart canvas")  # type: ignore[attr-defined]
    desktop.wait_for_timeout(4000)  # type: ignore[attr-defined]  # one polling round
    screenshot(desktop, "overview-desktop")
    desktop.goto(f"{base}/jobs/{fleet.JOB}")  # type: ignore[attr-defined]
    desktop.wait_for_selector(".js-chart canvas")  # type: ignore[attr-defined]
    desktop.wait_for_selector('[data-participant="trainer/0"]')  # type: ignore[attr-defined]
    _check_timeline_and_checkpoints(desktop)
    screenshot(desktop, "job-desktop")
    phone = _page(browser, phone=True)
    sign_in(phone, base, "alice")
    phone.wait_for_selector(".node-card")  # type: ignore[attr-defined]
    screenshot(phone, "overview-phone")
    phone.goto(f"{base}/jobs/{fleet.JOB}")  # type: ignore[attr-defined]
    phone.wait_for_selector(".js-chart canvas")  # type: ignore[attr-defined]
    screenshot(phone, "job-phone")
    if story.incident_id is not None:
        phone.goto(f"{base}/incidents/{story.incident_id}")  # type: ignore[attr-defined]
        phone.wait_for_selector('[data-testid="timeline"] li')  # type: ignore[attr-defined]
        screenshot(phone, "incident-phone")
    for page in (desktop, phone):
        assert page.evaluate("document.documentElement.scrollWidth") <= page.viewport_size["width"]  # type: ignore[attr-defined]
        assert page.js_errors == []  # type: ignore[attr-defined]
