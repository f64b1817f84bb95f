"""One vLLM engine as a supervised participant: the rollout role of a job whose trainer talks
to a vLLM server at a fixed address (TRL's ``vllm_mode="server"``, or any other)::

    rlguard launch --job J --role rollout --run-dir D -- \\
        python -m integrations.vllm.host --model DIR --port 8000 [--max-model-len N] \\
            [--served-model-name NAME] [--kv-cache-gib N] [--start-timeout S] \\
            [-- MORE VLLM SERVER ARGUMENTS]

The host starts a vLLM OpenAI server for ``DIR`` on ``--port`` with RLGuard's weight loader
(:mod:`integrations.vllm.worker_extension`), announces it in ``engines/<role>-<rank>.json`` of
the run directory (for the node agent), and writes the rank's heartbeat (``STARTING``, then
``ROLLOUT`` with the served weight version as the step). When the API server exits the host
exits with a failure; RLGuard heals the rank with ``restart_role``, and the new host first kills
what is left of the previous engine tree. SIGTERM withdraws the announcement, stops the engine
and exits 0; bad arguments end in one line on stderr and exit code 2, before anything starts.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn

from integrations import ENV_JOB, ENV_ROLE, ENV_RUN_DIR
from integrations.vllm.client import EngineClient
from integrations.vllm.server import (
    EngineError,
    EngineSettings,
    VLLMServer,
    checkout_pythonpath,
    kill_leftovers,
    popen_dying_with_parent,
    start_server,
)
from recovery.fsio import write_json_atomic
from recovery.report import JOB_PATTERN, HeartbeatReporter

PROG = "python -m integrations.vllm.host"
EXTENSION = "integrations.vllm.worker_extension.RLGuardWeightLoader"
ANNOUNCE_DIR = "engines"  # agents.collectors.engine_discovery reads it
VERSION_POLL_S = 2.0

log = logging.getLogger("rlguard.integrations.vllm.host")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{PROG}: error: {message}\n")
        raise SystemExit(2)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _port(text: str) -> int:
    value = _positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1-65535)")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number of seconds")
    return value


def _parser() -> _Parser:
    p = _Parser(prog=PROG, description="Run one vLLM engine as a supervised rollout participant.")
    p.add_argument("--model", required=True, help="the model directory the engine serves")
    p.add_argument("--port", required=True, type=_port, help="the port it listens on (fixed)")
    p.add_argument("--host", default="127.0.0.1", help="the address it listens on")
    p.add_argument("--max-model-len", type=_positive_int, default=512, help="context length")
    p.add_argument("--served-model-name", help="the model name requests give (default: --model)")
    p.add_argument("--kv-cache-gib", type=_positive_int, default=1, help="KV cache (CPU build)")
    p.add_argument("--seed", type=int, default=0, help="the engine's seed")
    p.add_argument("--start-timeout", type=_seconds, default=300.0, help="start-up limit (s)")
    p.add_argument("vllm_args", nargs=argparse.REMAINDER, help="-- then more server arguments")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    args = _parser().parse_args(argv)
    extra = list(args.vllm_args)
    if extra and extra[0] == "--":
        extra = extra[1:]
    if extra and not extra[0].startswith("-"):
        _parser().error(f"unexpected argument {extra[0]!r} (vLLM's own arguments go after --)")
    args.vllm_args = tuple(extra)
    if not (Path(args.model) / "config.json").is_file():
        _parser().error(f"--model {args.model}: not a model directory (no config.json)")
    return args


class _Stopped(Exception):
    """SIGTERM while the engine was still starting."""


class Participant:
    """Who this host is in its job, from the launcher's environment."""

    def __init__(self, environ: dict[str, str]) -> None:
        run_dir = environ.get(ENV_RUN_DIR)
        if not run_dir:
            _parser().error(f"{ENV_RUN_DIR} is not set: run the host under rlguard launch")
        self.run_dir = Path(run_dir)
        self.role = environ.get(ENV_ROLE) or "rollout"
        rank = environ.get("RANK", "0")
        if not rank.isdigit():
            _parser().error(f"RANK={rank!r} is not a rank")
        self.rank = int(rank)
        self.job = environ.get(ENV_JOB) or self.run_dir.name
        if not JOB_PATTERN.fullmatch(self.job):
            _parser().error(f"{ENV_JOB}={self.job!r} is not a job name")

    @property
    def announcement(self) -> Path:
        return self.run_dir / ANNOUNCE_DIR / f"{self.role}-{self.rank}.json"


