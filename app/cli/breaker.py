"""``rlguard breaker list|reset``: the circuit breakers on automation (app/guardrails/breaker.py).

The CLI runs with the database's own rights (like ``rlguard token``), so a reset here is audited
as actor ``cli``.
"""

from __future__ import annotations

from typing import Annotated

import typer

breaker_cli = typer.Typer(
    help="Circuit breakers on automation (per job and for the cluster).", no_args_is_help=True
)


@breaker_cli.command("list")
def breaker_list() -> None:
    """List breakers that ever tripped (scope, state, when, why), open ones first."""
    from app.cli.common import load_settings, run_db
    from app.guardrails.breaker import list_breakers

    rows = run_db(load_settings(), list_breakers)
    if not rows:
        typer.echo("no breaker ever tripped", err=True)
        return
    for r in rows:
        state = "OPEN" if r.open else "closed"
        when = r.tripped_at.isoformat(timespec="seconds") if r.tripped_at else "-"
        reset = f" reset by {r.reset_by} at {r.reset_at:%Y-%m-%dT%H:%M:%S}" if r.reset_at else ""
        incident = f" incident {r.incident_id}" if r.incident_id else ""
        typer.echo(f"{r.scope}\t{state}\ttripped {when}{incident}: {r.reason}{reset}")


@breaker_cli.command("reset")
def breaker_reset(
    scope: Annotated[str, typer.Argument(help="'cluster' or 'job:<job name>'.")],
    comment: Annotated[str, typer.Option(help="Why it is safe to resume (audited).")] = "",
) -> None:
    """Reset an open breaker: automation resumes for the scope, counting afresh from now."""
    from app.cli.common import fail, info, load_settings, run_db
    from app.core.errors import InvalidInput
    from app.guardrails.breaker import check_scope
    from app.incidents.breaker_reset import reset_breaker

    try:
        check_scope(scope)
    except InvalidInput as exc:
        fail(str(exc))
    run_db(load_settings(), lambda s: reset_breaker(s, scope=scope, actor="cli", comment=comment))
    info(f"breaker {scope} reset; automation resumes for it")
