"""``rlguard worker`` and ``rlguard replay`` (registered on the main CLI in app/cli/__init__.py)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"rlguard: error: {message}", err=True)
    raise typer.Exit(code)


def worker(
    node: Annotated[
        list[str] | None,
        typer.Option(
            "--node", help="Consume queue node.NODE (repeatable); without it: the cluster queue."
        ),
    ] = None,
    cluster: Annotated[
        bool, typer.Option("--cluster", help="Also consume the cluster queue.")
    ] = False,
    concurrency: Annotated[int, typer.Option(help="Worker processes.")] = 1,
    loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "INFO",
) -> None:
    """Run a recovery worker (Celery) for the cluster queue or a node's queue."""
    from app.tasks.worker import queues_for, run_worker

    if concurrency < 1:
        _fail(f"--concurrency {concurrency} must be at least 1")
    nodes = node or []
    try:
        queues = queues_for(nodes, cluster=cluster or not nodes)
    except ValueError as exc:
        _fail(str(exc))
    name = f"node-{nodes[0]}" if nodes else "cluster"
    run_worker(queues, name=name, concurrency=concurrency, loglevel=loglevel.upper())


def replay(
    trace: Annotated[Path, typer.Argument(help="JSON lines of ingest batches (.gz accepted).")],
    speed: Annotated[
        float | None,
        typer.Option(help="Times real time (e.g. 60); default: as fast as possible."),
    ] = None,
    policy: Annotated[
        Path | None, typer.Option(help="Policy file (default: the shipped one).")
    ] = None,
    tail: Annotated[
        float, typer.Option(help="Seconds to keep ticking after the last batch.")
    ] = 0.0,
) -> None:
    """Replay a recorded trace through a fresh policy engine; print incidents, tiers, delays."""
    from app.policy.policy_file import PolicyFileError
    from app.policy.replay import TraceError, format_report, replay_file

    if speed is not None and (not math.isfinite(speed) or speed <= 0):
        _fail(f"--speed {speed} must be a positive number")
    if tail < 0:
        _fail(f"--tail {tail} must not be negative")
    try:
        result, score = replay_file(trace, speed=speed, policy_path=policy, tail_seconds=tail)
    except (TraceError, PolicyFileError) as exc:
        _fail(str(exc))
    for line in format_report(result, score):
        typer.echo(line)
