"""Keep the garbage collector's full passes off the request path.

A started server holds about 150,000 container objects that live as long as the process
(modules, SQLAlchemy and pydantic metadata, routes, templates). CPython's oldest-generation
collection walks every one of them, which took ~80-180 ms on the 2-core test machine, and ingest
allocates enough short-lived dicts (a parsed 500-sample batch is ~1,000 of them) to trigger such a
pass every few seconds: it showed up as the p99 of every endpoint. ``gc.freeze()`` moves what
exists at the end of start-up into the permanent generation, which collections skip; objects
created afterwards are collected as usual, so nothing leaks that would not leak anyway.

Frozen, the oldest generation holds only what was created since (~16,000 objects: the series
window's deques and keys, caches), and CPython starts a full pass whenever 10 middle-generation
passes have promoted a quarter of that: every ~0.4 s under ingest load. A full pass still walks
every point of every series in the window (the deques' items: 2,000 series x 1,200 points took
80-170 ms on the 2-core machine), so ingest spent ~0.4 ms of CPU per 500-sample batch in them,
more than its validation. While the heap is frozen, a full pass waits for
``OLDEST_PASS_EVERY`` middle-generation passes instead of 10 (every few seconds under load);
young garbage is collected as often as before, and cyclic garbage that reached the oldest
generation is freed a few seconds later than it would have been.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger("rlguard.gc")

OLDEST_PASS_EVERY = 100  # middle-generation passes per full pass (CPython's default: 10)
YOUNG = 1  # the generations FreezeOnGrowth collects before it freezes: 0 and 1, not the oldest
_thresholds: list[tuple[int, int, int]] = []  # the thresholds before freeze_startup_heap


def freeze_startup_heap() -> int:
    """Collect once, then exempt every surviving object from future collections.

    Returns how many objects were frozen. Call it once, when start-up is complete.
    """
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    young, middle, oldest = gc.get_threshold()
    _thresholds.append((young, middle, oldest))
    gc.set_threshold(young, middle, max(oldest, OLDEST_PASS_EVERY))
    frozen = gc.get_freeze_count()
    log.info(
        "start-up heap frozen",
        extra={"objects": frozen, "ms": round((time.perf_counter() - started) * 1000, 1)},
    )
    return frozen


def thaw_heap() -> None:
    """Undo ``freeze_startup_heap`` when the server stops.

    A server process exits right after, but tests and embedding code start and stop many apps
    in one process: without this, each app's cyclic garbage would stay frozen (never freed).
    """
    gc.unfreeze()
    if _thresholds:
        gc.set_threshold(*_thresholds.pop())


class FreezeOnGrowth:
    """Freeze the long-lived heap again each time the series store has grown by a quarter.

    ``freeze_startup_heap`` runs before any agent reports, so the series store (per series a
    deque and a key, ~300,000 tracked objects at 1,000 nodes x 8 GPUs) is built afterwards and
    lands in the oldest generation, which every full pass walks: 40-90 ms each on the 2-core
    machine, and with a fleet's heartbeats promoting ~8,000 participant views a tick one came
    every ~5 policy ticks, the tick's p99 (``benchmarks/detect.py --arrivals``). Frozen, a full
    pass walks only what is younger. A store only grows by nodes joining, so this freezes a few
    times in a server's life; series dropped later are still freed by their reference counts.

    Before freezing it collects the young generations only (``YOUNG``), not all of them: a full
    collection walks every object created since the last freeze, the very objects the freeze is
    for, and holds the GIL throughout. It ran in the tick right after a node's first batch of
    5,000 new series (a flood, or a node joining) and stopped every request for 18-74 ms on the
    2-core machine (``benchmarks/flood.py``), finding 0-5 unreachable objects. Cyclic garbage
    already in the oldest generation is frozen with the rest (kept until the server stops):
    what a few seconds leave there, a few times in a server's life.

    It acts only in a process whose start-up heap was frozen (the server): tests and embedders
    that did not freeze keep the collector as they set it.
    """

    def __init__(self, *, growth: float = 0.25, minimum_series: int = 1_000) -> None:
        self.growth = growth
        self.minimum_series = minimum_series
        self._frozen_at = 0  # the store's size at the last freeze

    def after_tick(self, series: int) -> bool:
        """Freeze if the store (``series`` long) grew enough since the last freeze; whether it did."""
        if not _thresholds or series < self.minimum_series:
            return False
        if series < self._frozen_at * (1 + self.growth):
            return False
        started = time.perf_counter()
        gc.collect(YOUNG)
        gc.freeze()
        self._frozen_at = series
        # Not gc.get_freeze_count(): it walks the whole permanent generation (every object of
        # the server's heap) holding the GIL, 50-90 ms under load, for a number in a log line.
        log.info(
            "long-lived heap frozen again",
            extra={"series": series, "ms": round((time.perf_counter() - started) * 1000, 1)},
        )
        return True
