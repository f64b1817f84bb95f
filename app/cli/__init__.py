"""The ``rlguard`` command line.

Commands print only what the contract says on stdout (a token for ``token create`` and
``user create``); everything else goes to stderr. A bad value ends with one line
``rlguard: error: ...`` and exit status 2; an unreachable or unmigrated database with status 1.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Annotated, NoReturn, TypeVar

import typer
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError, ProgrammingError
from sqlmodel import Session

from app.cli import demo, drill, goodput, policy, silences
from app.cli.breaker import breaker_cli
from app.cli.maintenance import maintenance_cli
from app.core.config import ConfigError, Settings, get_settings
from app.core.errors import ServiceError

T = TypeVar("T")

cli = typer.Typer(
    name="rlguard",
    help="RLGuard: keeps RL post-training jobs alive (server, database, tokens, users, agent).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
db_cli = typer.Typer(help="Database schema (Alembic migrations).", no_args_is_help=True)
token_cli = typer.Typer(help="API tokens for node agents.", no_args_is_help=True)
user_cli = typer.Typer(help="Users of the dashboard and REST API.", no_args_is_help=True)
cli.add_typer(db_cli, name="db")
cli.add_typer(token_cli, name="token")
cli.add_typer(user_cli, name="user")
cli.add_typer(breaker_cli, name="breaker")
cli.add_typer(silences.silence_cli, name="silence")
cli.add_typer(maintenance_cli, name="maintenance")


def fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"rlguard: error: {message}", err=True)
    raise typer.Exit(code)


def info(message: str) -> None:
    typer.echo(message, err=True)


def _safe_url(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def load_settings() -> Settings:
    from pydantic import ValidationError

    get_settings.cache_clear()
    try:
        return get_settings()
    except ValidationError as exc:
        err = exc.errors()[0]
        where = "RLGUARD_" + "__".join(str(p) for p in err["loc"]).upper()
        fail(f"{where}: {err['msg']} (got {err.get('input')!r})")


def run_db(settings: Settings, action: Callable[[Session], T]) -> T:
    """Run ``action`` in a session on the configured database, with one-line errors."""
    from app.core.db import make_engine

    engine = make_engine(settings.db_url, sqlite_synchronous=settings.sqlite_synchronous)
    try:
        with Session(engine, expire_on_commit=False) as session:
            result = action(session)
            session.commit()
            return result
    except ServiceError as exc:
        fail(str(exc))
    except (OperationalError, ProgrammingError) as exc:
        text = str(exc.orig).splitlines()[0] if exc.orig is not None else str(exc)
        hint = ""
        if "no such table" in text or "does not exist" in text:
            hint = "; run `rlguard db upgrade` first"
        fail(f"database {_safe_url(settings.db_url)}: {text}{hint}", code=1)
    finally:
        engine.dispose()


# -- db ---------------------------------------------------------------------------------------


@db_cli.command("upgrade")
def db_upgrade(
    revision: Annotated[str, typer.Option(help="Target revision.")] = "head",
) -> None:
    """Apply migrations up to REVISION (default: the latest)."""
    from app.core import migrate

    settings = load_settings()
    try:
        migrate.upgrade(settings.db_url, revision)
    except OperationalError as exc:
        fail(f"database {_safe_url(settings.db_url)}: {str(exc.orig).splitlines()[0]}", code=1)
    except Exception as exc:  # alembic raises CommandError / util errors for bad revisions
        from alembic.util import CommandError

        if isinstance(exc, CommandError):
            fail(f"revision {revision!r}: {exc}")
        raise
    info(f"database {_safe_url(settings.db_url)} is at {migrate.current_revision(settings.db_url)}")


@db_cli.command("downgrade")
def db_downgrade(
    revision: Annotated[str, typer.Argument(help="Target revision, or 'base'.")],
) -> None:
    """Revert migrations down to REVISION."""
    from alembic.util import CommandError

    from app.core import migrate

    settings = load_settings()
    try:
        migrate.downgrade(settings.db_url, revision)
    except CommandError as exc:
        fail(f"revision {revision!r}: {exc}")
    info(f"database {_safe_url(settings.db_url)} is at {migrate.current_revision(settings.db_url)}")


@db_cli.command("current")
def db_current() -> None:
    """Print the database's current revision."""
    from app.core import migrate

    settings = load_settings()
    try:
        typer.echo(migrate.current_revision(settings.db_url) or "(empty)")
    except OperationalError as exc:
        fail(f"database {_safe_url(settings.db_url)}: {str(exc.orig).splitlines()[0]}", code=1)


