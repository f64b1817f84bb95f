"""Several ranks, one consistent step: the checkpoint coordinator's rounds over memory snapshots.

With ``rlguard launch --nproc N`` (N > 1) every rank snapshots its own state each step
(:mod:`integrations.trl.snapshots`), and a step is *committed* only when a two-phase round of
:class:`recovery.checkpoint.coordinator.Coordinator` has seen every rank hold it: after its
snapshot of step S a rank (participant ``trainer-<rank>``) reports ``(S, S)``; *prepare* waits
for every expected rank ready at that step, *commit* has each rank check its own snapshot of S,
and the coordinator publishes the new global version through its lease, a JSON file in the run
directory (``snapshot-rounds.json``), before anyone resumes. A rank killed before it answered
done leaves S uncommitted.

On a restart every rank resumes from :func:`consistent_step`: the committed step when every rank
still holds a verified snapshot of it, else the newest older step every rank holds; never a step
some rank lacks, never one no round committed. This module imports no torch.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from recovery.checkpoint import atomic
from recovery.checkpoint.coordinator import Coordinator
from recovery.checkpoint.errors import CheckpointCorrupt
from recovery.checkpoint.layout import MARKER, list_dirs
from recovery.checkpoint.lease import LeaseGrant
from recovery.fsio import write_json_atomic

log = logging.getLogger("rlguard.launch.snapshot_rounds")

ENV_SNAPSHOT_COORDINATOR = "RLGUARD_SNAPSHOT_COORDINATOR"
STATE_FILE = "snapshot-rounds.json"
# A round waits this long for a rank to reach its safe point; an aborted round is retried after
# it. Short: the ranks of one node step together, and a dead rank is refused at once anyway.
ROUND_TIMEOUT_S = 5.0


def participant_name(rank: int) -> str:
    """The coordinator's name for rank ``rank``."""
    return f"trainer-{rank}"


def verified_steps(root: Path) -> set[int]:
    """The training steps of every snapshot under ``root`` whose marker and file checksums
    verify; each one passed over is logged with the reason."""
    try:
        candidates = list_dirs(root)
    except FileNotFoundError:
        return set()
    steps = set()
    for _seq, path in candidates:
        try:
            body = atomic.verify_committed_dir(path, MARKER)
            steps.add(int(body["metadata"]["version"]["training_step"]))
        except (CheckpointCorrupt, KeyError, TypeError, ValueError, OSError) as exc:
            log.warning("not resuming from snapshot %s: %s", path, exc)
    return steps


def consistent_step(
    committed: int | None, held: Mapping[int, Collection[int]], ranks: Collection[int]
) -> int | None:
    """The step every rank of ``ranks`` resumes from (the commit rule).

    ``committed``: the step of the last round that committed (None: none did); ``held``: the
    steps each rank holds a verified snapshot of. The answer is the newest step at or below
    ``committed`` that *every* rank holds, so a step one rank lacks, or that no round
    committed, is never resumed from; None when there is no such step.
    """
    if committed is None or not ranks:
        return None
    common: set[int] | None = None
    for rank in ranks:
        steps = {s for s in held.get(rank, ()) if s <= committed}
        common = steps if common is None else common & steps
    return max(common or (), default=None)


class _StateFileLease:
    """The :class:`recovery.checkpoint.lease.Lease` protocol for the one coordinator of a
    launch: the launcher is its only candidate, so leadership is its own; what it publishes
    (the committed global version) is written to a file, synced, before the round ends."""

    name = "snapshot-rounds"
    ttl = 3600.0

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._holder: str | None = None
        self._epoch = 0

    def try_acquire(self, holder: str) -> LeaseGrant | None:
        with self._lock:
            if self._holder not in (None, holder):
                return None
            if self._holder is None:
                self._epoch += 1
            self._holder = holder
            return LeaseGrant(holder, self._epoch)

    def renew(self, holder: str) -> bool:
        with self._lock:
            return self._holder == holder

    def release(self, holder: str) -> None:
        with self._lock:
            if self._holder == holder:
                self._holder = None

    def current_holder(self) -> str | None:
        with self._lock:
            return self._holder

    def publish(self, holder: str, state: dict[str, Any]) -> bool:
        with self._lock:
            if self._holder != holder:
                return False
            write_json_atomic(self.path, state)
            return True

    def read_state(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return data if isinstance(data, dict) else None

    def close(self) -> None:
        """Nothing to close."""


class SnapshotRounds:
    """The launcher's checkpoint coordinator over its ranks' memory snapshots."""

    def __init__(self, run_dir: Path, ranks: list[int], *, round_timeout: float = ROUND_TIMEOUT_S):
        self.ranks = list(ranks)
        self.state_file = run_dir / STATE_FILE
        self.lease = _StateFileLease(self.state_file)
        self.coordinator = Coordinator(
            coordinator_id="rlguard-launch",
            lease=self.lease,
            expected=[participant_name(r) for r in self.ranks],
            checkpoint_interval_steps=1,
            round_timeout=round_timeout,
            request_timeout=1.0,
            suspect_after=5.0,
            confirm_after=10.0,
            # No rollout participants: nothing to wait for at a weight-sync boundary.
            require_sync_boundary=False,
            tick=0.02,
        )

    @property
    def url(self) -> str:
        return self.coordinator.url

    def start(self, timeout: float = 5.0) -> None:
        """Serve the protocol and take the (local) leadership before any rank starts. A fresh
        launch starts from step 0 (it resumes nothing): an earlier launch's committed step in
        the same run directory would hold the rounds back until the ranks passed it."""
        self.state_file.unlink(missing_ok=True)
        self.coordinator.start()
        deadline = time.monotonic() + timeout
        while not self.coordinator.is_leader and time.monotonic() < deadline:
            time.sleep(0.01)

    def env(self) -> dict[str, str]:
        return {ENV_SNAPSHOT_COORDINATOR: self.url}

    def committed_step(self) -> int | None:
        """The step of the last committed round (the published global version)."""
        state = self.lease.read_state() or {}
        version = state.get("global_version")
        if not isinstance(version, dict):
            return None
        step = version.get("training_step")
        return step if isinstance(step, int) and not isinstance(step, bool) else None

    def resume_step(self, roots: Collection[Path]) -> int | None:
        """:func:`consistent_step` over what ``roots`` (memory segment, disk) hold per rank."""
        from integrations.snapshot_owner import rank_dir

        held = {r: set().union(*(verified_steps(rank_dir(root, r)) for root in roots))
                for r in self.ranks}  # fmt: skip
        committed = self.committed_step()
        step = consistent_step(committed, held, self.ranks)
        log.warning(
            "ranks resume from step %s (committed: %s; verified per rank: %s)",
            step,
            committed,
            {r: sorted(s)[-4:] for r, s in held.items()},
        )
        return step

    def adopt(self, step: int) -> None:
        """Make ``step`` (what the ranks are restarted from) the committed one, so the next
        round comes one step after it."""
        from recovery.checkpoint.version import VersionVector

        self.coordinator.adopt_global_version(VersionVector(step, step))

    def close(self) -> None:
        self.coordinator.close()
