"""Nodes: list and detail (latest series values and participants)."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import SeriesStoreDep, SessionDep, ViewerUser
from app.cluster import queries as cluster
from app.cluster.public import NodeDetail, NodesPublic

router = APIRouter(prefix="/api/v1/nodes", tags=["nodes"])


@router.get("", response_model=NodesPublic, summary="All nodes with their last-seen age")
def list_nodes(session: SessionDep, store: SeriesStoreDep, _user: ViewerUser) -> NodesPublic:
    nodes = cluster.list_nodes(session, store=store)
    return NodesPublic(data=nodes, count=len(nodes))


@router.get(
    "/{node}",
    response_model=NodeDetail,
    summary="One node: fingerprint, latest values, participants",
)
def get_node(
    node: str, session: SessionDep, store: SeriesStoreDep, _user: ViewerUser
) -> NodeDetail:
    return cluster.node_detail(session, name=node, store=store)
