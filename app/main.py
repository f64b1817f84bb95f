"""The FastAPI application.

``create_app(settings)`` builds one app with its own engine, series store, metrics registry,
ingest service and rollup writer (so tests can run several side by side).
``create_app_from_env()`` is the factory ``rlguard server`` hands to uvicorn.

In-process readers (the policy engine, the pages) find the shared objects on ``app.state``:
``series_store`` (``SeriesStore``), ``ingest`` (``IngestService``: participants, agents),
``engine``, ``settings``, ``policy`` (the loaded policy), ``metrics`` (``ServerMetrics``),
``registry``, ``dashboard_caches``; no module keeps such state in a global.

What else runs inside the server process (the policy tick, the scheduler lease) is listed in
``app.runtime.SERVER_LIFESPANS``: each is entered after ingest has started and exited before it
stops, with the app as argument.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy.exc import DataError, OperationalError
from starlette.concurrency import run_in_threadpool

from app.api.middleware import RequestMetricsMiddleware
from app.api.routes import (
    alertmanager,
    alertmanager_v2,
    alerts,
    approvals,
    automation,
    bench,
    breakers,
    docs,
    drills,
    goodput,
    health,
    incidents,
    ingest,
    jobs,
    maintenance_windows,
    nodes,
    series,
    silences,
    tokens,
    users,
)
from app.auth.tokens import NodeTokenCache
from app.core.config import Settings, get_settings
from app.core.db import make_engine
from app.core.errors import ServiceError, TooManyRequests
from app.core.forwarded import TrustedProxyMiddleware, parse_trusted_proxies
from app.core.gc_tuning import freeze_startup_heap, thaw_heap
from app.core.ratelimit import (
    LoginNameThrottle,
    RateLimitMiddleware,
    RateLimitRule,
    TokenBucketLimiter,
    bearer_token_key,
    client_address,
)
from app.core.readiness import ReadinessProbe
from app.core.security_headers import RequestSizeLimitMiddleware, SecurityHeadersMiddleware
from app.goodput.queries import metrics_source as goodput_metrics_source
from app.incidents.queries import open_incident_counts_source
from app.ingest.commit import choose_committer
from app.ingest.pipeline import IngestService
from app.ingest.quotas import NodeQuotas
from app.ingest.redis_dedupe import RedisDedupe
from app.metrics import GoodputCollector, IncidentCollector, build_registry
from app.runtime import SERVER_LIFESPANS, LifespanFactory, load_running_policy
from app.series.backend import (
    LocalSeriesBackend,
    RedisSeriesBackend,
    SeriesBackend,
    key_prefix,
)
from app.series.rollups import RollupWriter
from app.series.store import SeriesStore
from app.views import mount_dashboard
from app.views.models.overview import DashboardCaches

log = logging.getLogger("rlguard.server")

API_ROUTERS = (
    health,
    ingest,
    nodes,
    jobs,
    series,
    tokens,
    users,
    incidents,
    approvals,
    alertmanager,
    alertmanager_v2,
    alerts,
    goodput,
    breakers,
    automation,
    silences,
    maintenance_windows,
    drills,
    docs,
)


def create_app(
    settings: Settings | None = None, *, extra_lifespans: Sequence[LifespanFactory] | None = None
) -> FastAPI:
    """The server app; ``extra_lifespans`` replaces ``app.runtime.SERVER_LIFESPANS`` (tests)."""
    settings = settings or get_settings()
    settings.check_secret()
    settings.check_shared_window()
    hooks = list(SERVER_LIFESPANS if extra_lifespans is None else extra_lifespans)
    app = FastAPI(
        title="RLGuard",
        version="0.1.0",
        summary="Control plane for RL post-training clusters",
        lifespan=_lifespan(hooks),
        # Swagger UI from our own /static (app.api.routes.docs), not FastAPI's CDN pages.
        docs_url=None,
        redoc_url=None,
    )
    _build_state(app, settings)
    _add_error_handlers(app)
    registry = app.state.registry

    @app.get("/metrics", include_in_schema=False)
    async def metrics_endpoint() -> Response:
        body = await run_in_threadpool(generate_latest, registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    for module in API_ROUTERS:
        app.include_router(module.router)
    if settings.bench_endpoints:
        app.include_router(bench.router)
    mount_dashboard(app)  # HTML pages, htmx partials and /static (app.views)
    _add_hardening(app, settings)
    app.add_middleware(RequestMetricsMiddleware, metrics=app.state.metrics)
    _document_ingest_body(app, app.state.ingest)
    return app


def _build_state(app: FastAPI, settings: Settings) -> None:
    """Everything one app owns, on ``app.state`` (several apps can live side by side)."""
    engine = make_engine(settings.db_url, sqlite_synchronous=settings.sqlite_synchronous)
    store = SeriesStore(
        window_seconds=settings.series.window_seconds, max_points=settings.series.max_points
    )
    registry, metrics = build_registry(store, settings.series.export_labels)
    registry.register(GoodputCollector(goodput_metrics_source(engine, settings)))
    registry.register(IncidentCollector(open_incident_counts_source(engine)))
    backend, dedupe = _window_backend(settings)
    state = app.state
    state.settings, state.engine, state.series_store = settings, engine, store
    state.registry, state.metrics = registry, metrics
    state.window_backend, state.dedupe = backend, dedupe
    # The policy the engine runs and the dashboard draws: one, loaded once (app.runtime).
    state.policy = load_running_policy(settings)
    # What one node may create on the server (app.ingest.quotas): ingest checks, the node
    # page shows.
    state.node_quotas = NodeQuotas(settings.node_quotas, refusals=metrics.ingest_quota_refusals)
    state.ingest = IngestService(
        engine=engine,
        store=store,
        limits=settings.ingest,
        metrics=metrics,
        backend=backend,
        dedupe=dedupe,
        # Phase history is kept as long as the rollups it is drawn beside.
        phase_retention_days=settings.series.rollup_retention_days,
        committer=choose_committer(settings, engine, backend),
        quotas=state.node_quotas,
    )
    state.rollups = RollupWriter(
        engine=engine,
        store=store,
        settings=settings.series,
        metrics=metrics,
        write_turns=state.ingest.write_turns,
    )
    state.node_tokens = NodeTokenCache(engine, ttl=settings.ingest.token_cache_seconds)
    state.readiness = ReadinessProbe(
        engine=engine,
        ingest=state.ingest,
        broker_url=settings.redis_url,  # cluster mode: Celery's broker
        timeout=settings.recovery.broker_timeout_seconds,
    )
    state.dashboard_caches = DashboardCaches()


def _lifespan(
    hooks: Sequence[LifespanFactory],
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = app.state
        state.window_backend.start(state.series_store)
        await state.ingest.start()
        try:
            async with contextlib.AsyncExitStack() as stack:
                for hook in hooks:
                    await stack.enter_async_context(hook(app))
                if state.rollups.scheduled_by is None:
                    # No policy scheduler took the rollups as a leased job (app.series.rollups).
                    await stack.enter_async_context(state.rollups.running_alone())
                backend_name = state.engine.url.get_backend_name()
                log.info("rlguard server ready", extra={"database": backend_name})
                freeze_startup_heap()
                yield
        finally:
            thaw_heap()
            await state.ingest.stop()
            state.window_backend.stop()
            if state.dedupe is not None:
                await state.dedupe.close()
            state.readiness.close()
            state.engine.dispose()

    return lifespan


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def _service_error(_request: Request, exc: ServiceError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else {}
        if isinstance(exc, TooManyRequests):
            headers["Retry-After"] = str(exc.retry_after)
        if exc.closes_connection:
            headers["Connection"] = "close"
        return JSONResponse({"detail": str(exc)}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(OperationalError)
    async def _database_unavailable(_request: Request, exc: OperationalError) -> JSONResponse:
        # The database is down or restarting (the pool reconnects by itself): a client's retry
        # will succeed, so say 503 and when to retry, never 500.
        log.warning("database unavailable: %s", type(exc.orig).__name__)
        return JSONResponse(
            {"detail": "the database is unavailable; nothing was changed, retry shortly"},
            status_code=503,
            headers={"Retry-After": "2"},
        )

    @app.exception_handler(DataError)
    async def _out_of_range(_request: Request, exc: DataError) -> JSONResponse:
        # A value the request validation let through but a column cannot hold (e.g. an id
        # beyond a 32-bit integer): bad input, nothing was written (the session rolls back).
        reason = str(exc.orig).splitlines()[0] if exc.orig is not None else "invalid value"
        return JSONResponse(
            {"detail": f"a value in the request does not fit the database: {reason}"},
            status_code=422,
        )


def _window_backend(settings: Settings) -> tuple[SeriesBackend, RedisDedupe | None]:
    """In-process window (default), or shared through Redis between replicas."""
    if not settings.series.shared_window:
        return LocalSeriesBackend(), None
    assert settings.redis_url is not None  # check_shared_window
    backend = RedisSeriesBackend(
        redis_url=settings.redis_url,
        database_url=settings.db_url,
        window_seconds=settings.series.window_seconds,
        follow_interval=settings.series.shared_follow_interval_seconds,
    )
    dedupe = RedisDedupe(
        redis_url=settings.redis_url,
        prefix=key_prefix(settings.db_url),
        ttl_seconds=int(settings.ingest.cursor_retention_days * 86400),
        timeout=settings.ingest.commit_timeout_seconds / 2,
    )
    return backend, dedupe


def _add_hardening(app: FastAPI, settings: Settings) -> None:
    """Size limit, rate limits and security headers (the last added runs first)."""
    h = settings.hardening
    login = TokenBucketLimiter(rate=h.login_attempts_per_minute / 60.0, burst=h.login_burst)
    login_name = LoginNameThrottle(
        rate=h.login_attempts_per_name_per_minute / 60.0, burst=h.login_name_burst
    )
    ingest_limiter = TokenBucketLimiter(rate=h.ingest_requests_per_second, burst=h.ingest_burst)
    # "login_name" is applied by the login routes, once they have read the name from the body.
    app.state.rate_limiters = {"login": login, "login_name": login_name, "ingest": ingest_limiter}
    app.add_middleware(
        RequestSizeLimitMiddleware,
        max_bytes=h.max_request_body_bytes,
        own_limit_paths=frozenset({"/api/v1/ingest"}),
    )
    app.add_middleware(
        RateLimitMiddleware,
        rules=[
            RateLimitRule("POST", "/api/v1/auth/token", login, client_address, "login attempts"),
            RateLimitRule("POST", "/login", login, client_address, "login attempts"),
            RateLimitRule(
                "POST", "/api/v1/ingest", ingest_limiter, bearer_token_key, "ingest requests"
            ),
        ],
    )
    app.add_middleware(SecurityHeadersMiddleware)
    # Outermost: everything above sees the real client address and scheme (HSTS, rate limits).
    app.add_middleware(
        TrustedProxyMiddleware, trusted=parse_trusted_proxies(settings.trusted_proxies)
    )


def _document_ingest_body(app: FastAPI, service: IngestService) -> None:
    """The ingest route reads raw bytes (fast path); publish the body's full schema anyway."""
    default_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        spec = default_openapi()
        doc = service.validator.doc_model.model_json_schema(
            ref_template="#/components/schemas/{model}"
        )
        schemas = spec.setdefault("components", {}).setdefault("schemas", {})
        schemas.update(doc.pop("$defs", {}))
        doc["title"] = "IngestBatch"
        schemas["IngestBatch"] = doc
        spec["paths"]["/api/v1/ingest"]["post"]["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/IngestBatch"}}
            },
        }
        _document_error_detail(spec)
        app.openapi_schema = spec
        return spec

    app.openapi = openapi  # type: ignore[method-assign]


def _document_error_detail(spec: dict[str, Any]) -> None:
    """Our 4xx answers carry ``{"detail": "<message naming the bad value>"}`` (ServiceError,
    IngestRejected); only FastAPI's own request validation sends a list. Say so in the schema,
    so clients (and schemathesis) accept both shapes of a 422."""
    schemas = spec.get("components", {}).get("schemas", {})
    err = schemas.get("HTTPValidationError")
    if err is None:
        return
    listed = err["properties"]["detail"]
    err["properties"]["detail"] = {
        "title": "Detail",
        "anyOf": [{"type": "string"}, {k: v for k, v in listed.items() if k != "title"}],
    }


def create_app_from_env() -> FastAPI:
    return create_app(get_settings())
