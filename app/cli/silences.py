"""``rlguard silence add|list|expire``: silences straight on the configured database.

The same checks as the REST API (``app.silences.store``), so a bad matcher, a regex that does
not compile or a silence too long gets the same reason here, as one ``rlguard: error:`` line
naming the bad value. Changes are audited with the actor ``cli``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer

silence_cli = typer.Typer(
    help="Silences: mute the alerts (and optionally the actions) of matching incidents.",
    no_args_is_help=True,
)


def parse_instant(option: str, text: str | None) -> datetime | None:
    from app.cli.common import fail

    if text is None:
        return None
    try:
        parsed = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        fail(f"{option} {text!r}: not an ISO 8601 time (e.g. 2026-12-01T08:00:00Z)")
    if parsed.tzinfo is None:
        fail(f"{option} {text!r}: add a time zone (e.g. ...Z or +08:00)")
    return parsed.astimezone(UTC)


@silence_cli.command("add")
def silence_add(
    matchers: Annotated[
        list[str],
        typer.Argument(
            help="label=value, label!=value, label=~regex, label!~regex; labels: "
            "job, node, role, rank, kind, tier."
        ),
    ],
    comment: Annotated[str, typer.Option(help="Why (shown on every muted incident).")],
    duration: Annotated[
        str | None, typer.Option(help="How long from the start: 90m, 2h, 1d (or give --ends).")
    ] = None,
    starts: Annotated[str | None, typer.Option(help="ISO 8601 start; default now.")] = None,
    ends: Annotated[str | None, typer.Option(help="ISO 8601 end.")] = None,
    stop_actions: Annotated[
        bool, typer.Option("--stop-actions", help="Also hold the recovery actions.")
    ] = False,
) -> None:
    """Create a silence; prints its id."""
    from app.cli.common import fail, load_settings, run_db
    from app.core.errors import InvalidInput
    from app.models import utcnow
    from app.silences.public import SilenceCreate
    from app.silences.store import create_silence
    from app.silences.text import matchers_from_text, parse_duration_minutes

    try:
        parsed = matchers_from_text(matchers)
        minutes = None if duration is None else parse_duration_minutes(duration, name="--duration")
    except InvalidInput as exc:
        fail(str(exc))
    body = SilenceCreate(
        matchers=parsed,
        starts_at=parse_instant("--starts", starts),
        ends_at=parse_instant("--ends", ends),
        duration_minutes=minutes,
        comment=comment,
        stops_actions=stop_actions,
    )
    settings = load_settings()
    row = run_db(
        settings,
        lambda s: create_silence(
            s,
            body,
            author="cli",
            max_hours=settings.silences.max_duration_hours,
            now=utcnow(),
            max_regex_chars=settings.silences.max_regex_chars,
        ),
    )
    typer.echo(row.id)


@silence_cli.command("list")
def silence_list(
    all_: Annotated[bool, typer.Option("--all", help="Also the expired ones.")] = False,
) -> None:
    """Silences, newest first: id, state, start, end, matchers, author, comment."""
    from app.cli.common import load_settings, run_db
    from app.models import utcnow
    from app.silences.matchers import Matcher
    from app.silences.store import list_silences, silence_state

    now = utcnow()
    rows = run_db(load_settings(), lambda s: list_silences(s, now=now, active_only=not all_))
    for r in rows:
        ms = ",".join(str(Matcher.parse(m)) for m in r.matchers)
        actions = " +actions" if r.stops_actions else ""
        typer.echo(
            f"{r.id}\t{silence_state(r, now)}{actions}\t{r.starts_at.isoformat()}\t"
            f"{r.ends_at.isoformat()}\t{ms}\t{r.author}\t{r.comment}"
        )


@silence_cli.command("expire")
def silence_expire(
    silence_id: Annotated[int, typer.Argument(help="The silence's id (from `silence list`).")],
) -> None:
    """End a silence now."""
    from app.cli.common import fail, info, load_settings, run_db
    from app.models import utcnow
    from app.silences.store import expire_silence

    if not 1 <= silence_id < 2**63:
        fail(f"silence id {silence_id} is out of range")
    run_db(load_settings(), lambda s: expire_silence(s, silence_id, actor="cli", now=utcnow()))
    info(f"silence {silence_id} expired")
