"""The ``rlguard`` command line: the table of its commands and groups.

Each group or command lives in a module of its own (``database``, ``tokens``, ``users``,
``serving``, ``breaker``, ``silences``, ``maintenance``, ``policy``, ``goodput``, ``drill``,
``demo``); what they share is :mod:`app.cli.common`. Commands print only what the contract says
on stdout (a token for ``token create`` and ``user create``); everything else goes to stderr. A
bad value ends with one line ``rlguard: error: ...`` and exit status 2; an unreachable or
unmigrated database with status 1.
"""

from __future__ import annotations

import typer

from app.cli import demo, drill, goodput, policy, serving
from app.cli.breaker import breaker_cli
from app.cli.common import fail, info, load_settings, run_db
from app.cli.database import db_cli
from app.cli.maintenance import maintenance_cli
from app.cli.silences import silence_cli
from app.cli.tokens import token_cli
from app.cli.users import user_cli

__all__ = ["cli", "fail", "info", "load_settings", "main", "run_db"]

cli = typer.Typer(
    name="rlguard",
    help="RLGuard: keeps RL post-training jobs alive (server, database, tokens, users, agent).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# `rlguard --help` lists the commands in this order, then the groups in theirs.
cli.add_typer(db_cli, name="db")
cli.add_typer(token_cli, name="token")
cli.add_typer(user_cli, name="user")
cli.add_typer(breaker_cli, name="breaker")
cli.add_typer(silence_cli, name="silence")
cli.add_typer(maintenance_cli, name="maintenance")
cli.command("server")(serving.server)
cli.command("up")(serving.up)
cli.command("agent", **serving.PASS_THROUGH)(serving.agent)
cli.command("launch", **serving.PASS_THROUGH)(serving.launch)
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
