"""``rlguard user create|set-password|disable|enable|delete``: users of the dashboard and API."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from app.cli.common import fail, info, load_settings, run_db
from app.core.errors import ServiceError

user_cli = typer.Typer(help="Users of the dashboard and REST API.", no_args_is_help=True)


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
    ended = (
        "dashboard sessions are ended and API tokens revoked"
        if revoke_tokens
        else ("dashboard sessions are ended (API tokens still work: --revoke-tokens revokes them)")
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