# -- tokens and users -------------------------------------------------------------------------


@token_cli.command("create")
def token_create(
    node: Annotated[str, typer.Option("--node", help="The node this token may ingest for.")],
    description: Annotated[str, typer.Option(help="Free text shown in token lists.")] = "",
    jobs: Annotated[
        list[str] | None,
        typer.Option(
            "--jobs",
            help="Only these jobs: glob patterns ('team-a-*'; * and ?), comma-separated or "
            "repeated. Without it the token may report any job.",
        ),
    ] = None,
) -> None:
    """Issue a node token; prints only the token (it is shown once, only a hash is kept)."""
    from app.auth.tokens import create_node_token

    patterns = None if jobs is None else [p.strip() for j in jobs for p in j.split(",")]
    settings = load_settings()
    _token, plaintext = run_db(
        settings,
        lambda s: create_node_token(
            s, node=node, actor="cli", description=description, jobs=patterns
        ),
    )
    typer.echo(plaintext)


TokenId = Annotated[int, typer.Argument(help="The token's id.")]
# Token ids as the table stores them (INTEGER: 32-bit on PostgreSQL); a value beyond would reach
# the database as an overflow (a traceback), so it is refused here by name.
TOKEN_ID_MAX = 2**31 - 1


def check_token_id(token_id: int) -> None:
    if not 1 <= token_id <= TOKEN_ID_MAX:
        fail(f"invalid token id {token_id} (ids are 1..{TOKEN_ID_MAX})")


@token_cli.command("revoke")
def token_revoke(token_id: TokenId) -> None:
    """Revoke a token (ingest with it stops within the server's token cache time, 5 s)."""
    from app.auth.tokens import revoke_token

    check_token_id(token_id)
    run_db(load_settings(), lambda s: revoke_token(s, token_id=token_id, actor="cli"))
    info(f"token {token_id} revoked")


@token_cli.command("rotate")
def token_rotate(token_id: TokenId) -> None:
    """Replace a token: prints only the new one; the old one is revoked in the same commit."""
    from app.auth.tokens import rotate_token

    check_token_id(token_id)
    _token, plaintext = run_db(
        load_settings(), lambda s: rotate_token(s, token_id=token_id, actor="cli")
    )
    typer.echo(plaintext)
    info(f"token {token_id} revoked and replaced (ingest with it stops within 5 s)")


@token_cli.command("list")
def token_list() -> None:
    """List tokens (id, kind, owner, prefix, job scope, state); never the secrets. The scope
    of a node token is ``jobs:any`` or ``jobs:PATTERN,...``; a user token's is ``-``."""
    from sqlmodel import select

    from app.models import ApiToken

    rows = run_db(load_settings(), lambda s: list(s.exec(select(ApiToken)).all()))
    for t in rows:
        owner = f"node:{t.node_name}" if t.node_name else f"user_id:{t.user_id}"
        state = "revoked" if t.revoked_at else "active"
        scope = "-"
        if t.node_name:
            scope = "jobs:" + (",".join(t.job_patterns) if t.job_patterns else "any")
        typer.echo(f"{t.id}\t{t.kind}\t{owner}\t{t.prefix}…\t{scope}\t{state}")


@user_cli.command("create")
def user_create(
    name: Annotated[str, typer.Argument(help="User name.")],
    role: Annotated[str, typer.Option(help="viewer | operator | approver | admin")],
    password_stdin: Annotated[
        bool, typer.Option("--password-stdin", help="Read a login password from stdin.")
    ] = False,
) -> None:
    """Create a user; prints only an API bearer token for that user."""
    from app.auth.users import create_user, parse_role

    try:
        parsed = parse_role(role)
    except ServiceError as exc:
        fail(str(exc))
    password = _read_password_stdin(password_stdin)
    _user, token = run_db(
        load_settings(),
        lambda s: create_user(s, name=name, role=parsed, password=password, actor="cli"),
    )
    typer.echo(token)


def _read_password_stdin(password_stdin: bool) -> str | None:
    if not password_stdin:
        return None
    password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        fail("--password-stdin given but stdin was empty")
    return password


