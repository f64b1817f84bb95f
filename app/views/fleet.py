"""The Overview's fleet view (above ``dashboard.fleet_view_above_nodes`` nodes): the GPU heat map
and the node list, each a partial the page loads lazily and then polls, with the filters (job,
state, tier) and page numbers in the query string. A malformed one is a 422 naming it (the
dashboard's handler in ``app/views/__init__.py``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse
from sqlmodel import Session

from app.cluster import queries as cluster_queries
from app.views.context import DbDep, PageContext, Runtime, RuntimeDep, SignedInDep
from app.views.models.fleet import (
    GRID_PAGE_NODES,
    LIST_PAGE_NODES,
    MAX_JOB_FILTER,
    MAX_PAGE,
    FleetFilters,
    Judge,
    StateFilter,
    TierFilter,
    paginate,
    select_nodes,
    shared_node_states,
)
from app.views.models.incidents import open_incident_counts, open_tiers_by_node
from app.views.models.overview import NodeStates
from app.views.rendering import render

router = APIRouter(include_in_schema=False)

FLEET_POLL_SECONDS = 5  # a 1,000-node judgement per poll and viewer: less often than the cards


def fleet_filters(
    job: Annotated[str, Query(max_length=MAX_JOB_FILTER)] = "",
    state: StateFilter = "",
    tier: TierFilter = "",
) -> FleetFilters:
    return FleetFilters(job=job.strip(), state=state, tier=tier)


FiltersDep = Annotated[FleetFilters, Depends(fleet_filters)]
PageParam = Annotated[int, Query(ge=1, le=MAX_PAGE)]
GridPageParam = Annotated[int, Query(alias="page", ge=1, le=MAX_PAGE)]


def is_fleet(rt: Runtime, session: Session) -> bool:
    return cluster_queries.node_count(session) > rt.settings.dashboard.fleet_view_above_nodes


def _states(rt: Runtime, session: Session, page: PageContext) -> NodeStates:
    judge = Judge(
        caches=rt.caches,
        store=rt.store,
        suspect_after=rt.suspect_after,
        confirm_after=rt.confirm_after,
        incident_tiers_by_node=open_tiers_by_node,
    )
    return shared_node_states(judge, session, now=page.now)


def _page_of_nodes(
    rt: Runtime,
    session: Session,
    page: PageContext,
    filters: FleetFilters,
    *,
    number: int,
    size: int,
) -> tuple[NodeStates, dict[str, Any]]:
    """Every node judged, and what both partials show of them: one page of those the filters
    keep, problem nodes first."""
    states = _states(rt, session, page)
    job_nodes = cluster_queries.job_node_names(session, filters.job) if filters.job else None
    nodes, pager = paginate(select_nodes(states.cards, filters, job_nodes), page=number, size=size)
    data = {"nodes": nodes, "pager": pager, "filters": filters, "poll_seconds": FLEET_POLL_SECONDS}
    return states, data


def shell_data(
    session: Session, filters: FleetFilters, *, page: int, nodes_page: int
) -> dict[str, Any]:
    """What the fleet Overview's first response carries: the filter form and the addresses its
    lazily loaded parts fetch. Nothing here judges a node, so it answers in a few ms."""
    return {
        "fleet": True,
        "filters": filters,
        "job_names": cluster_queries.job_names(session),
        "grid_query": filters.query(page=page),
        "nodes_query": filters.query(nodes_page=nodes_page),
    }


@router.get("/ui/overview/fleet", response_class=HTMLResponse)
def fleet_grid_partial(
    request: Request,
    page: SignedInDep,
    rt: RuntimeDep,
    session: DbDep,
    filters: FiltersDep,
    grid_page: GridPageParam = 1,
) -> HTMLResponse:
    states, data = _page_of_nodes(
        rt, session, page, filters, number=grid_page, size=GRID_PAGE_NODES
    )
    data.update(
        health=states,
        incident_counts=open_incident_counts(session),
        pending_approvals=page.pending_approvals,
    )
    return render(request, page, "partials/_fleet_grid.html", data)


@router.get("/ui/overview/fleet/nodes", response_class=HTMLResponse)
def fleet_nodes_partial(
    request: Request,
    page: SignedInDep,
    rt: RuntimeDep,
    session: DbDep,
    filters: FiltersDep,
    nodes_page: PageParam = 1,
) -> HTMLResponse:
    _, data = _page_of_nodes(rt, session, page, filters, number=nodes_page, size=LIST_PAGE_NODES)
    return render(request, page, "partials/_fleet_nodes.html", data)
