"""A real headless Chromium (Debian's) for the incident page of the hang-forensics test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness.chromium import chromium


@pytest.fixture
def browser() -> Iterator[object]:
    with chromium() as b:
        yield b
