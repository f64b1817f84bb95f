"""``rlguard demo``: the whole product on one machine, on a real (small) RL job.

Embedded mode (SQLite, no Redis): ``rlguard up`` (server + policy scheduler + Celery worker),
a node agent (real NVML when a GPU is there, otherwise simulated GPUs, labelled so), the
reference GRPO job (``python -m workload.launch``, which is also the launcher hook) and a chaos
schedule that produces a light, a heavy and a medium incident in the first minutes:

* light: thermal throttling on a (simulated) GPU: recorded and alerted, no action;
* heavy: ``kill -9`` of the trainer in the job's first steps (RobustRL's first-step anomaly):
  SAFE_MODE at once, a whole-job restart that waits for an approver (dashboard or REST);
* medium: ``kill -9`` of a rollout worker: only that role is restarted, automatically.

``app`` never imports ``agents`` or ``workload``: they run as subprocesses. Every process is
started in its own session and stopped (SIGTERM, then SIGKILL) on Ctrl-C or at ``--duration``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
import yaml

JOB = "grpo-demo"
NODE = "demo-node"
USER = "demo"

# Faults by training step (the workload.chaos schedule format).
DEFAULT_SCHEDULE: list[dict[str, Any]] = [
    {"at_step": 0, "delay": 1.0, "fault": "thermal", "gpu": 0, "on": True},
    {"at_step": 1, "delay": 0.5, "fault": "kill", "role": "trainer", "rank": 0},
    {"at_step": 4, "delay": 0.5, "fault": "kill", "role": "rollout", "rank": 1},
]


def demo_policy(path: Path, edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """The shipped policy with detection windows short enough for a demo; ``edit`` changes the
    result further (a benchmark's own limits)."""
    from app.policy.policy_file import DEFAULT_POLICY_PATH

    data = yaml.safe_load(DEFAULT_POLICY_PATH.read_text(encoding="utf-8"))
    data["tick_seconds"] = 0.5
    data["incidents"]["quiet_period_seconds"] = 15
    data["detection"]["heartbeat"].update(suspect_seconds=2, confirm_seconds=3)
    data["detection"]["stale_sample_seconds"] = 5
    data["detection"]["gpu"].update(throttle_sustain_seconds=3, event_hold_seconds=20)
    data["detection"]["rollout"]["stall_timeout_seconds"] = 10
    data["golden_metrics"]["state_log_write_latency_ms"]["breach_seconds"] = 2
    data["golden_metrics"]["rollout_pending_ratio"]["breach_seconds"] = 5
    if edit is not None:
        edit(data)
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _gpu_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount()) > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - any NVML failure means "no usable GPU": simulate
        return False


