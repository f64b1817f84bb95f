"""The inference engines a job announces in its run directory, watched with no ``--engine`` flag.

A job whose rollout role serves from engines (the reference job with ``--rollout-engine vllm``)
writes one file per engine, ``<run-dir>/engines/<role>-<rank>.json``, and rewrites it whenever
that rank gets a new engine (a woken standby, a cold start, each on a port of its own)::

    {"url": "http://127.0.0.1:8301", "ready": true, "pids": {"api_server": 4242, ...},
     "engine": "vllm"}

``engine`` is optional (``vllm``). A fixed ``--engine`` list cannot follow replacements: the URL
changes with every new engine. So each round the agent reads the announcements and probes the
engines they name, with the participant's labels; an engine appears once it is ``ready`` (its
start-up is its host's business, reported in its heartbeat), and a rank's engine is followed to
its successor when the file is rewritten. An announced engine that dies stays announced until
its successor is written: that is how its death is seen (probe and process tree).

The job label is the one the participant's own heartbeat carries, so the engine's series join
its participant's; a file that cannot be read or names a bad value is skipped, with one warning
per file and reason (a file being rewritten is read again next round).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from agents.collectors.engines import EngineSpec, EngineSpecError
from recovery.report import JOB_PATTERN, heartbeat_path

log = logging.getLogger("rlguard.agent.engines")

ANNOUNCE_DIR = "engines"
_ANNOUNCEMENT = re.compile(r"^(?P<role>[A-Za-z][A-Za-z0-9_]*)-(?P<rank>\d{1,7})\.json$")


class AnnouncedEngines:
    """Reads ``<run-dir>/engines/<role>-<rank>.json`` each round (see the module docstring)."""

    def __init__(self, run_dir: Path, default_job: str) -> None:
        self._dir = run_dir / ANNOUNCE_DIR
        self._run_dir = run_dir
        self._default_job = default_job
        self._warned: set[tuple[str, str]] = set()

    def __call__(self) -> list[EngineSpec]:
        try:
            names = sorted(p.name for p in self._dir.iterdir())
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            self._warn(str(self._dir), f"cannot list: {exc.strerror or exc}")
            return []
        specs = []
        for name in names:
            match = _ANNOUNCEMENT.match(name)
            if match is None:
                continue  # not an announcement (the job's own files live here too)
            spec = self._read(name, match["role"], int(match["rank"]))
            if spec is not None:
                specs.append(spec)
        return specs

    def _read(self, name: str, role: str, rank: int) -> EngineSpec | None:
        try:
            body: Any = json.loads((self._dir / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # being rewritten (or gone): read again next round
        if not isinstance(body, dict) or body.get("ready") is not True:
            return None
        pids = body.get("pids")
        api_server = pids.get("api_server") if isinstance(pids, dict) else None
        text = f"{body.get('engine', 'vllm')}={body.get('url')},role={role},rank={rank}"
        text += f",job={self._job_of(role, rank)}"
        if isinstance(api_server, int) and not isinstance(api_server, bool):
            text += f",pid={api_server}"
        try:
            return EngineSpec.parse(text)
        except EngineSpecError as exc:
            self._warn(name, str(exc))
            return None

    def _job_of(self, role: str, rank: int) -> str:
        """The job the participant's heartbeat names (its engine's series join it there)."""
        try:
            beat = json.loads(heartbeat_path(self._run_dir, role, rank).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return self._default_job
        job = beat.get("job") if isinstance(beat, dict) else None
        return job if isinstance(job, str) and JOB_PATTERN.fullmatch(job) else self._default_job

    def _warn(self, where: str, why: str) -> None:
        if (where, why) not in self._warned:
            self._warned.add((where, why))
            log.warning("engine announcement %s skipped: %s", where, why)