@user_cli.command("set-password")
def user_set_password(
    name: Annotated[str, typer.Argument(help="User name.")],
    password_stdin: Annotated[
        bool, typer.Option("--password-stdin", help="Read the new password from stdin.")
    ] = False,
    revoke_tokens: Annotated[
        bool,
        typer.Option(
            "--revoke-tokens",
            help="Also revoke every API token of the user (a password changed because it "
            "leaked: tokens issued with it stop working too).",
        ),
    ] = False,
) -> None:
    """Set a user's login password; every dashboard session of theirs ends (and with
    --revoke-tokens every API token of theirs is revoked)."""
    from app.auth.users import set_password

    given = _read_password_stdin(password_stdin)
    if given is None:
        fail("set-password reads the new password from stdin: pass --password-stdin")
    password: str = given
    run_db(
        load_settings(),
        lambda s: set_password(
            s, name=name, password=password, actor="cli", revoke_tokens=revoke_tokens
        ),
    )
    ended = "dashboard sessions are ended and API tokens revoked" if revoke_tokens else (
        "dashboard sessions are ended (API tokens still work: --revoke-tokens revokes them)"
    )
    info(f"password of user {name!r} set; their {ended}")


@user_cli.command("disable")
def user_disable(name: Annotated[str, typer.Argument(help="User name.")]) -> None:
    """Disable a user: their API tokens and dashboard sessions stop working at once."""
    from app.auth.users import disable_user

    run_db(load_settings(), lambda s: disable_user(s, name=name, actor="cli"))
    info(f"user {name!r} disabled")


@user_cli.command("enable")
def user_enable(name: Annotated[str, typer.Argument(help="User name.")]) -> None:
    """Enable a disabled user again (their API tokens work again)."""
    from app.auth.users import enable_user

    run_db(load_settings(), lambda s: enable_user(s, name=name, actor="cli"))
    info(f"user {name!r} enabled")


@user_cli.command("delete")
def user_delete(name: Annotated[str, typer.Argument(help="User name.")]) -> None:
    """Delete a user with their API tokens and sessions (never the last enabled admin)."""
    from app.auth.users import delete_user

    run_db(load_settings(), lambda s: delete_user(s, name=name, actor="cli"))
    info(f"user {name!r} deleted")


# -- serving ----------------------------------------------------------------------------------


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
        fail(f"database {_safe_url(settings.db_url)}: {str(exc.orig).splitlines()[0]}", code=1)
    if current != migrate.head_revision(settings.db_url):
        fail(
            f"database {_safe_url(settings.db_url)} is at revision {current or '(empty)'}, not "
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


@cli.command("server")
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


@cli.command("up")
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
    from app.core.db import make_engine
    from app.core.private_files import keep_private
    from app.core.supervisor import ChildSupervisor, exit_on_sigterm
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
        fail(f"database {_safe_url(settings.db_url)}: {str(exc.orig).splitlines()[0]}", code=1)
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


@cli.command(
    "agent",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def agent(ctx: typer.Context) -> None:
    """Run the node agent (`python -m agents ARGS`); every argument is passed through."""
    argv = [sys.executable, "-m", "agents", *ctx.args]
    os.execv(sys.executable, argv)


@cli.command(
    "launch",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def launch(ctx: typer.Context) -> None:
    """Run a training command under RLGuard on this node (`python -m integrations.launch ARGS`:
    see docs/integrations.md); every argument is passed through."""
    argv = [sys.executable, "-m", "integrations.launch", *ctx.args]
    os.execv(sys.executable, argv)


# Commands of their own modules, listed after the core ones (the order `rlguard --help` shows).
cli.command("worker")(policy.worker)
cli.command("replay")(policy.replay)
cli.command("report")(goodput.report)
cli.command("drill")(drill.drill)
cli.command("demo")(demo.demo)


def main() -> None:
    from pydantic import ValidationError

    try:
        # A bad RLGUARD_* value must end in one line, not a traceback.
        cli()
    except ValidationError as exc:
        err = exc.errors()[0]
        where = "RLGUARD_" + "__".join(str(p) for p in err["loc"]).upper()
        typer.echo(f"rlguard: error: {where}: {err['msg']} (got {err.get('input')!r})", err=True)
        raise SystemExit(2) from None
