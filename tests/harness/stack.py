"""A real RLGuard stack: a server process with the policy scheduler, real Celery worker
processes and node agents, real PostgreSQL + Redis (a Redis of a test's own, so stopping it never
touches the machine's) or the embedded variant (SQLite + kombu's SQLAlchemy broker). Faults are
injected only through ``POST /api/v1/ingest``, by a feeder thread that plays the node agents, or
by real agent processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml
from sqlmodel import Session

from app.auth.tokens import create_node_token
from app.auth.users import create_user
from app.core import migrate
from app.core.db import make_engine
from app.models import Role
from app.policy.policy_file import DEFAULT_POLICY_PATH
from tests.harness.processes import REPO, RLGUARD, AgentProcess, ServerProcess, start_worker
from tests.harness.reaper import kill_group
from tests.harness.services import RedisServer, free_port
from tests.harness.waiting import wait_for

PY = sys.executable
JOB = "grpo-a"
FAKE_LAUNCHER = Path(__file__).with_name("fake_launcher.py")


def fast_policy(path: Path, **overrides: Any) -> Path:
    data = yaml.safe_load(DEFAULT_POLICY_PATH.read_text())
    data["tick_seconds"] = 0.5
    data["incidents"]["quiet_period_seconds"] = 3
    data["detection"]["heartbeat"].update(suspect_seconds=1.5, confirm_seconds=2)
    data["detection"]["stale_sample_seconds"] = 5
    data["recovery"]["rollout_timeout_sec"] = 0.2
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    path.write_text(yaml.safe_dump(data))
    return path


def on_a_clock_behind(seconds: float) -> list[str]:
    """The interpreter command that runs ``-m MODULE ...`` on a wall clock ``seconds`` late
    (:mod:`tests.harness.wrong_clock`)."""
    return [PY, "-m", "tests.harness.wrong_clock", f"{seconds:g}"]


class Feeder(threading.Thread):
    """Plays the node agents: one ingest batch per node every ``interval`` seconds."""

    def __init__(self, stack: Stack, interval: float = 0.5) -> None:
        super().__init__(daemon=True, name="feeder")
        self.stack = stack
        self.interval = interval
        self.lock = threading.Lock()
        # node → {"participants": {(job, role, rank): {"phase", "step", "frozen_ts"}}, "samples": {(name, labels-json): value}}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.silent: set[str] = set()
        # node → seconds its clock is behind (negative: ahead): every stamp it sends is off.
        self.clock_behind: dict[str, float] = {}
        self.errors: list[str] = []
        self._halt = threading.Event()
        self._seq: dict[str, int] = {}

    def participant(
        self,
        node: str,
        role: str,
        rank: int,
        *,
        job: str = JOB,
        phase: str = "TRAIN",
        step: int = 20,
    ) -> None:
        with self.lock:
            n = self.nodes.setdefault(node, {"participants": {}, "samples": {}})
            n["participants"][(job, role, rank)] = {"phase": phase, "step": step, "frozen_ts": None}

    def freeze_heartbeat(self, node: str, job: str, role: str, rank: int) -> None:
        with self.lock:
            self.nodes[node]["participants"][(job, role, rank)]["frozen_ts"] = time.time() - 0.5

    def thaw_heartbeat(self, node: str, job: str, role: str, rank: int) -> None:
        """The participant reports again (its restart brought it back)."""
        with self.lock:
            self.nodes[node]["participants"][(job, role, rank)]["frozen_ts"] = None

    def rounds(self, node: str) -> int:
        """How many batches were built for ``node`` so far (its ``seq``)."""
        with self.lock:
            return self._seq.get(node, 0)

    def set(self, node: str, name: str, value: float, **labels: str) -> None:
        with self.lock:
            n = self.nodes.setdefault(node, {"participants": {}, "samples": {}})
            n["samples"][(name, json.dumps(labels, sort_keys=True))] = value

    def run(self) -> None:
        client = httpx.Client(base_url=self.stack.base_url, timeout=10)
        while not self._halt.wait(self.interval):
            with self.lock:
                batches = [
                    (node, self._batch(node, n))
                    for node, n in self.nodes.items()
                    if node not in self.silent
                ]
            for node, body in batches:
                try:
                    # The stack's current URL, read per post: a test may point the stack at
                    # another replica (``Stack.point_at``) while the feeder runs.
                    r = client.post(
                        f"{self.stack.base_url}/api/v1/ingest",
                        json=body,
                        headers=self.stack.auth(self.stack.node_tokens[node]),
                    )
                    if r.status_code != 200:
                        self.errors.append(f"{node}: {r.status_code} {r.text[:200]}")
                except httpx.HTTPError as exc:
                    self.errors.append(f"{node}: {exc}")
        client.close()

    def _batch(self, node: str, n: dict[str, Any]) -> dict[str, Any]:
        now = time.time() - self.clock_behind.get(node, 0.0)
        self._seq[node] = self._seq.get(node, 0) + 1
        samples = [
            {"name": name, "value": value, "ts": now, "labels": json.loads(labels)}
            for (name, labels), value in n["samples"].items()
        ]
        parts = [
            {
                "job": job,
                "role": role,
                "rank": rank,
                "phase": p["phase"],
                "step": p["step"],
                "ts": p["frozen_ts"] if p["frozen_ts"] is not None else now,
            }
            for (job, role, rank), p in n["participants"].items()
        ]
        return {
            "agent_id": f"agent-{node}",
            "node": node,
            "seq": self._seq[node],
            "sent_at": now,
            "samples": samples,
            "participants": parts,
            "fingerprint": None,
        }

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


class Stack:
    def __init__(
        self, tmp: Path, *, database_url: str, redis: RedisServer | None, policy: Path
    ) -> None:
        self.tmp = tmp
        self.database_url = database_url
        self.redis = redis
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.run_root = tmp / "runs"
        self.run_root.mkdir()
        self.launcher_log = tmp / "launcher" / "calls.jsonl"
        self.launcher_log.parent.mkdir()
        launcher = tmp / "launcher" / "launch.sh"
        launcher.write_text(f'#!/bin/sh\nexec {PY} {FAKE_LAUNCHER} "$@"\n')
        launcher.chmod(0o755)
        self.env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "RLGUARD_DEV": "1",
            "RLGUARD_DATA_DIR": str(tmp / "data"),
            "RLGUARD_DATABASE_URL": database_url,
            "RLGUARD_RECOVERY_POLICY_FILE": str(policy),
            "RLGUARD_RECOVERY_RUN_ROOT": str(self.run_root),
            "RLGUARD_RECOVERY_LAUNCHER": str(launcher),
            "RLGUARD_RECOVERY_ACTION_LEASE_SECONDS": "10",
            "RLGUARD_RECOVERY_REDISPATCH_AFTER_SECONDS": "3",
            "RLGUARD_RECOVERY_DISPATCH_INTERVAL_SECONDS": "0.5",
            "RLGUARD_RECOVERY_BROKER_TIMEOUT_SECONDS": "1",
            "RLGUARD_TEST_LAUNCHER_LOG": str(self.launcher_log),
        }
        self.env.pop("RLGUARD_REDIS_URL", None)
        if redis is not None:
            self.env["RLGUARD_REDIS_URL"] = redis.url
        migrate.upgrade(database_url)
        self.engine = make_engine(database_url)
        self.node_tokens: dict[str, str] = {}
        with Session(self.engine) as s:
            for node in ("n0", "n1"):
                self.node_tokens[node] = create_node_token(s, node=node, actor="test")[1]
            self.approver = create_user(s, name="alice", role=Role.approver, actor="test")[1]
            self.viewer = create_user(s, name="victor", role=Role.viewer, actor="test")[1]
            s.commit()
        self.server_process = ServerProcess(
            [*RLGUARD, "server", "--host", "127.0.0.1", "--port", str(self.port)],
            self.env,
            self.port,
            tmp / "server.log",
            ready_path="/healthz",
        )
        self.workers: list[subprocess.Popen[bytes]] = []
        self.agents: list[AgentProcess] = []
        self.feeder = Feeder(self)
        self.http = httpx.Client(base_url=self.base_url, timeout=10)

    def point_at(self, url: str) -> None:
        """Send the feeder's batches and the test's API calls to ``url`` from now on (another
        replica on the same database)."""
        self.base_url = url
        self.http.close()
        self.http = httpx.Client(base_url=url, timeout=10)

    @staticmethod
    def auth(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    def run_dir(self, job: str = JOB) -> Path:
        d = self.run_root / job
        d.mkdir(parents=True, exist_ok=True)
        return d

    @property
    def server(self) -> subprocess.Popen[bytes] | None:
        return self.server_process.proc

    def start_server(self) -> None:
        self.server_process.start(timeout=30)

    def start_worker(self, *args: str) -> subprocess.Popen[bytes]:
        proc = start_worker(*args, env=self.env, log=self.tmp / f"worker{len(self.workers)}.log")
        self.workers.append(proc)
        return proc

    def kill_worker(self, proc: subprocess.Popen[bytes]) -> None:
        """kill -9 the worker and every process of its group (pool children, launcher hook)."""
        kill_group(proc)

    def start_agent(
        self,
        node: str,
        run_dir: Path,
        *,
        clock_behind: float | None = None,
        extra: tuple[str, ...] = (),
    ) -> AgentProcess:
        """A real node agent with one simulated GPU, watching ``run_dir`` for this stack;
        ``clock_behind``: on a clock that many seconds late (:func:`on_a_clock_behind`);
        ``extra``: more agent options (``--engine ...``)."""
        token_file = self.tmp / f"token-{node}"
        token_file.write_text(self.node_tokens[node])
        token_file.chmod(0o600)
        agent = AgentProcess(
            "--server",
            self.base_url,
            "--token-file",
            str(token_file),
            "--node",
            node,
            "--run-dir",
            str(run_dir),
            "--simulate-gpus",
            "1",
            "--interval",
            "0.5",
            "--spool-dir",
            str(self.tmp / f"spool-{node}"),
            *extra,
            env=self.env,
            python=[PY] if clock_behind is None else on_a_clock_behind(clock_behind),
            log_path=self.tmp / f"agent-{node}.log",
        )
        self.agents.append(agent.start())
        return agent

    def get(self, path: str, token: str | None = None) -> Any:
        r = self.http.get(path, headers=self.auth(token or self.approver))
        assert r.status_code == 200, (path, r.status_code, r.text)
        return r.json()

    def post(self, path: str, token: str | None = None, **kw: Any) -> httpx.Response:
        return self.http.post(path, headers=self.auth(token or self.approver), **kw)

    def incidents(self, **params: str) -> list[dict[str, Any]]:
        return self.http.get(
            "/api/v1/incidents", params=params, headers=self.auth(self.viewer)
        ).json()["incidents"]

    def incident(self, kind: str, job: str | None = JOB) -> dict[str, Any] | None:
        for inc in self.incidents():
            if inc["kind"] == kind and (job is None or inc["job"] == job):
                return self.get(f"/api/v1/incidents/{inc['id']}", self.viewer)
        return None

    def wait_baselines(self, span: float = 2.0, timeout: float = 30) -> None:
        """Wait until the server holds every series the feeder sends, over ``span`` seconds.

        A counter's first value is only a baseline to the detectors: a rise sent before a
        policy tick (every 0.5 s) has seen the baseline is no rise at all. Sleeping a fixed
        time after starting the feeder does not guarantee that on a loaded machine (the first
        batches can arrive late); what the server holds does.
        """

        def spans() -> dict[tuple[str, str, str], float]:
            out = {}
            for node in list(self.feeder.nodes):
                r = self.http.get(
                    "/api/v1/series",
                    params={"node": node, "since": 0, "limit": 1000},
                    headers=self.auth(self.viewer),
                )
                assert r.status_code == 200, r.text
                for s in r.json()["data"]:
                    if s["points"]:
                        key = (node, s["name"], json.dumps(s["labels"], sort_keys=True))
                        out[key] = s["points"][-1][0] - s["points"][0][0]
            return out

        def held() -> bool:
            with self.feeder.lock:
                wanted = [
                    (node, name, labels)
                    for node, n in self.feeder.nodes.items()
                    for name, labels in n["samples"]
                ]
            have = spans()
            return all(have.get(key, -1.0) >= span for key in wanted)

        self.wait(held, timeout, f"the server to hold every fed series over {span} s")

    def launcher_calls(self) -> list[dict[str, Any]]:
        if not self.launcher_log.exists():
            return []
        return [
            json.loads(line) for line in self.launcher_log.read_text().splitlines() if line.strip()
        ]

    def logs(self) -> str:
        """The tails of every process log and the feeder's last errors (for failure messages)."""
        tails = "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}"
            for p in sorted(self.tmp.glob("*.log"))
        )
        return f"feeder errors {self.feeder.errors[-3:]}\n{tails}"

    def wait(self, pred: Callable[[], Any], timeout: float, what: str) -> Any:
        return wait_for(pred, timeout, what, interval=0.2, context=self.logs)

    def close(self) -> None:
        if self.feeder.is_alive():
            self.feeder.stop()
        for agent in self.agents:
            agent.stop()
        for proc in self.workers:
            kill_group(proc)
        self.server_process.stop()
        self.http.close()
        self.engine.dispose()
