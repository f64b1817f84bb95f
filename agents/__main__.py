"""``python -m agents`` (also ``rlguard agent ...``): run the node agent or print its status.

    python -m agents --server URL --token TOKEN --node NODE --run-dir DIR [--interval S]
                     [--simulate-gpus N | --gpu-source dcgm-exporter [--dcgm-url URL]]
                     [--engine vllm=URL[,role=R,rank=N,job=J,pid=P] ...]
                     [--spool-dir D] [--spool-max-bytes B] [--record FILE]
    python -m agents --node NODE [--spool-dir D] --status [--json]

Bad values end the program with one line naming the option and the value, exit status 2.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import math
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

import orjson

from agents.agent import STATUS_FILENAME, Agent, AgentConfig, default_spool_dir
from agents.collectors.dcgm import DEFAULT_DCGM_URL
from agents.collectors.engines import EngineSpec, EngineSpecError
from agents.fingerprint import DEFAULT_PACKAGES
from agents.spool import SpoolError
from recovery.pids import process_exists

# The server's identifier rule for node names (ingest contract).
_NODE_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:@/-]{0,127}$")
_SIZE = re.compile(r"^(\d+)\s*([KMGT]i?B?|B)?$", re.I)
_SIZE_FACTORS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, not argparse's usage block: the message names the option and the value.
        self.exit(2, f"{self.prog}: error: {message}\n")


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")


def _err(line: str) -> None:
    sys.stderr.write(line + "\n")


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or not 0.05 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"must be between 0.05 and 3600 seconds, got {text!r}")
    return value


def _gpu_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of GPUs, got {text!r}") from None
    if not 0 <= value <= 1024:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1024, got {text!r}")
    return value


def _size(text: str) -> int:
    match = _SIZE.fullmatch(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(
            f"must be a byte count such as 268435456, 256M or 1G, got {text!r}"
        )
    value = int(match.group(1)) * _SIZE_FACTORS[(match.group(2) or "")[:1].upper()]
    if value < 64 * 1024:
        raise argparse.ArgumentTypeError(f"must be at least 64K (65536 bytes), got {text!r}")
    return value


def _url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(f"must be an http:// or https:// URL, got {text!r}")
    return text.rstrip("/")


def _engine(text: str) -> EngineSpec:
    try:
        return EngineSpec.parse(text)
    except EngineSpecError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _slurm_node(text: str) -> str:
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", text):
        raise argparse.ArgumentTypeError(f"not a Slurm node name: {text!r}")
    return text


def _node(text: str) -> str:
    if not _NODE_PATTERN.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"must be 1-128 characters of letters, digits and _.:@/- (not starting with "
            f"a punctuation mark), got {text!r}"
        )
    return text


def _ray_address(text: str) -> str:
    if text == "auto":
        return text
    if "://" in text:
        return _url(text)
    if re.fullmatch(r"[A-Za-z0-9_.-]+:\d{1,5}", text):
        return f"http://{text}"
    raise argparse.ArgumentTypeError(
        f"must be 'auto' or the Ray dashboard's address (http://HEAD:8265 or HEAD:8265), "
        f"got {text!r}"
    )


def _job(text: str) -> str:
    if not _NODE_PATTERN.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"must be 1-128 characters of letters, digits and _.:@/- (not starting with "
            f"a punctuation mark), got {text!r}"
        )
    return text


def _packages(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", n)]
    if bad:
        raise argparse.ArgumentTypeError(f"not a package name: {bad[0]!r}")
    return names


def build_parser() -> argparse.ArgumentParser:
    """The command line of the agent."""
    p = _Parser(
        prog="rlguard agent",
        description=(
            "RLGuard node agent: streams GPU health (NVML) and the RL job's signals (heartbeat "
            "files, state log) to the RLGuard server, spooling to disk while it is unreachable."
        ),
    )
    p.add_argument("--server", type=_url, help="server base URL, e.g. http://rlguard:8000")
    p.add_argument("--token", help="this node's bearer token (rlguard token create --node NODE)")
    p.add_argument(
        "--token-file", type=Path, help="read the token from this file instead (keeps it out of ps)"
    )
    p.add_argument("--node", type=_node, required=True, help="this node's name, as in its token")
    p.add_argument(
        "--run-dir", type=Path, help="the job's run directory (heartbeat/, state_log.jsonl)"
    )
    p.add_argument(
        "--interval", type=_interval, default=1.0, help="seconds between rounds (default 1)"
    )
    _add_source_options(p)
    _add_spool_options(p)
    p.add_argument(
        "--status", action="store_true", help="print the running agent's health and exit"
    )
    p.add_argument("--json", action="store_true", help="with --status: print JSON")
    p.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level (default INFO)",
    )
    return p


def _add_source_options(p: argparse.ArgumentParser) -> None:
    """Where the samples come from besides the heartbeat files: GPUs, engines, Ray, Slurm."""
    p.add_argument(
        "--simulate-gpus",
        type=_gpu_count,
        default=0,
        metavar="N",
        help='simulate N GPUs instead of NVML (samples labelled simulated="1"); faults are '
        "injected through <run-dir>/rlguard-simulate/*.json",
    )
    p.add_argument(
        "--gpu-source",
        choices=["nvml", "dcgm-exporter"],
        default="nvml",
        help="where GPU health comes from: NVML (default) or the node's dcgm-exporter",
    )
    p.add_argument(
        "--dcgm-url",
        type=_url,
        help=f"with --gpu-source dcgm-exporter: its metrics URL (default {DEFAULT_DCGM_URL})",
    )
    p.add_argument(
        "--engine",
        type=_engine,
        action="append",
        default=[],
        metavar="KIND=URL[,role=R,rank=N,job=J,pid=P]",
        help="an inference engine (vllm, trl-vllm-serve or sglang) serving this job's rollouts: "
        "probe its /health and scrape its /metrics every round, and when it runs on this node "
        "watch its processes (its API server: pid=P, else the process listening on the URL's "
        "port) (repeatable; role defaults to rollout, rank to 0)",
    )
    p.add_argument(
        "--ray",
        type=_ray_address,
        metavar="auto|ADDRESS",
        help="watch a Ray cluster's actors as participants (verl, OpenRLHF): 'auto' on a node "
        "of the cluster, or its dashboard URL http://HEAD:8265 (needs rlguard[ray])",
    )
    p.add_argument(
        "--ray-preset",
        default="verl",
        metavar="verl|openrlhf|FILE",
        help="which actor class is which role (default verl; a YAML/JSON file for others)",
    )
    p.add_argument(
        "--ray-job", type=_job, help="with --ray: the job's name (default: from Ray's jobs)"
    )
    p.add_argument(
        "--verl-log",
        type=Path,
        metavar="PATH",
        help="follow verl's file logger (its VERL_FILE_LOGGER_PATH) for the job's signals",
    )
    p.add_argument(
        "--slurm-node",
        type=_slurm_node,
        help="this node's name in Slurm: every 10 s ask scontrol/squeue whether it is DOWN or "
        "DRAIN (a lost node) and how many jobs run on it",
    )


def _add_spool_options(p: argparse.ArgumentParser) -> None:
    """The spool that keeps batches while the server is unreachable, and what goes in them."""
    p.add_argument(
        "--spool-dir",
        type=Path,
        help="spool directory (default: ~/.local/state/rlguard/agent-NODE)",
    )
    p.add_argument(
        "--spool-max-bytes",
        type=_size,
        default=256 * 1024**2,
        help="spool size limit (default 256M)",
    )
    p.add_argument("--record", type=Path, help="also append every batch as a JSON line to FILE")
    p.add_argument(
        "--fingerprint-packages",
        type=_packages,
        default=DEFAULT_PACKAGES,
        help="comma-separated packages whose versions go into the environment fingerprint",
    )


def _ago(ts: Any, now: float) -> str:
    if not isinstance(ts, int | float):
        return "never"
    stamp = dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{stamp} ({max(0.0, now - ts):.1f} s ago)"


def _pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    return process_exists(pid)


def print_status(spool_dir: Path, *, as_json: bool, now: float) -> int:
    """Print the status file the running agent keeps; 1 when there is none."""
    path = spool_dir / STATUS_FILENAME
    try:
        status = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        _err(f"rlguard agent: no agent status at {path} (has the agent run with this spool dir?)")
        return 1
    except orjson.JSONDecodeError as exc:
        _err(f"rlguard agent: status file {path} is unreadable: {exc}")
        return 1
    status["running"] = _pid_alive(status.get("pid"))
    if as_json:
        _out(orjson.dumps(status, option=orjson.OPT_INDENT_2).decode())
        return 0
    dropped = status.get("dropped", {})
    _out(
        f"agent {status.get('agent_id')} on node {status.get('node')}: "
        f"{'running' if status['running'] else 'not running'} (pid {status.get('pid')})"
    )
    _out(f"server: {status.get('server')}")
    _out(f"status written: {_ago(status.get('updated_at'), now)}")
    _out(f"last send: {_ago(status.get('last_send_ok'), now)}")
    if status.get("last_error"):
        _out(f"last error: {status['last_error']}")
    _out(
        f"spool: {status.get('spool_batches')} batch(es), {status.get('spool_bytes')} bytes, "
        f"{status.get('spool_samples')} sample(s); limit {status.get('spool_max_bytes')} bytes"
    )
    _out("dropped samples: " + ", ".join(f"{k}={v}" for k, v in sorted(dropped.items())))
    _out(
        f"samples produced: {status.get('produced_samples')}, acknowledged: {status.get('acked_samples')}"
    )
    gpus = f"{status.get('gpus')} GPU(s){' (simulated)' if status.get('simulated') else ''}"
    nvml = (
        "available"
        if status.get("nvml_available")
        else f"unavailable ({status.get('nvml_unavailable_reason')})"
    )
    _out(f"nvml: {nvml}, {gpus}")
    return 0


def _read_token(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    if args.token and args.token_file:
        parser.error("give --token or --token-file, not both")
    token: str | None = args.token
    if args.token_file is not None:
        try:
            token = args.token_file.read_text().strip()
        except OSError as exc:
            parser.error(
                f"argument --token-file: cannot read {str(args.token_file)!r}: {exc.strerror}"
            )
    if token is None:
        token = os.environ.get("RLGUARD_AGENT_TOKEN")
    if not token:
        parser.error("the following arguments are required: --token (or --token-file)")
    if any(c.isspace() for c in token) or len(token) > 4096:
        parser.error("argument --token: a token has no whitespace and at most 4096 characters")
    return token


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m agents``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    spool_dir: Path = args.spool_dir or default_spool_dir(args.node)
    if args.status:
        import time

        return print_status(spool_dir, as_json=args.json, now=time.time())
    if args.json:
        parser.error("argument --json: only with --status")
    if args.server is None:
        parser.error("the following arguments are required: --server")
    if args.run_dir is None:
        parser.error("the following arguments are required: --run-dir")
    if not args.run_dir.is_dir():
        parser.error(f"argument --run-dir: {str(args.run_dir)!r} is not a directory")
    if args.gpu_source == "dcgm-exporter" and args.simulate_gpus:
        parser.error("argument --simulate-gpus: not with --gpu-source dcgm-exporter")
    if args.dcgm_url is not None and args.gpu_source != "dcgm-exporter":
        parser.error("argument --dcgm-url: only with --gpu-source dcgm-exporter")
    seen: set[tuple[str | None, str, int]] = set()
    for engine in args.engine:
        if (engine.job, engine.role, engine.rank) in seen:
            parser.error(
                f"argument --engine: two engines for {engine.role} rank {engine.rank}"
                f"{' of job ' + engine.job if engine.job else ''}"
            )
        seen.add((engine.job, engine.role, engine.rank))
    if args.ray_job is not None and args.ray is None and args.verl_log is None:
        parser.error("argument --ray-job: only with --ray or --verl-log")
    token = _read_token(args, parser)
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # httpx logs every request at INFO: one line per second per agent is noise, not news.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    config = AgentConfig(
        server=args.server,
        token=token,
        node=args.node,
        run_dir=args.run_dir,
        spool_dir=spool_dir,
        interval=args.interval,
        simulate_gpus=args.simulate_gpus,
        spool_max_bytes=args.spool_max_bytes,
        record=args.record,
        fingerprint_packages=args.fingerprint_packages,
        gpu_source=args.gpu_source,
        dcgm_url=args.dcgm_url or DEFAULT_DCGM_URL,
        engines=tuple(args.engine),
        slurm_node=args.slurm_node,
        ray_address=args.ray,
        ray_preset=args.ray_preset,
        ray_job=args.ray_job,
        verl_log=args.verl_log,
    )
    try:
        agent = Agent(config)
    except (SpoolError, OSError) as exc:
        _err(f"rlguard agent: error: {exc}")
        return 2
    agent.install_signal_handlers()
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