@dataclass
class DemoStack:
    """The demo's processes; also used by the ETTR benchmark and the integration tests."""

    workdir: Path
    port: int
    job: str = JOB
    steps: int = 40
    rollouts: int = 2
    decode_ms: float = 15.0
    simulate_gpus: int | None = 2
    schedule: list[dict[str, Any]] | None = field(default_factory=lambda: list(DEFAULT_SCHEDULE))
    # The agent's --node, its token's node and the worker's embedded node (a Slurm test names
    # the Slurm node: a drain acts on the node the agent reports from).
    node: str = NODE
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    token: str = ""
    password: str = ""
    # Applied to the demo policy (see demo_policy) each time it is written.
    policy_edit: Callable[[dict[str, Any]], None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def run_root(self) -> Path:
        return self.workdir / "runs"

    @property
    def run_dir(self) -> Path:
        return self.run_root / self.job

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RLGUARD_")}
        root = Path(__file__).resolve().parents[1]
        env.update(
            PYTHONPATH=os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")])),
            RLGUARD_DATA_DIR=str(self.workdir / "data"),
            RLGUARD_RECOVERY_EMBEDDED_NODES=self.node,
            RLGUARD_RECOVERY_RUN_ROOT=str(self.run_root),
            RLGUARD_RECOVERY_LAUNCHER=str(self.workdir / "launcher-hook"),
            RLGUARD_RECOVERY_POLICY_FILE=str(
                demo_policy(self.workdir / "policy.yaml", self.policy_edit)
            ),
        )
        return env

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.workdir / "logs" / f"{name}.log", "ab")  # noqa: SIM115
        try:
            proc = subprocess.Popen(
                argv,
                env=self._env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()
        self.procs[name] = proc
        return proc

    def start_server(self, timeout: float = 90.0) -> None:
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "workload.launch",
                "write-hook",
                str(self.workdir / "launcher-hook"),
                "--run-root",
                str(self.run_root),
            ],
            env=self._env(),
            check=True,
            timeout=60,
        )
        self._spawn(
            "server",
            [
                sys.executable,
                "-c",
                "from app.cli import main; main()",
                "up",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ],
        )
        self._wait_healthy(timeout)
        self._credentials()

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=self.url, timeout=3) as http:
            while True:
                server = self.procs["server"]
                if server.poll() is not None:
                    raise RuntimeError(
                        f"rlguard up exited {server.returncode}; see {self.workdir}/logs/server.log"
                    )
                try:
                    if http.get("/healthz").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not come up within {timeout:g}s")
                time.sleep(0.3)

    def _credentials(self) -> None:
        from sqlmodel import Session, select

        from app.auth.tokens import create_node_token
        from app.auth.users import create_user
        from app.core.db import make_engine
        from app.models import Role, User

        engine = make_engine(f"sqlite:///{self.workdir / 'data' / 'rlguard.db'}")
        self.password = secrets.token_urlsafe(12)
        try:
            with Session(engine) as s:
                node_token = create_node_token(s, node=self.node, actor="system:demo")[1]
                name = (
                    USER
                    if s.exec(select(User).where(User.name == USER)).first() is None
                    else f"{USER}{secrets.randbelow(10_000)}"
                )
                self.user = name
                self.token = create_user(
                    s, name=name, role=Role.admin, actor="system:demo", password=self.password
                )[1]
                s.commit()
        finally:
            engine.dispose()
        token_file = self.workdir / "node.token"
        token_file.write_text(node_token, encoding="utf-8")
        token_file.chmod(0o600)

    def start_agent(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable,
            "-m",
            "agents",
            "--server",
            self.url,
            "--token-file",
            str(self.workdir / "node.token"),
            "--node",
            self.node,
            "--run-dir",
            str(self.run_dir),
            "--interval",
            "0.5",
            "--spool-dir",
            str(self.workdir / f"spool-{self.job}"),
            "--log-level",
            "WARNING",
        ]
        if self.simulate_gpus:
            argv += ["--simulate-gpus", str(self.simulate_gpus)]
        self._spawn("agent", argv)

    def start_job(self, *extra: str) -> None:
        self._spawn(
            "job",
            [
                sys.executable,
                "-m",
                "workload.launch",
                "--run-dir",
                str(self.run_dir),
                "--steps",
                str(self.steps),
                "--rollouts",
                str(self.rollouts),
                "--decode-ms",
                str(self.decode_ms),
                "--job",
                self.job,
                *extra,
            ],
        )

    def start_chaos(self) -> None:
        if not self.schedule:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)  # the schedule may start before the job
        path = self.workdir / f"chaos-{self.job}.json"
        path.write_text(json.dumps(self.schedule), encoding="utf-8")
        self._spawn(
            "chaos",
            [
                sys.executable,
                "-m",
                "workload.chaos",
                "--run-dir",
                str(self.run_dir),
                "schedule",
                str(path),
            ],
        )

    def stop_one(self, name: str, timeout: float = 20.0) -> None:
        """Stop one process group (SIGTERM, then SIGKILL)."""
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def start(self) -> None:
        self.start_server()
        self.start_agent()
        self.start_job()
        self.start_chaos()

    # ---- reading the state ------------------------------------------------------------------

    def api(self, method: str, path: str, **kw: Any) -> httpx.Response:
        with httpx.Client(base_url=self.url, timeout=10) as http:
            return http.request(
                method, path, headers={"Authorization": f"Bearer {self.token}"}, **kw
            )

    def incidents(self) -> list[dict[str, Any]]:
        r = self.api("GET", "/api/v1/incidents", params={"status": "all"})
        if r.status_code == 422:
            r = self.api("GET", "/api/v1/incidents")
        r.raise_for_status()
        rows: list[dict[str, Any]] = r.json()["incidents"]
        return rows

    def incident(self, incident_id: int) -> dict[str, Any]:
        r = self.api("GET", f"/api/v1/incidents/{incident_id}")
        r.raise_for_status()
        body: dict[str, Any] = r.json()
        return body

    def pending_approvals(self) -> list[dict[str, Any]]:
        r = self.api("GET", "/api/v1/approvals")
        r.raise_for_status()
        rows: list[dict[str, Any]] = r.json()
        return rows

    def job_status(self) -> dict[str, Any]:
        try:
            beat = json.loads((self.run_dir / "heartbeat" / "trainer-0.json").read_text())
        except (OSError, json.JSONDecodeError):
            beat = {}
        return {
            "step": beat.get("step"),
            "phase": beat.get("phase"),
            "done": (self.run_dir / "DONE").exists(),
        }

    # ---- stopping ---------------------------------------------------------------------------

    def stop(self, timeout: float = 20.0) -> list[str]:
        """Stop every process group (chaos and job first); returns names that needed SIGKILL."""
        killed = []
        for name in ("chaos", "job", "agent", "server"):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                killed.append(name)
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        for proc in self.procs.values():  # anything a dead leader left in its session
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return killed


