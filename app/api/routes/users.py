"""Users (admin to create and list; anyone authenticated can read themselves), login, audit."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from sqlmodel import select

from app.api.deps import AdminUser, CurrentUser, SessionDep
from app.models import User
from app.models.public import (
    AuditEventPublic,
    LoginRequest,
    TokenCreated,
    UserCreate,
    UserCreated,
    UserPublic,
)
from app.services import cluster, tokens, users
from app.services.audit import record_audit
from app.services.errors import NotAuthenticated

router = APIRouter(prefix="/api/v1", tags=["users"])


@router.get("/me", response_model=UserPublic, summary="The user this token belongs to")
def me(user: CurrentUser) -> UserPublic:
    return cluster.user_public(user)


@router.get("/users", response_model=list[UserPublic], summary="All users")
def list_users(session: SessionDep, _admin: AdminUser) -> list[UserPublic]:
    rows = session.exec(select(User).order_by(User.name)).all()
    return [cluster.user_public(u) for u in rows]


@router.post("/users", response_model=UserCreated, status_code=201, summary="Create a user")
def create_user(body: UserCreate, session: SessionDep, admin: AdminUser) -> UserCreated:
    user, token = users.create_user(
        session, name=body.name, role=body.role, password=body.password, actor=f"user:{admin.name}"
    )
    session.commit()
    return UserCreated(user=cluster.user_public(user), token=token)


@router.post(
    "/auth/token",
    response_model=TokenCreated,
    status_code=201,
    summary="Exchange a user name and password for a new API token",
)
def login(body: LoginRequest, session: SessionDep) -> TokenCreated:
    user = users.authenticate_password(session, name=body.name, password=body.password)
    if user is None:
        raise NotAuthenticated("wrong user name or password")
    token, plaintext = tokens.create_user_token(
        session, user=user, actor=f"user:{user.name}", description="login"
    )
    record_audit(
        session, actor=f"user:{user.name}", action="auth.login", target=f"user:{user.name}"
    )
    session.commit()
    return TokenCreated(token=plaintext, info=cluster.token_public(token))


@router.get("/audit", response_model=list[AuditEventPublic], summary="Latest audit events")
def audit(
    session: SessionDep, _admin: AdminUser, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> list[AuditEventPublic]:
    return cluster.list_audit(session, limit=limit)
