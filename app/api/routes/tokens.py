"""API tokens (admin): issue node tokens, list, revoke, rotate. Every change is audited."""

from __future__ import annotations

from fastapi import APIRouter, Request
from sqlmodel import select

from app.api.deps import AdminUser, RowId, SessionDep
from app.auth import tokens
from app.auth.public import NodeTokenCreate, TokenCreated, TokenPublic
from app.cluster import queries as cluster
from app.models import ApiToken

router = APIRouter(prefix="/api/v1/tokens", tags=["tokens"])


@router.get("", response_model=list[TokenPublic], summary="All tokens (no secrets)")
def list_tokens(session: SessionDep, _admin: AdminUser) -> list[TokenPublic]:
    rows = session.exec(select(ApiToken).order_by(ApiToken.id)).all()  # type: ignore[arg-type]
    return [cluster.token_public(t) for t in rows]


@router.post(
    "", response_model=TokenCreated, status_code=201, summary="Issue a node token (shown once)"
)
def create_node_token(body: NodeTokenCreate, session: SessionDep, admin: AdminUser) -> TokenCreated:
    token, plaintext = tokens.create_node_token(
        session,
        node=body.node,
        actor=f"user:{admin.name}",
        description=body.description,
        jobs=body.jobs,
    )
    session.commit()
    return TokenCreated(token=plaintext, info=cluster.token_public(token))


@router.delete("/{token_id}", response_model=TokenPublic, summary="Revoke a token")
def revoke_token(
    token_id: RowId, request: Request, session: SessionDep, admin: AdminUser
) -> TokenPublic:
    token = tokens.revoke_token(session, token_id=token_id, actor=f"user:{admin.name}")
    session.commit()
    request.app.state.node_tokens.forget_all()  # revocation takes effect now in this process
    return cluster.token_public(token)


@router.post(
    "/{token_id}/rotate",
    response_model=TokenCreated,
    status_code=201,
    summary="Replace a token: a new one (shown once) for the same owner; the old one is revoked",
)
def rotate_token(
    token_id: RowId, request: Request, session: SessionDep, admin: AdminUser
) -> TokenCreated:
    token, plaintext = tokens.rotate_token(session, token_id=token_id, actor=f"user:{admin.name}")
    session.commit()
    request.app.state.node_tokens.forget_all()  # the old token stops working now here
    return TokenCreated(token=plaintext, info=cluster.token_public(token))
