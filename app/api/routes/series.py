"""Series: recent points from the in-memory window."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.api.deps import SeriesStoreDep, ViewerUser
from app.cluster import queries as cluster
from app.cluster.public import SeriesList

router = APIRouter(prefix="/api/v1/series", tags=["series"])


@router.get("", response_model=SeriesList, summary="Points of matching series since a time")
def get_series(
    store: SeriesStoreDep,
    _user: ViewerUser,
    node: Annotated[str | None, Query(max_length=128)] = None,
    name: Annotated[str | None, Query(max_length=200)] = None,
    since: Annotated[
        float | None,
        Query(
            allow_inf_nan=False,
            description="Unix time; negative = seconds before now; default 300 s before now",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> SeriesList:
    data, truncated = cluster.query_series(store, node=node, name=name, since=since, limit=limit)
    return SeriesList(data=data, count=len(data), truncated=truncated)
