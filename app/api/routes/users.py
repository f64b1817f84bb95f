"""Users (admin to create, list, disable, enable, set a password, delete; anyone authenticated
can read themselves), login, audit. Every change is audited by the users service."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from sqlmodel import select

from app.api.deps import AdminUser, AuditReader, CurrentUser, LoginThrottleDep, SessionDep
from app.auth import tokens, users
from app.auth.audit import record_audit
from app.auth.public import (
    AuditEventPublic,
    LoginRequest,
    PasswordSet,
    TokenCreated,
    UserCreate,
    UserCreated,
    UserPublic,
)
from app.cluster import queries as cluster
from app.core.errors import NotAuthenticated
from app.core.ratelimit import client_address
from app.models import User

router = APIRouter(prefix="/api/v1", tags=["users"])

UserName = Annotated[str, Path(min_length=1, max_length=64, description="The user's name.")]


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
    "/users/{name}/disable",
    response_model=UserPublic,
    summary="Disable a user: their API tokens and dashboard sessions stop working at once",
)
def disable_user(name: UserName, session: SessionDep, admin: AdminUser) -> UserPublic:
    user = users.disable_user(session, name=name, actor=f"user:{admin.name}")
    session.commit()
    return cluster.user_public(user)


@router.post("/users/{name}/enable", response_model=UserPublic, summary="Enable a disabled user")
def enable_user(name: UserName, session: SessionDep, admin: AdminUser) -> UserPublic:
    user = users.enable_user(session, name=name, actor=f"user:{admin.name}")
    session.commit()
    return cluster.user_public(user)


@router.put(
    "/users/{name}/password",
    response_model=UserPublic,
    summary="Set a user's login password; their dashboard sessions end",
)
def set_password(
    name: UserName, body: PasswordSet, session: SessionDep, admin: AdminUser
) -> UserPublic:
    user = users.set_password(
        session,
        name=name,
        password=body.password,
        actor=f"user:{admin.name}",
        revoke_tokens=body.revoke_tokens,
    )
    session.commit()
    return cluster.user_public(user)


@router.delete(
    "/users/{name}",
    status_code=204,
    summary="Delete a user with their tokens and sessions (never the last enabled admin)",
)
def delete_user(name: UserName, session: SessionDep, admin: AdminUser) -> None:
    users.delete_user(session, name=name, actor=f"user:{admin.name}")
    session.commit()


@router.post(
    "/auth/token",
    response_model=TokenCreated,
    status_code=201,
    summary="Exchange a user name and password for a new API token",
)
def login(
    body: LoginRequest, request: Request, session: SessionDep, throttle: LoginThrottleDep
) -> TokenCreated:
    client = client_address(request.scope)
    users.throttle_login_name(throttle, body.name, client)
    user = users.authenticate_password(session, name=body.name, password=body.password)
    if user is None:
        throttle.failed(body.name, client)
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
    session: SessionDep, _reader: AuditReader, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> list[AuditEventPublic]:
    return cluster.list_audit(session, limit=limit)