def _table(stack: DemoStack, started: float) -> Any:
    from rich.table import Table

    status = stack.job_status()
    title = (
        f"RLGuard demo: job {JOB} step {status['step']}/{stack.steps} phase {status['phase']}"
        f"{' (done)' if status['done'] else ''}  [{time.monotonic() - started:.0f}s]"
    )
    table = Table(title=title, expand=True)
    for col in ("incident", "tier", "kind", "status", "subject", "actions"):
        table.add_column(col)
    try:
        rows = stack.incidents()
        for inc in rows[:12]:
            detail = stack.incident(inc["id"])
            actions = ", ".join(f"{a['action']}:{a['status']}" for a in detail.get("actions", []))
            subject = inc.get("subject") or {}
            table.add_row(
                str(inc["id"]),
                inc["tier"],
                inc["kind"],
                inc["status"],
                " ".join(f"{k}={v}" for k, v in subject.items() if v is not None),
                actions,
            )
        pending = stack.pending_approvals()
    except httpx.HTTPError as exc:
        table.caption = f"server not answering: {exc}"
        return table
    if pending:
        table.caption = (
            f"{len(pending)} heavy-tier recovery waiting for approval: "
            f"{stack.url}/approvals (or POST /api/v1/approvals/{pending[0]['id']}/approve)"
        )
    return table


DEMO_DIR_MARKER = ".rlguard-demo"


def prepare_demo_dir(workdir: Path) -> Path:
    """Empty the demo's directory for a fresh run, refusing to wipe anything the demo did not make.

    Only a missing or empty directory, or one carrying the marker a previous demo left, is
    (re)created: ``--dir ~`` must never delete someone's home.
    """
    workdir = workdir.resolve()
    if workdir.exists():
        if not workdir.is_dir():
            raise ValueError(f"--dir {workdir} exists and is not a directory")
        if any(workdir.iterdir()) and not (workdir / DEMO_DIR_MARKER).exists():
            raise ValueError(
                f"--dir {workdir} is not empty and was not made by `rlguard demo`; "
                "choose an empty or new directory"
            )
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    (workdir / DEMO_DIR_MARKER).write_text("made by rlguard demo; wiped at its next start\n")
    return workdir


