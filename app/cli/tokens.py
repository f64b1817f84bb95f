"""``rlguard token create|revoke|rotate|list``: the API tokens of node agents."""

from __future__ import annotations

from typing import Annotated

import typer

from app.cli.common import fail, info, load_settings, run_db

token_cli = typer.Typer(help="API tokens for node agents.", no_args_is_help=True)


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
