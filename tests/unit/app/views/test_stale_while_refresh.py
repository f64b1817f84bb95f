"""StaleWhileRefresh: the first call computes; within ``fresh_for`` the memo is returned as it
is; past it, one caller starts a background refresh while every caller gets the previous value;
a failing refresh keeps the previous value and logs; past ``stale_for`` or for another key the
caller computes itself."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine
from sqlmodel import Session

from app.views.models.stale_while_refresh import StaleWhileRefresh
from tests.harness.waiting import wait_for


class Counter:
    """A compute function that numbers its results and can be held or made to fail."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, str]] = []
        self.release = threading.Event()
        self.release.set()
        self.fail = False

    def __call__(self, session: Session, now: float) -> str:
        self.release.wait(timeout=30)
        self.calls.append((now, threading.current_thread().name))
        if self.fail:
            raise RuntimeError("database down")
        return f"v{len(self.calls)}@{now:g}"


@pytest.fixture
def session() -> Iterator[Session]:
    engine = create_engine("sqlite://")
    with Session(engine) as s:
        yield s
    engine.dispose()


def _memo() -> StaleWhileRefresh[str]:
    return StaleWhileRefresh(thread_name="test-refresh", what="the test value")


def test_first_call_computes_then_the_memo_serves_within_fresh(session: Session) -> None:
    memo, compute = _memo(), Counter()
    got = [memo.get(session, key="a", now=t, compute=compute, fresh_for=1.0) for t in (100, 100.5)]
    assert got == ["v1@100", "v1@100"]
    assert compute.calls == [(100, threading.current_thread().name)]


def test_past_fresh_one_caller_refreshes_in_the_background_others_get_the_previous_value(
    session: Session,
) -> None:
    memo, compute = _memo(), Counter()
    assert memo.get(session, key="a", now=100, compute=compute, fresh_for=1.0) == "v1@100"
    compute.release.clear()  # the refresh waits until the test lets it finish
    served = [
        memo.get(session, key="a", now=100 + dt, compute=compute, fresh_for=1.0) for dt in (2, 3, 4)
    ]
    assert served == ["v1@100"] * 3
    compute.release.set()
    wait_for(lambda: memo.value == "v2@102", what="the background refresh", interval=0.01)
    # One refresh for the three callers, on its own thread, for the first stale caller's time.
    assert compute.calls[1:] == [(102, "test-refresh")]
    assert memo.get(session, key="a", now=102.5, compute=compute, fresh_for=1.0) == "v2@102"


def test_a_failing_refresh_keeps_the_previous_value_and_logs(
    session: Session, caplog: pytest.LogCaptureFixture
) -> None:
    memo, compute = _memo(), Counter()
    memo.get(session, key="a", now=100, compute=compute, fresh_for=1.0)
    compute.fail = True
    with caplog.at_level(logging.ERROR, logger="rlguard.views.shared"):
        assert memo.get(session, key="a", now=102, compute=compute, fresh_for=1.0) == "v1@100"
        wait_for(lambda: "the test value failed" in caplog.text, what="the log line", interval=0.01)
    assert memo.value == "v1@100"
    # The next stale caller tries again (the failed refresh no longer counts as running).
    compute.fail = False
    wait_for(
        lambda: memo.get(session, key="a", now=103, compute=compute, fresh_for=1.0) == "v3@103",
        what="a second refresh",
        interval=0.01,
    )


def test_past_stale_or_another_key_the_caller_computes_itself(session: Session) -> None:
    memo, compute = _memo(), Counter()
    memo.get(session, key="a", now=100, compute=compute, fresh_for=1.0, stale_for=10.0)
    assert memo.get(session, key="b", now=100.5, compute=compute, fresh_for=1.0) == "v2@100.5"
    late = memo.get(session, key="b", now=200, compute=compute, fresh_for=1.0, stale_for=10.0)
    assert late == "v3@200"
    assert [name for _, name in compute.calls] == [threading.current_thread().name] * 3
    memo.forget()
    assert memo.get(session, key="b", now=200.5, compute=compute, fresh_for=1.0) == "v4@200.5"
