"""A real headless Chromium (Debian's) for the incident page of the hang-forensics test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e._cluster import CHROMIUM, CHROMIUM_ARGS


@pytest.fixture
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()
