"""The one way a test waits: poll a condition until it holds or a deadline passes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def wait_for(
    condition: Callable[[], T],
    timeout: float = 30.0,
    what: str = "the condition",
    *,
    interval: float = 0.1,
    context: Callable[[], str] = str,
) -> T:
    """Return ``condition()``'s first truthy value; fail the test after ``timeout`` seconds.

    ``context`` is called only on failure and its text (log tails, counters) is appended to the
    failure message, so a timed-out wait says what the processes were doing.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    extra = context()
    pytest.fail(f"timed out after {timeout} s waiting for {what}" + (f"\n{extra}" if extra else ""))