def _bad_option(*, steps: int, duration: float | None, port: int) -> str | None:
    if steps < 6:
        return f"--steps {steps} is too short for the chaos schedule (at least 6)"
    if duration is not None and not duration > 0:
        return f"--duration {duration} must be > 0"
    if not 1 <= port <= 65535:
        return f"--port {port} is not a TCP port"
    return None


def _announce(console: Any, stack: DemoStack, workdir: Path, *, simulated_gpus: int | None) -> None:
    """Where the dashboard is and how to sign in (also in a file only the user can read)."""
    console.print(
        f"[bold]dashboard[/bold] {stack.url}/  login [bold]{stack.user}[/bold] / "
        f"[bold]{stack.password}[/bold]   (API token in {workdir}/demo-login.txt)"
    )
    (workdir / "demo-login.txt").write_text(
        f"url: {stack.url}\nuser: {stack.user}\npassword: {stack.password}\napi_token: {stack.token}\n"
    )
    (workdir / "demo-login.txt").chmod(0o600)
    console.print(
        "GPUs: "
        + (
            "real (NVML)"
            if simulated_gpus is None
            else f'{simulated_gpus} SIMULATED (no GPU on this machine; samples labelled simulated="1")'
        )
    )
    console.print("Ctrl-C stops everything.")


def demo(
    port: Annotated[int, typer.Option(help="Port of the dashboard.")] = 8765,
    workdir: Annotated[
        Path, typer.Option("--dir", help="Where the demo keeps its data (wiped at start).")
    ] = Path("rlguard-demo"),
    steps: Annotated[int, typer.Option(help="Training steps of the demo job.")] = 40,
    duration: Annotated[
        float | None, typer.Option(help="Stop after this many seconds (default: Ctrl-C).")
    ] = None,
    gpus: Annotated[int, typer.Option(help="Simulated GPUs when this machine has none.")] = 2,
    chaos: Annotated[bool, typer.Option(help="Inject the light, heavy and medium faults.")] = True,
) -> None:
    """Run server, worker, agent, a small GRPO job and a chaos schedule on this machine."""
    from rich.console import Console
    from rich.live import Live

    console = Console()
    problem = _bad_option(steps=steps, duration=duration, port=port)
    if problem:
        console.print(f"rlguard: error: {problem}")
        raise typer.Exit(2)
    try:
        workdir = prepare_demo_dir(workdir)
    except ValueError as exc:
        console.print(f"rlguard: error: {exc}")
        raise typer.Exit(2) from exc
    real_gpu = _gpu_present()
    stack = DemoStack(
        workdir,
        port,
        steps=steps,
        simulate_gpus=None if real_gpu else gpus,
        schedule=DEFAULT_SCHEDULE if chaos else None,
    )
    stop = {"now": False}

    def on_signal(signum: int, _frame: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    started = time.monotonic()
    try:
        console.print(f"starting RLGuard in embedded mode in {workdir} ...")
        stack.start()
        _announce(console, stack, workdir, simulated_gpus=None if real_gpu else gpus)
        with Live(_table(stack, started), console=console, refresh_per_second=1) as live:
            while not stop["now"]:
                if duration is not None and time.monotonic() - started > duration:
                    break
                for name in ("server", "job"):
                    proc = stack.procs.get(name)
                    if name == "server" and proc is not None and proc.poll() is not None:
                        raise RuntimeError(
                            f"the server exited ({proc.returncode}); see {workdir}/logs"
                        )
                live.update(_table(stack, started))
                time.sleep(1.0)
    except RuntimeError as exc:
        console.print(f"rlguard: error: {exc}")
        raise typer.Exit(1) from None
    finally:
        console.print("stopping ...")
        leftovers = stack.stop()
        console.print("stopped" + (f" (had to kill {', '.join(leftovers)})" if leftovers else ""))
