"""``rlguard replay``: recorded traces through a fresh policy engine (registered in app/cli)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from app.cli.common import fail

CheckOption = Annotated[
    bool,
    typer.Option(
        "--check",
        help="Exit 1 unless the labelled traces clear the bar: precision and recall >= "
        "0.98, no false heavy tier, every delay within its window.",
    ),
]


def replay(
    traces: Annotated[
        list[Path],
        typer.Argument(
            help="JSON lines of ingest batches (.gz accepted), or directories of them (a "
            "labelled corpus: each trace beside its .labels.json)."
        ),
    ],
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
    compress: Annotated[
        float,
        typer.Option(
            help="Replay time-compressed by this factor, the policy's durations scaled alike."
        ),
    ] = 1.0,
    check: CheckOption = False,
) -> None:
    """Replay recorded traces through a fresh policy engine; print incidents, tiers, delays.

    One trace: every decision. Several, or a directory: one line per trace and the corpus's
    precision, recall and delays."""
    from app.policy.policy_file import PolicyFileError
    from app.policy.replay import (
        TraceError,
        format_corpus,
        format_report,
        replay_corpus,
        replay_file,
        trace_files,
    )

    if speed is not None and (not math.isfinite(speed) or speed <= 0):
        fail(f"--speed {speed} must be a positive number")
    if not math.isfinite(tail) or tail < 0:
        fail(f"--tail {tail} must not be negative")
    if not math.isfinite(compress) or compress < 1:
        fail(f"--compress {compress} must be a number of at least 1")
    try:
        files = trace_files(traces)
        if len(files) == 1 and not traces[0].is_dir():
            if speed is not None and compress != 1:
                fail("--speed and --compress cannot be combined")
            result, score = replay_file(
                files[0],
                speed=speed,
                policy_path=policy,
                tail_seconds=tail,
                compress_by=compress,
            )
            for line in format_report(result, score):
                typer.echo(line)
            if check and score is None:
                fail(f"--check: {files[0]} has no labels file beside it", code=1)
            if check and score is not None and not score.clears_bar:
                raise typer.Exit(1)
            return
        if speed is not None or tail:
            fail("--speed and --tail apply to a single trace, not a corpus")
        corpus = replay_corpus(files, policy_path=policy, compress_by=compress)
    except (TraceError, PolicyFileError) as exc:
        fail(str(exc))
    for line in format_corpus(corpus, compress):
        typer.echo(line)
    if check and not corpus.passes:
        raise typer.Exit(1)
