"""``rlguard drill``: rehearse a fault on a running job through the server's REST API.

::

    rlguard drill --job J --fault kill|hang|oom|disk-full --role R [--rank N] [--at-step S]
    rlguard drill --job J --fault F --role R --plan     # what would happen; nothing injected
    rlguard drill --report [--job J]                    # past drills

It talks to a running server (``--server``, default ``$RLGUARD_URL`` or
http://127.0.0.1:8000) with an operator's token (``--token-file``, or ``$RLGUARD_TOKEN``):
the server checks the drill, asks the node's launcher to inject it, and the command follows
the incident and the recovery until the report is complete (``--timeout``), then prints it. A
bad value or a refusal is one ``rlguard: error:`` line naming it (exit 2 for a bad value, 1
for a refusal by the server or the launcher); nothing is injected then.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

FINAL = ("recovered", "unrecovered", "refused", "planned")
POLL_SECONDS = 2.0


def _int(flag: str, text: str | None) -> int | None:
    from app.cli.common import fail

    if text is None:
        return None
    if not text.isdigit() or len(text) > 10:
        fail(f"{flag} must be a whole number >= 0, got {text!r}")
    return int(text)


def _token(token_file: Path | None) -> str:
    from app.cli.common import fail

    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            fail(f"--token-file {str(token_file)!r}: {exc.strerror or exc}")
    else:
        token = os.environ.get("RLGUARD_TOKEN", "").strip()
    if not token:
        fail("no token: give --token-file or set RLGUARD_TOKEN (an operator's API token)")
    return token


class _Api:
    def __init__(self, server: str, token: str) -> None:
        import httpx

        self._http = httpx.Client(
            base_url=server.rstrip("/"), timeout=60.0, headers={"Authorization": f"Bearer {token}"}
        )
        self.server = server

    def call(self, method: str, path: str, **kw: Any) -> Any:
        import httpx

        from app.cli.common import fail

        try:
            r = self._http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            fail(f"server {self.server}: {exc}", code=1)
        if r.status_code >= 400:
            try:
                detail = r.json().get("detail", r.text)
            except ValueError:
                detail = r.text
            if isinstance(detail, list):  # a request body the API's schema refused
                detail = "; ".join(str(d.get("msg", d)) for d in detail)
            fail(str(detail)[:1000], code=2 if r.status_code in (404, 422) else 1)
        return r.json()


def report_lines(d: dict[str, Any]) -> list[str]:
    """One drill as the lines an operator reads (its report as far as it got): the figures the
    Drills page shows (app.drills.summary.report_figures), with the CLI's longer wording."""
    from app.drills.summary import report_figures

    rep = d.get("report") or {}
    step = d.get("step_at_injection")
    worded: dict[str, Callable[[str], str]] = {
        "first new step": lambda t: t if t == "—" else f"after {t}",
        "seconds lost": lambda t: f"{t} (a drill: not counted in the job's ETTR)",
        "whole-job restart": lambda t: (
            t if t == "—" else (f"{t} ({rep.get('counterfactual_assumptions', '')})")
        ),
    }
    lines = [
        f"drill {d['id']}: {d['fault']} {d['role']}-{d['rank']} of job {d['job']} "
        f"(node {d['node']}): {d['status']}",
        f"  injected            {d.get('injected_at') or '—'}"
        f"{'' if step is None else f' at step {step}'}: {d.get('what') or ''}",
    ]
    lines += [f"  {label:<20}{worded.get(label, str)(text)}" for label, text in report_figures(rep)]
    if rep.get("state"):
        lines.append(f"  state               {rep['state']}")
    if d.get("reason"):
        lines.append(f"  reason              {d['reason']}")
    return lines


def drill(
    job: Annotated[str | None, typer.Option("--job", help="The job's name.")] = None,
    fault: Annotated[
        str | None, typer.Option("--fault", help="kill, hang, oom or disk-full.")
    ] = None,
    role: Annotated[
        str | None, typer.Option("--role", help="The role to drill, e.g. trainer.")
    ] = None,
    rank: Annotated[
        str | None, typer.Option("--rank", help="Its rank (default: the lowest).")
    ] = None,
    at_step: Annotated[
        str | None, typer.Option("--at-step", help="Inject once the process reports this step.")
    ] = None,
    plan: Annotated[
        bool, typer.Option("--plan", help="Say what would happen; inject nothing.")
    ] = False,
    report: Annotated[bool, typer.Option("--report", help="List past drills.")] = False,
    wait: Annotated[
        bool, typer.Option("--wait/--no-wait", help="Follow the recovery and print the report.")
    ] = True,
    timeout: Annotated[
        str, typer.Option("--timeout", help="Seconds to follow before printing the report so far.")
    ] = "900",
    server: Annotated[
        str | None, typer.Option("--server", help="Server URL (default $RLGUARD_URL).")
    ] = None,
    token_file: Annotated[
        Path | None, typer.Option("--token-file", help="File with an API token ($RLGUARD_TOKEN).")
    ] = None,
) -> None:
    """Inject a fault into a running job on purpose and report its recovery and its cost."""
    from app.cli.common import fail, info
    from recovery.supervision.drills import DRILL_FAULTS

    url = server or os.environ.get("RLGUARD_URL") or "http://127.0.0.1:8000"
    if report:
        api = _Api(url, _token(token_file))
        rows = api.call("GET", "/api/v1/drills", params={"job": job} if job else {})
        for d in rows:
            typer.echo("\n".join(report_lines(d)))
        if not rows:
            info("no drill yet" + (f" for job {job!r}" if job else ""))
        return
    for flag, value in (("--job", job), ("--fault", fault), ("--role", role)):
        if not value:
            fail(f"{flag} is needed (or --report to list past drills)")
    if fault not in DRILL_FAULTS:
        fail(f"--fault {fault!r} is not one of {', '.join(DRILL_FAULTS)}")
    follow_for = _int("--timeout", timeout)
    body = {
        "job": job,
        "fault": fault,
        "role": role,
        "rank": _int("--rank", rank),
        "at_step": _int("--at-step", at_step),
        "plan": plan,
    }
    api = _Api(url, _token(token_file))
    d = api.call("POST", "/api/v1/drills", json=body)
    if plan:
        typer.echo(f"plan (drill {d['id']}, nothing injected): {d['what']}")
        typer.echo(f"then RLGuard, with the shipped policy: {d['expected']}")
        return
    info(f"drill {d['id']}: {d['status']}: {d.get('what') or 'sent to the node launcher'}")
    deadline = time.monotonic() + float(follow_for or 0)
    state = None
    while wait and d["status"] not in FINAL and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
        d = api.call("GET", f"/api/v1/drills/{d['id']}")
        now_state = (d["status"], (d.get("report") or {}).get("state"))
        if now_state != state:
            state = now_state
            info(f"drill {d['id']}: {d['status']}" + (f": {state[1]}" if state[1] else ""))
    typer.echo("\n".join(report_lines(d)))
    if d["status"] == "refused":
        raise typer.Exit(1)
