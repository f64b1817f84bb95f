"""The server keeps its start-up heap out of the garbage collector's full passes (p99 latency)."""

from __future__ import annotations

import gc
from collections.abc import Callable

from tests.harness import Api


def test_startup_heap_is_frozen_while_serving_and_thawed_at_stop(
    migrated_url: str, make_api: Callable[..., Api]
) -> None:
    gc.unfreeze()
    api = make_api(migrated_url)
    assert gc.get_freeze_count() > 10_000  # modules, metadata, routes: the long-lived heap
    assert api.client.get("/healthz").status_code == 200
    api.client.close()
    assert gc.get_freeze_count() == 0  # cyclic garbage of a stopped app can be freed again


def test_full_passes_are_rarer_while_serving_and_the_thresholds_come_back_at_stop(
    migrated_url: str, make_api: Callable[..., Api]
) -> None:
    from app.core.gc_tuning import OLDEST_PASS_EVERY

    before = gc.get_threshold()
    assert before[2] < OLDEST_PASS_EVERY  # CPython's default (10)
    api = make_api(migrated_url)
    assert gc.get_threshold() == (before[0], before[1], OLDEST_PASS_EVERY)
    assert api.client.get("/healthz").status_code == 200
    api.client.close()
    assert gc.get_threshold() == before
