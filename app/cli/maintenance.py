"""``rlguard maintenance add|list|expire``: maintenance windows straight on the configured
database.

A window of a node or a job (a driver update, a drain) mutes the alerts of its silence faults,
keeps the policy engine from judging its nodes silent, and holds every recovery action on it
while open. The same checks as the REST API (``app.silences.store``): a bad value gets the same
reason, as one ``rlguard: error:`` line naming it. Changes are audited with the actor ``cli``.
"""

from __future__ import annotations

from typing import Annotated

import typer

from app.cli.silences import parse_instant

maintenance_cli = typer.Typer(
    help="Maintenance windows: nodes or jobs being worked on (no silence faults, no actions).",
    no_args_is_help=True,
)

_WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


def _weekday(text: str) -> int:
    from app.cli.common import fail

    key = text.strip().lower()[:3]
    if key not in _WEEKDAYS:
        fail(f"--weekly {text!r}: expected a day of the week (mon ... sun)")
    return _WEEKDAYS.index(key)


@maintenance_cli.command("add")
def maintenance_add(
    comment: Annotated[str, typer.Option(help="Why (shown on every muted incident).")],
    node: Annotated[str | None, typer.Option(help="The node being worked on.")] = None,
    job: Annotated[str | None, typer.Option(help="The job (with --node: only there).")] = None,
    starts: Annotated[str | None, typer.Option(help="ISO 8601 start; default now.")] = None,
    ends: Annotated[
        str | None,
        typer.Option(
            help="ISO 8601 end (a one-off window needs it or --duration; weekly: the "
            "last day it recurs, open-ended without)."
        ),
    ] = None,
    duration: Annotated[
        str | None,
        typer.Option(help="A one-off window's length (90m, 2h, 1d); weekly: each occurrence's."),
    ] = None,
    weekly: Annotated[
        str | None, typer.Option(help="Recur every week on this day (mon ... sun), with --at.")
    ] = None,
    at: Annotated[str | None, typer.Option(help="Weekly: the start time, HH:MM UTC.")] = None,
) -> None:
    """Create a maintenance window; prints its id."""
    from datetime import timedelta

    from app.cli.common import fail, load_settings, run_db
    from app.core.errors import InvalidInput
    from app.models import utcnow
    from app.silences.public import MaintenanceWindowCreate
    from app.silences.store import create_window
    from app.silences.text import parse_duration_minutes

    try:
        minutes = None if duration is None else parse_duration_minutes(duration, name="--duration")
    except InvalidInput as exc:
        fail(str(exc))
    starts_at, ends_at = parse_instant("--starts", starts), parse_instant("--ends", ends)
    now = utcnow()
    if weekly is None:
        if at is not None:
            fail(f"--at {at!r} is for a weekly window (give --weekly too)")
        if minutes is not None:
            if ends_at is not None:
                fail("give --ends or --duration, not both")
            ends_at = (starts_at or now) + timedelta(minutes=minutes)
        body = MaintenanceWindowCreate(
            node=node, job=job, starts_at=starts_at, ends_at=ends_at, comment=comment
        )
    else:
        if at is None or minutes is None:
            fail(f"--weekly {weekly!r} needs --at HH:MM (UTC) and --duration (each occurrence)")
        body = MaintenanceWindowCreate(
            node=node,
            job=job,
            recurrence="weekly",
            starts_at=starts_at,
            ends_at=ends_at,
            weekday=_weekday(weekly),
            start_time=at,
            duration_minutes=round(minutes),
            comment=comment,
        )
    settings = load_settings()
    row = run_db(
        settings,
        lambda s: create_window(
            s, body, author="cli", max_hours=settings.silences.max_duration_hours, now=now
        ),
    )
    typer.echo(row.id)


@maintenance_cli.command("list")
def maintenance_list(
    all_: Annotated[bool, typer.Option("--all", help="Also the expired ones.")] = False,
) -> None:
    """Windows, newest first: id, state, what, when, author, comment."""
    from app.cli.common import load_settings, run_db
    from app.models import utcnow
    from app.silences.store import list_windows
    from app.silences.windows import window_state

    now = utcnow()
    for r in run_db(load_settings(), list_windows):
        state = window_state(r, now)
        if state == "expired" and not all_:
            continue
        what = ",".join(f"{k}={v}" for k, v in (("node", r.node), ("job", r.job)) if v)
        if r.weekday is None or r.start_minute is None:
            when = f"{r.starts_at.isoformat()} to {r.ends_at.isoformat() if r.ends_at else '-'}"
        else:
            hh, mm = divmod(r.start_minute, 60)
            when = f"every {_WEEKDAYS[r.weekday]} {hh:02d}:{mm:02d} UTC for {r.duration_minutes}m"
        typer.echo(f"{r.id}\t{state}\t{what}\t{when}\t{r.author}\t{r.comment}")


@maintenance_cli.command("expire")
def maintenance_expire(
    window_id: Annotated[int, typer.Argument(help="The window's id (from `maintenance list`).")],
) -> None:
    """End a maintenance window now (and its future occurrences)."""
    from app.cli.common import fail, info, load_settings, run_db
    from app.models import utcnow
    from app.silences.store import expire_window

    if not 1 <= window_id < 2**63:
        fail(f"maintenance window id {window_id} is out of range")
    run_db(load_settings(), lambda s: expire_window(s, window_id, actor="cli", now=utcnow()))
    info(f"maintenance window {window_id} expired")
