"""The ``rlguard`` command line: the table of its groups and commands, each in a module of its
own; what they share (one-line errors, settings, a database session) is :mod:`app.cli.common`."""

from __future__ import annotations

import typer

from app.cli import demo, drill, goodput, policy, serving
from app.cli.breaker import breaker_cli
from app.cli.common import fail, info, load_settings, run, run_db
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
for name, group in (("db", db_cli), ("token", token_cli), ("user", user_cli),
                    ("breaker", breaker_cli), ("silence", silence_cli),
                    ("maintenance", maintenance_cli)):  # fmt: skip
    cli.add_typer(group, name=name)
for name, command in (("server", serving.server), ("up", serving.up),
                      ("worker", serving.worker), ("replay", policy.replay),
                      ("report", goodput.report), ("drill", drill.drill), ("demo", demo.demo)):  # fmt: skip
    cli.command(name)(command)
for name, passing in (("agent", serving.agent), ("launch", serving.launch)):
    cli.command(name, context_settings=serving.PASS_THROUGH, add_help_option=False)(passing)


def main() -> None:
    run(cli)
