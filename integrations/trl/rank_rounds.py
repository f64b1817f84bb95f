"""A rank's side of :mod:`integrations.snapshot_rounds`: one step committed only when every rank
holds its snapshot.

After its snapshot of step S, a rank (``trainer-<rank>``, a
:class:`recovery.checkpoint.participant.Participant`) reports ``(S, S)`` to the launcher's
coordinator and waits at this safe point for the round of S: it answers *ready* with S, and on
*commit* confirms that its own snapshot of S is there (a memory snapshot once its save
returned, a disk one once the checkpoint engine wrote it). The training loop goes on when the
round has finished, committed or aborted; a round that does not come within ``wait`` (the
coordinator is gone, or waits out an aborted round) leaves S uncommitted and costs no more than
``wait``. This module imports no torch.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from integrations.snapshot_rounds import ENV_SNAPSHOT_COORDINATOR, ROUND_TIMEOUT_S, participant_name
from recovery.checkpoint.participant import Participant, RoundResult
from recovery.checkpoint.version import VersionVector

log = logging.getLogger("rlguard.integrations.trl.rank_rounds")


class RankRounds:
    """This rank's participant in the launcher's snapshot rounds."""

    def __init__(
        self,
        rank: int,
        coordinator_url: str,
        *,
        step: int,
        holds: Callable[[int], bool],
        wait: float = ROUND_TIMEOUT_S + 1.0,
    ) -> None:
        self.rank = rank
        self.wait = wait
        self._holds = holds
        self.committed: int | None = None
        self.participant = Participant(
            participant_name(rank),
            "trainer",
            [coordinator_url],
            version=VersionVector(step, step),
            on_commit=self._on_commit,
            heartbeat_interval=0.5,
            request_timeout=2.0,
        )
        self.participant.start()

    def _on_commit(self, round_id: int, target: VersionVector) -> dict[str, Any]:
        step = target.training_step
        if not self._holds(step):
            raise RuntimeError(f"rank {self.rank} holds no snapshot of step {step}")
        return {"rank": self.rank, "step": step}

    def commit(self, step: int) -> RoundResult | None:
        """Report the snapshot of ``step`` and take part in its round (blocks until it ends, at
        most about ``wait`` + the round); None when no round came within ``wait``."""
        self.participant.set_version(VersionVector(step, step))
        self.participant.heartbeat_now()  # the coordinator starts the round from what it sees
        deadline = time.monotonic() + self.wait
        while not self.participant.prepare_pending:
            if time.monotonic() >= deadline:
                log.warning("no round for the snapshot of step %d within %.1f s", step, self.wait)
                return None
            time.sleep(0.005)
        result = self.participant.safe_point(self.wait)
        if result is not None and result.committed and result.global_version is not None:
            self.committed = result.global_version.training_step
        elif result is not None:
            log.warning("the round of step %d did not commit: %s", step, result.reason)
        return result

    def close(self) -> None:
        self.participant.close()


def rank_rounds(
    rank: int, world_size: int, step: int, holds: Callable[[int], bool]
) -> RankRounds | None:
    """This rank's participant when the launcher runs snapshot rounds (``rlguard launch --nproc
    N``, N > 1, sets ``RLGUARD_SNAPSHOT_COORDINATOR``); None for a single process."""
    url = os.environ.get(ENV_SNAPSHOT_COORDINATOR)
    if world_size <= 1 or not url:
        return None
    return RankRounds(rank, url, step=step, holds=holds)
