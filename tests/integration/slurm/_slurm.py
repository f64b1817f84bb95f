"""A real one-node Slurm cluster (munged, slurmctld, slurmd) for the Slurm backend's tests."""

from __future__ import annotations

import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from recovery.supervision.backends.slurm import parse_record
from tests.harness import spawn, wait_for

NODE = "rlgnode"


_DAEMONS = ("munged", "slurmctld", "slurmd", "scontrol", "sbatch")


@dataclass
class Slurm:
    """The running cluster: its config file and the environment its commands need."""

    root: Path
    conf: Path
    env: dict[str, str]
    procs: list[subprocess.Popen[bytes]]

    def scontrol(self, *args: str) -> str:
        out = subprocess.run(
            ["scontrol", *args], env=self.env, capture_output=True, text=True, timeout=30
        )
        assert out.returncode == 0, f"scontrol {' '.join(args)}: {out.stderr.strip()}"
        return out.stdout

    def node(self) -> dict[str, str]:
        return parse_record(self.scontrol("show", "node", "-o", NODE))

    def job(self, job_id: str) -> dict[str, str]:
        return parse_record(self.scontrol("show", "job", "-o", job_id))

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
            for p in sorted(self.root.glob("*.log"))
        )


def _conf(root: Path, ctld_port: int, slurmd_port: int) -> str:
    host = socket.gethostname()
    return f"""\
ClusterName=rlguardtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
AuthInfo=socket={root}/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
KillWait=10
NodeName={NODE} NodeHostname={host} NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _start(argv: list[str], root: Path, name: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    log = open(root / f"{name}.out", "ab")  # noqa: SIM115 - owned by the process
    proc = spawn(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    return proc


def _answers(env: dict[str, str]) -> bool:
    out = subprocess.run(["scontrol", "ping"], env=env, capture_output=True, text=True, timeout=10)
    return "UP" in out.stdout


def _wait(predicate: object, timeout: float, what: str, cluster: Slurm) -> None:
    assert callable(predicate)

    def holds() -> bool:
        for proc in cluster.procs:
            if proc.poll() is not None:
                pytest.fail(f"{proc.args[0]} exited with {proc.returncode}:\n{cluster.logs()}")
        try:
            return bool(predicate())
        except AssertionError:
            return False  # a test's condition that does not hold yet

    wait_for(holds, timeout, what, interval=0.2, context=cluster.logs)


def wait_until(predicate: object, timeout: float, what: str, cluster: Slurm) -> None:
    """Wait for ``predicate()`` (a test's condition), failing with the daemons' logs."""
    _wait(predicate, timeout, what, cluster)
