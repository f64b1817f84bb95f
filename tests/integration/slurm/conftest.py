"""A real Slurm on this machine for the Slurm backend's tests: munged, one slurmctld and one
slurmd (CPU only, node ``rlgnode``), with a minimal slurm.conf, state and logs in a temporary
directory and ports of their own. Installed by ``scripts/system-deps.sh``; run as root. If a
daemon is missing or the node does not come up, the tests fail (never skip). Under
pytest-xdist each worker that runs a Slurm test file starts a cluster of its own: nothing but
the binaries is shared.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator

import pytest

from tests.harness import free_port
from tests.integration.slurm._slurm import (
    _DAEMONS,
    NODE,
    Slurm,
    _answers,
    _conf,
    _start,
    _wait,
)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    missing = [d for d in _DAEMONS if shutil.which(d) is None]
    if missing:
        pytest.fail(f"Slurm is not installed ({', '.join(missing)}): run scripts/system-deps.sh")
    if os.geteuid() != 0:
        pytest.fail("the Slurm fixture runs slurmd as root (CI runs as root)")
    root = tmp_path_factory.mktemp("slurm")
    (root / "state").mkdir()
    (root / "spool").mkdir()
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    conf = root / "slurm.conf"
    conf.write_text(_conf(root, free_port(), free_port()))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    for name in ("SLURM_JOB_ID", "SLURMD_NODENAME"):  # never act on a job around the tests
        env.pop(name, None)
    procs = [
        _start(
            [
                "munged",
                "-F",
                "-f",
                f"--key-file={key}",
                f"--socket={root}/munge.socket",
                f"--pid-file={root}/munged.pid",
                f"--log-file={root}/munged.log",
                f"--seed-file={root}/munged.seed",
            ],
            root,
            "munged",
            env,
        )
    ]
    cluster = Slurm(root, conf, env, procs)
    try:
        _wait(lambda: (root / "munge.socket").exists(), 20, "munged's socket", cluster)
        procs.append(_start(["slurmctld", "-D", "-i", "-f", str(conf)], root, "slurmctld", env))
        _wait(lambda: _answers(env), 30, "slurmctld to answer", cluster)
        procs.append(_start(["slurmd", "-D", "-N", NODE, "-f", str(conf)], root, "slurmd", env))
        _wait(lambda: cluster.node().get("State") == "IDLE", 30, f"node {NODE} IDLE", cluster)
        yield cluster
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
