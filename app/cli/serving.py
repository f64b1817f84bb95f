"""``rlguard server``, ``up``, ``worker``, ``agent``, ``launch``: the processes RLGuard runs."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer
from sqlalchemy.exc import OperationalError

from app.cli.common import fail, info, load_settings, safe_url
from app.core.config import ConfigError, Settings

# How `agent` and `launch` are registered: every argument goes through to the module they run.
PASS_THROUGH: dict[str, bool] = {"allow_extra_args": True, "ignore_unknown_options": True}

# The serving options `rlguard server` and `rlguard up` share.
HostOption = Annotated[str | None, typer.Option(help="Bind address (default RLGUARD_HOST).")]
PortOption = Annotated[int | None, typer.Option(help="Port (default RLGUARD_PORT).")]
AccessLogOption = Annotated[bool, typer.Option(help="Log every request.")]
TrustedProxyOption = Annotated[
    list[str] | None,
    typer.Option(
        "--trusted-proxy",
        help="A reverse proxy (address or CIDR) whose X-Forwarded-For/-Proto are believed; "
        "repeat for several (default RLGUARD_TRUSTED_PROXIES, else none).",
    ),
]


def _apply_trusted_proxies(values: list[str] | None) -> None:
    """--trusted-proxy overrides RLGUARD_TRUSTED_PROXIES for this process and its children."""
    if not values:
        return
    from app.core.forwarded import parse_trusted_proxies

    try:
        parse_trusted_proxies(values)
    except ValueError as exc:
        fail(f"--trusted-proxy: {exc}")
    os.environ["RLGUARD_TRUSTED_PROXIES"] = ",".join(v.strip() for v in values)


def _check_port(port: int) -> None:
    if not 1 <= port <= 65535:
        fail(f"--port {port} is not a TCP port (1-65535)")


HeaderTimeoutOption = Annotated[
    float | None,
    typer.Option(
        "--header-timeout",
        help="Seconds a client has to send a request's headers, else 408 and disconnect "
        "(default RLGUARD_SERVER__HEADER_TIMEOUT_SECONDS, 10).",
    ),
]
LimitConcurrencyOption = Annotated[
    int | None,
    typer.Option(
        "--limit-concurrency",
        help="Open connections plus requests in progress beyond which a request gets 503 "
        "(default RLGUARD_SERVER__LIMIT_CONCURRENCY, 1000).",
    ),
]


def _apply_serving_options(
    host: str | None, port: int | None, header_timeout: float | None, limit_concurrency: int | None
) -> None:
    """Command-line values override RLGUARD_* for this process and its children: the embedded
    worker of `up` renders alert links from the host and port the server really binds."""
    if host:
        os.environ["RLGUARD_HOST"] = host
    if port is not None:
        _check_port(port)
        os.environ["RLGUARD_PORT"] = str(port)
    if header_timeout is not None:
        if not 0 < header_timeout <= 300:  # also refuses nan
            fail(f"--header-timeout {header_timeout} must be above 0 and at most 300 seconds")
        os.environ["RLGUARD_SERVER__HEADER_TIMEOUT_SECONDS"] = repr(header_timeout)
    if limit_concurrency is not None:
        if limit_concurrency < 1:
            fail(f"--limit-concurrency {limit_concurrency} must be at least 1")
        os.environ["RLGUARD_SERVER__LIMIT_CONCURRENCY"] = str(limit_concurrency)


def _serve(settings: Settings, host: str, port: int, access_log: bool) -> None:
    from app.core import migrate
    from app.core.forwarded import parse_trusted_proxies
    from app.core.http_server import raise_descriptor_limit, serve
    from app.core.logging import configure_logging

    configure_logging(settings.log_level)
    try:
        settings.check_secret()
    except ConfigError as exc:
        fail(str(exc))
    try:
        current = migrate.current_revision(settings.db_url)
    except OperationalError as exc:
        fail(f"database {safe_url(settings.db_url)}: {str(exc.orig).splitlines()[0]}", code=1)
    if current != migrate.head_revision(settings.db_url):
        fail(
            f"database {safe_url(settings.db_url)} is at revision {current or '(empty)'}, not "
            "the latest; run `rlguard db upgrade`",
            code=1,
        )
    raise_descriptor_limit(settings.server)
    serve(
        "app.main:create_app_from_env",
        host=host,
        port=port,
        # Header deadline, connections per client address (trusted proxies uncapped),
        # concurrency limit, shutdown deadline: app.core.http_server.
        limits=settings.server,
        uncapped=parse_trusted_proxies(settings.trusted_proxies),
        log_level=settings.log_level,
        access_log=access_log,
        # The app decides which proxies to believe (app.core.forwarded); uvicorn's own
        # handling would trust X-Forwarded-For from 127.0.0.1 whatever is configured.
        proxy_headers=False,
    )


def server(
    host: HostOption = None,
    port: PortOption = None,
    access_log: AccessLogOption = False,
    trusted_proxy: TrustedProxyOption = None,
    header_timeout: HeaderTimeoutOption = None,
    limit_concurrency: LimitConcurrencyOption = None,
) -> None:
    """Serve the API and pages (the database must already be migrated)."""
    from app.core.private_files import keep_private

    _apply_trusted_proxies(trusted_proxy)
    _apply_serving_options(host, port, header_timeout, limit_concurrency)
    settings = load_settings()
    keep_private(settings)
    _serve(settings, settings.host, settings.port, access_log)


def up(
    host: HostOption = None,
    port: PortOption = None,
    access_log: AccessLogOption = False,
    trusted_proxy: TrustedProxyOption = None,
    header_timeout: HeaderTimeoutOption = None,
    limit_concurrency: LimitConcurrencyOption = None,
) -> None:
    """Everything on one machine: data dir, secret, migrations, first admin, server, workers."""
    _apply_trusted_proxies(trusted_proxy)
    _apply_serving_options(host, port, header_timeout, limit_concurrency)
    from app.cli import bootstrap
    from app.core import migrate
    from app.core.child_processes import ChildSupervisor, exit_on_sigterm
    from app.core.db import make_engine
    from app.core.private_files import keep_private
    from app.runtime import up_children

    exit_on_sigterm()  # so that the `finally` below stops the embedded worker
    settings = load_settings()
    host, port = settings.host, settings.port
    keep_private(settings)  # before the data directory, database and broker are created
    try:
        bootstrap.ensure_data_dir(settings)
    except OSError as exc:
        fail(f"RLGUARD_DATA_DIR {settings.data_dir}: {exc.strerror}")
    if bootstrap.ensure_secret(settings):
        info(f"generated a secret key in {settings.secret_file}")
    settings = load_settings()
    try:
        migrate.upgrade(settings.db_url)
    except OperationalError as exc:
        fail(f"database {safe_url(settings.db_url)}: {str(exc.orig).splitlines()[0]}", code=1)
    engine = make_engine(settings.db_url, sqlite_synchronous=settings.sqlite_synchronous)
    try:
        admin = bootstrap.ensure_first_admin(settings, engine)
    finally:
        engine.dispose()
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    info(f"RLGuard at http://{shown}:{port}/ (API docs at /docs), data in {settings.data_dir}")
    if admin is not None:
        info(
            f"created the first admin user '{admin.name}'; its password and API token are in "
            f"{admin.credentials_file} (readable only by you)"
        )
    supervisor = ChildSupervisor(up_children(settings))
    supervisor.start()
    try:
        _serve(settings, host, port, access_log)
    finally:
        supervisor.stop()


def agent(ctx: typer.Context) -> None:
    """Run the node agent (`python -m agents ARGS`); every argument is passed through."""
    argv = [sys.executable, "-m", "agents", *ctx.args]
    os.execv(sys.executable, argv)


def launch(ctx: typer.Context) -> None:
    """Run a training command under RLGuard on this node (`python -m integrations.launch ARGS`:
    see docs/integrations.md); every argument is passed through."""
    argv = [sys.executable, "-m", "integrations.launch", *ctx.args]
    os.execv(sys.executable, argv)


def worker(
    node: Annotated[
        list[str] | None,
        typer.Option(
            "--node", help="Consume queue node.NODE (repeatable); without it: the cluster queue."
        ),
    ] = None,
    cluster: Annotated[
        bool, typer.Option("--cluster", help="Also consume the cluster queue.")
    ] = False,
    concurrency: Annotated[int, typer.Option(help="Worker processes.")] = 1,
    loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "INFO",
) -> None:
    """Run a recovery worker (Celery) for the cluster queue or a node's queue."""
    from app.tasks.worker import queues_for, run_worker

    if concurrency < 1:
        fail(f"--concurrency {concurrency} must be at least 1")
    nodes = node or []
    try:
        queues = queues_for(nodes, cluster=cluster or not nodes)
    except ValueError as exc:
        fail(str(exc))
    name = f"node-{nodes[0]}" if nodes else "cluster"
    run_worker(queues, name=name, concurrency=concurrency, loglevel=loglevel.upper())
