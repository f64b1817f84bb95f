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
