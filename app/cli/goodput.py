"""``rlguard report``: a job's goodput ledger as a table (and Markdown for a weekly review)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def report(
    job: Annotated[str, typer.Option("--job", help="The job's name.")],
    since: Annotated[
        str, typer.Option(help="Window start: a duration before now (7d, 24h) or ISO 8601.")
    ] = "7d",
    until: Annotated[
        str | None, typer.Option(help="Window end (same forms); default: now.")
    ] = None,
    markdown: Annotated[
        Path | None, typer.Option("--markdown", help="Also write the report as Markdown here.")
    ] = None,
) -> None:
    """Print a job's goodput ledger: ETTR, time and GPU-hours lost per incident, savings."""
    from rich.console import Console
    from rich.table import Table

    from app.cli.common import fail, load_settings, run_db
    from app.core.errors import InvalidInput
    from app.goodput import report as text
    from app.goodput.queries import job_goodput
    from app.goodput.window import parse_window
    from app.models import utcnow

    now = utcnow()
    try:
        start, end = parse_window(since, until, now=now)
    except InvalidInput as exc:
        fail(f"--{str(exc)}")
    if markdown is not None and not markdown.parent.is_dir():
        fail(f"--markdown {str(markdown)!r}: directory {str(markdown.parent)!r} does not exist")
    settings = load_settings()
    g = run_db(
        settings,
        lambda s: job_goodput(s, job=job, since=start, until=end, now=now, settings=settings),
    )
    console = Console()
    summary = Table(title=f"Goodput of job {g.job}", show_header=False)
    for name, value in text.summary_rows(g):
        summary.add_row(name, value)
    console.print(summary)
    incidents = Table(title="Incidents")
    for col in text.INCIDENT_HEADER:
        incidents.add_column(col)
    for row in text.incident_rows(g):
        incidents.add_row(*row)
    console.print(incidents if g.incidents else "No incident in this window.")
    assumptions = Table(title="Whole-job restart: assumptions", show_header=False)
    for name, value in text.assumption_rows(g):
        assumptions.add_row(name, value)
    console.print(assumptions)
    if markdown is not None:
        markdown.write_text(text.markdown(g), encoding="utf-8")
        typer.echo(f"Markdown written to {markdown}", err=True)
