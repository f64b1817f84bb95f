"""What Slurm thinks of this node (``--slurm-node NAME``): a DOWN or DRAIN node is a lost node.

Every ``every_s`` seconds the agent asks ``scontrol show node -o NAME`` and ``squeue -h -w NAME
-t RUNNING -o %i`` (each with a timeout) and sends, in between repeating the last answer:

- ``slurm_node_unavailable`` 1 while the node's state takes no new work (DOWN, DRAIN, DRAINED,
  DRAINING, FAIL, or not responding: ``recovery.supervision.backends.slurm.node_is_lost``),
  else 0. The policy engine's ``node_unavailable`` detector reads it;
- ``slurm_jobs_running``: jobs Slurm runs on the node.

When Slurm does not answer, that is logged once and nothing is sent until it answers again
(an unknown state is not a lost node).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
from collections.abc import Callable

from recovery.protocol.samples import Sample, make_sample
from recovery.supervision.backends.slurm import node_is_lost, parse_record

log = logging.getLogger("rlguard.agent.slurm")


class SlurmNodeError(Exception):
    """A Slurm command failed; the message is one line for the log."""


class SlurmNodeCollector:
    """The scheduler's view of one node, asked every ``every_s`` seconds."""

    def __init__(
        self,
        node: str,
        *,
        every_s: float = 10.0,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self._every = every_s
        self._timeout = timeout
        self._clock = clock
        self._asked_at = float("-inf")
        self._last: tuple[str, int] | None = None  # (state, running jobs)
        self._failing: str | None = None

    def collect(self) -> list[Sample]:
        """This round's samples (the last answer repeated between two questions)."""
        now = self._clock()
        if now - self._asked_at >= self._every:
            self._asked_at = now
            try:
                self._last = self._ask()
            except SlurmNodeError as exc:
                if self._failing is None:
                    log.warning("Slurm does not answer about node %s: %s", self.node, exc)
                self._failing = str(exc)
                self._last = None
            else:
                if self._failing is not None:
                    log.warning("Slurm answers about node %s again", self.node)
                self._failing = None
        if self._last is None:
            return []
        state, running = self._last
        return [
            make_sample("slurm_node_unavailable", 1 if node_is_lost(state) else 0, now, {}),
            make_sample("slurm_jobs_running", running, now, {}),
        ]

    def _ask(self) -> tuple[str, int]:
        record = parse_record(self._run("scontrol", "show", "node", "-o", self.node))
        state = record.get("State")
        if not state:
            raise SlurmNodeError(f"no State for node {self.node!r}")
        jobs = self._run("squeue", "-h", "-w", self.node, "-t", "RUNNING", "-o", "%i")
        return state, len([line for line in jobs.splitlines() if line.strip()])

    def _run(self, command: str, *args: str) -> str:
        path = shutil.which(command)
        if path is None:
            raise SlurmNodeError(f"{command} not found")
        try:
            out = subprocess.run(
                [path, *args], capture_output=True, text=True, timeout=self._timeout, check=False
            )
        except subprocess.TimeoutExpired:
            raise SlurmNodeError(f"{command} gave no answer within {self._timeout} s") from None
        except OSError as exc:
            raise SlurmNodeError(f"{command}: {exc}") from None
        if out.returncode != 0:
            raise SlurmNodeError(
                f"{command} failed ({out.returncode}): {(out.stderr or out.stdout).strip()[:200]}"
            )
        return out.stdout
