"""Dependencies shared by the routes: database session, settings, current user, roles, node auth.

Roles are ordered viewer < operator < approver < admin; ``require_role(r)`` admits ``r`` and
every role above it. User endpoints take ``Authorization: Bearer <user token>``
(``rlguard user create`` prints one; ``POST /api/v1/auth/token`` issues more). Ingest takes a node
token (``rlguard token create --node``), resolved through a short-lived cache.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import Depends, Request
from pydantic import Field
from sqlmodel import Session
from starlette.concurrency import run_in_threadpool

from app.auth.audit import AUDIT_READER_ROLE
from app.auth.tokens import NodeIdentity, NodeTokenCache
from app.auth.users import user_for_token
from app.core.config import Settings
from app.core.errors import Forbidden, NotAuthenticated
from app.core.ratelimit import LoginNameThrottle
from app.ingest.pipeline import IngestService
from app.models import Role, User
from app.series.store import SeriesStore


def get_db(request: Request) -> Iterator[Session]:
    with Session(request.app.state.engine, expire_on_commit=False) as session:
        yield session


# These accessors are ``async`` although they do no I/O: FastAPI runs a plain ``def``
# dependency on its thread pool, and that hand-off (and the GIL wait to come back) cost every
# ingest request more than the dependency itself (ingest/baseline 0.50 -> 0.62 at 4 clients).
async def get_settings_dep(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_series_store(request: Request) -> SeriesStore:
    store: SeriesStore = request.app.state.series_store
    return store


async def get_ingest_service(request: Request) -> IngestService:
    service: IngestService = request.app.state.ingest
    return service


async def get_login_name_limiter(request: Request) -> LoginNameThrottle:
    """Login attempts per user name (app.main._add_hardening); per address is middleware."""
    throttle: LoginNameThrottle = request.app.state.rate_limiters["login_name"]
    return throttle


# Every integer path or query parameter that reaches SQL is one of these: SQLite binds a Python
# int as a signed 64-bit INTEGER and raised OverflowError (a 500) for 2**63 and beyond, so the
# bound is checked once, here, and a value outside answers 422 naming the parameter (API and
# pages alike). PostgreSQL's 32-bit id columns refuse what lies between with a DataError, which
# main.py answers 422 as well.
SQL_INT_MAX = 2**63 - 1
SqlInt = Annotated[int, Field(ge=-SQL_INT_MAX - 1, le=SQL_INT_MAX)]  # the route checks the rest
RowId = Annotated[int, Field(ge=1, le=SQL_INT_MAX)]
RowCount = Annotated[int, Field(ge=0, le=SQL_INT_MAX)]

SessionDep = Annotated[Session, Depends(get_db)]
SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
SeriesStoreDep = Annotated[SeriesStore, Depends(get_series_store)]
IngestDep = Annotated[IngestService, Depends(get_ingest_service)]
LoginThrottleDep = Annotated[LoginNameThrottle, Depends(get_login_name_limiter)]


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def get_current_user(request: Request, session: SessionDep) -> User:
    token = bearer_token(request)
    if token is None:
        raise NotAuthenticated("missing 'Authorization: Bearer <token>' header")
    user = user_for_token(session, token)
    if user is None:
        raise NotAuthenticated("unknown, revoked or non-user token, or the user is disabled")
    return user


CurrentUser = Annotated[User, Depends(get_current_user)]


def require_role(role: Role) -> Callable[[User], User]:
    def check(user: CurrentUser) -> User:
        if not Role(user.role).allows(role):
            raise Forbidden(f"this needs the {role.value} role; {user.name} is {user.role}")
        return user

    check.__name__ = f"require_{role.value}"
    return check


ViewerUser = Annotated[User, Depends(require_role(Role.viewer))]
OperatorUser = Annotated[User, Depends(require_role(Role.operator))]
ApproverUser = Annotated[User, Depends(require_role(Role.approver))]
AdminUser = Annotated[User, Depends(require_role(Role.admin))]
AuditReader = Annotated[User, Depends(require_role(AUDIT_READER_ROLE))]


async def get_node_identity(request: Request) -> NodeIdentity:
    token = bearer_token(request)
    if token is None:
        raise NotAuthenticated("missing 'Authorization: Bearer <node token>' header")
    cache: NodeTokenCache = request.app.state.node_tokens
    hit, identity, why = cache.cached(token)
    if not hit:
        identity, why = await run_in_threadpool(cache.lookup, token)
    if identity is None:
        if why.startswith("this is a user token"):
            raise Forbidden(why)
        raise NotAuthenticated(why)
    return identity


NodeAuth = Annotated[NodeIdentity, Depends(get_node_identity)]