def _announce(who: Participant, server: VLLMServer, *, ready: bool) -> None:
    """Write where the engine listens and the pids of its tree (read by the agent, and by the
    next host, which kills what is left of them)."""
    pids = server.tree().named_pids() if ready else {"api_server": server.pid}
    who.announcement.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(
        who.announcement,
        {
            "url": server.url,
            "engine": "vllm",
            "ready": ready,
            "pids": pids,
            "host_pid": os.getpid(),
            "written": time.time(),
        },
    )


def _kill_previous(who: Participant) -> list[int]:
    """Kill what is left of the rank's previous engine (a hung one outlives its host)."""
    try:
        previous = json.loads(who.announcement.read_text(encoding="utf-8"))
        pids = [int(previous.get("host_pid", 0)), *map(int, previous["pids"].values())]
        written = float(previous["written"])
    except FileNotFoundError:
        return []
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning(
            "previous announcement %s unreadable (%s): nothing killed", who.announcement, exc
        )
        return []
    # Every pid of the file was running when it was written (1 s for the clocks' granularity).
    return kill_leftovers(pids, spare={os.getpid()}, created_before=written + 1.0)


def _served_version(client: EngineClient) -> int | None:
    """The weight version every worker serves (None: the start-up weights, mixed versions during
    a refit, or no answer: the agent judges the engine's health, not the host)."""
    try:
        # No timeout in the call: the client's own (VERSION_POLL_S) bounds the HTTP request.
        answers = client.collective_rpc("rlguard_weight_version")
    except EngineError:
        return None
    versions = {a.get("version") if isinstance(a, dict) else a for a in answers}
    version = versions.pop() if len(versions) == 1 else None
    return version if isinstance(version, int) else None


def serve(who: Participant, server: VLLMServer, stop: threading.Event) -> int:
    """Report for the engine until it exits (its exit code, 1 at least) or ``stop`` is set (0)."""
    hb = HeartbeatReporter(who.run_dir, who.role, who.rank, job=who.job, interval=0.5)
    client = EngineClient(server.url, server.model_name, timeout=VERSION_POLL_S)
    version: int | None = None
    polled = 0.0
    try:
        while not stop.is_set():
            if not server.running():
                code = server.process.returncode
                log.error("the engine's API server %d exited with %s", server.pid, code)
                return code if code else 1
            if time.monotonic() - polled >= VERSION_POLL_S:
                version = _served_version(client)
                polled = time.monotonic()
            hb.update(phase="ROLLOUT", step=version)
            stop.wait(0.2)
        return 0
    finally:
        hb.update(phase="STOPPED" if stop.is_set() else "ROLLOUT", force=True)
        hb.close()
        client.close()


def run(args: argparse.Namespace, who: Participant) -> int:
    stop = threading.Event()
    serving = threading.Event()

    def on_sigterm(*_: object) -> None:
        stop.set()
        if not serving.is_set():
            raise _Stopped  # out of the start-up wait at once; serve() watches ``stop``

    signal.signal(signal.SIGTERM, on_sigterm)
    server: VLLMServer | None = None
    try:
        killed = _kill_previous(who)
        if killed:
            log.warning("killed what was left of the previous engine: pids %s", killed)
        hb = HeartbeatReporter(who.run_dir, who.role, who.rank, job=who.job, interval=0.5)
        hb.update(phase="STARTING", force=True)
        hb.close()
        server = _start(args, who)
        _announce(who, server, ready=False)
        seconds = server.wait_healthy(timeout=args.start_timeout)
        _announce(who, server, ready=True)
        log.info("engine %s up in %.1f s (API server %d)", server.url, seconds, server.pid)
        serving.set()
        return serve(who, server, stop)
    except EngineError as exc:
        log.error("the engine did not start: %s", exc)
        return 1
    except _Stopped:
        return 0
    finally:
        if server is not None:
            if stop.is_set():
                # Stopped on purpose: an engine its job stopped is not a dead one (the agent
                # watches announced engines that are ready). One that died stays ready: that is
                # how the agent sees it dead.
                _announce(who, server, ready=False)
            server.stop(timeout=10.0)


def _start(args: argparse.Namespace, who: Participant) -> VLLMServer:
    logs = who.run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    settings = EngineSettings(
        max_model_len=args.max_model_len,
        seed=args.seed,
        kv_cache_gib=args.kv_cache_gib,
        worker_extension_cls=EXTENSION,
        served_model_name=args.served_model_name,
        extra_args=args.vllm_args,
    )
    return start_server(
        Path(args.model),
        settings=settings,
        host=args.host,
        port=args.port,
        log_path=logs / f"engine-{who.role}-{who.rank}-{os.getpid()}.log",
        env={**os.environ, "PYTHONPATH": checkout_pythonpath()},
        popen=popen_dying_with_parent,
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    who = Participant(dict(os.environ))
    return run(args, who)


if __name__ == "__main__":
    raise SystemExit(main())
