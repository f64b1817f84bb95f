"""A real headless Chromium (Debian's ``/usr/bin/chromium``: Playwright's own download cannot
work on this machine) for the dashboard checks outside ``tests/e2e``, and signing in through the
login form as a person would."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.e2e._cluster import CHROMIUM, CHROMIUM_ARGS


@contextmanager
def chromium() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def sign_in_as(page: Any, base_url: str, user: str, password: str) -> None:
    page.goto(f"{base_url}/login")
    page.fill("#username", user)
    page.fill("#password", password)
    with page.expect_navigation():
        page.click("button[type=submit]")
