"""The Silences page in real Chromium against a real ``rlguard server``: an approver (above
operator) silences a node through the form, sees it active, expires it with the htmx button
(after the confirmation) and sees it expired in place; a viewer sees the list and no form, and
the maintenance windows created through the REST API."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e._cluster import Cluster, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(180)]

WAIT_MS = 15_000


def _page(browser: object) -> object:
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})  # type: ignore[attr-defined]
    page = ctx.new_page()
    page.set_default_timeout(WAIT_MS)
    # hx-confirm asks the browser; the person clicks OK.
    page.on("dialog", lambda dialog: dialog.accept())
    return page


def test_silence_created_listed_and_expired_in_the_browser(
    cluster: Cluster, browser: object
) -> None:
    page = _page(browser)
    sign_in(page, cluster.base_url, "alice")
    page.goto(f"{cluster.base_url}/silences")  # type: ignore[attr-defined]
    page.fill("#s-matchers", "node=gpu-node-a, kind=~gpu_.*")  # type: ignore[attr-defined]
    page.fill("#s-duration", "90m")  # type: ignore[attr-defined]
    page.fill("#s-comment", "riser swap")  # type: ignore[attr-defined]
    with page.expect_navigation():  # type: ignore[attr-defined]
        page.get_by_role("button", name="Silence").click()  # type: ignore[attr-defined]
    row = page.locator("#silences-table tbody tr").first  # type: ignore[attr-defined]
    assert row.locator("[data-testid=state]").inner_text() == "active"
    assert "node=gpu-node-a, kind=~gpu_.*" in row.inner_text()
    assert "user:alice" in row.inner_text() and "riser swap" in row.inner_text()
    row.get_by_role("button", name="Expire").click()
    # The htmx swap replaces the table in place: the row's state changes without a reload.
    page.wait_for_function(  # type: ignore[attr-defined]
        "() => document.querySelector('#silences-table [data-testid=state]')"
        "?.textContent === 'expired'"
    )
    assert page.locator("#silences-table").get_by_role("button", name="Expire").count() == 0  # type: ignore[attr-defined]

    r = httpx.post(
        f"{cluster.base_url}/api/v1/maintenance-windows",
        json={"job": "grpo-a", "recurrence": "weekly", "weekday": 6, "start_time": "23:00",
              "duration_minutes": 180, "comment": "cluster upgrade"},
        headers={"Authorization": f"Bearer {cluster.user_tokens['alice']}"},
        timeout=10,
    )  # fmt: skip
    assert r.status_code == 201, r.text
    viewer = _page(browser)
    sign_in(viewer, cluster.base_url, "vera")
    viewer.goto(f"{cluster.base_url}/silences")  # type: ignore[attr-defined]
    assert viewer.locator("[data-testid=silence-form]").count() == 0  # type: ignore[attr-defined]
    assert "riser swap" in viewer.locator("#silences-table").inner_text()  # type: ignore[attr-defined]
    window = viewer.locator(f"[data-testid=window-{r.json()['id']}]")  # type: ignore[attr-defined]
    assert window.locator("[data-testid=state]").inner_text() in ("open", "scheduled")
    text = window.inner_text()
    assert "job grpo-a" in text and "every Sunday 23:00 UTC for 180 min" in text, text
    assert "user:alice" in text and "cluster upgrade" in text
