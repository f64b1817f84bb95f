from __future__ import annotations

import time

import pytest

from app.policy.clock import ManualClock, WallClock


def test_manual_clock_moves_only_forward() -> None:
    c = ManualClock(100.0)
    assert c.now() == 100.0
    assert c.advance(2.5) == 102.5
    assert c.advance_to(110) == 110.0
    with pytest.raises(ValueError, match="cannot go back from 110.0 to 109"):
        c.advance_to(109)
    with pytest.raises(ValueError, match="negative"):
        c.advance(-1)
    assert c.now() == 110.0


def test_wall_clock_is_the_time() -> None:
    assert abs(WallClock().now() - time.time()) < 1.0
