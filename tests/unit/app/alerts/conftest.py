from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.unit.app.alerts._recording_server import RecordingServer


@pytest.fixture
def server() -> Iterator[RecordingServer]:
    srv = RecordingServer()
    try:
        yield srv
    finally:
        srv.stop()
