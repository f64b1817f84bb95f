"""The Overview's cluster ETTR tiles (last 24 h, last 7 days), shared by every viewer for 30 s.

The goodput ledger runs a few queries per job and window (tens of ms at four jobs, several
times that on a busy server: the slowest part of the fleet Overview in benchmarks/dashboard.py),
while a day-long ETTR moves by a hair in 30 s and its panel polls once a minute.
"""

from __future__ import annotations

from sqlmodel import Session

from app.core.config import Settings
from app.goodput.dashboard import ClusterTile, cluster_tiles
from app.models import from_epoch
from app.views.models.overview import DashboardCaches

ETTR_TILES_MAX_AGE_SECONDS = 30.0


def cluster_tiles_shared(
    caches: DashboardCaches, session: Session, *, settings: Settings, now: float
) -> list[ClusterTile]:
    key = id(session.get_bind())
    with caches.lock:
        memo = caches.ettr
        if (
            memo.value is not None
            and memo.key == key
            and 0 <= now - memo.built_at < ETTR_TILES_MAX_AGE_SECONDS
        ):
            tiles: list[ClusterTile] = memo.value
            return tiles
    tiles = cluster_tiles(session, now=from_epoch(now), settings=settings)
    with caches.lock:
        if now >= memo.built_at or memo.key != key:
            memo.key, memo.built_at, memo.value = key, now, tiles
    return tiles
