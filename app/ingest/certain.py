"""Certain faults seen at ingest: the seam that lets the policy act on them without a tick.

Most faults need a window (a breach held for a while, a heartbeat silent for seconds) and are
judged by the policy tick. A few need none, because something outside RLGuard has already
decided: the launcher saw the process exit (phase ``EXITED``), Ray declared the actor dead
(``RAY_DEAD`` / ``RAY_RESTARTING``), the GPU fell off the bus (``gpu_lost`` at 1). Waiting up to
a tick interval for those is pure delay.

Ingest must not know the policy engine (``lint-imports``: ``app.ingest`` sits below
``app.policy``), so this module only recognises the facts it is told to watch and calls back
whoever registered the watch (the policy scheduler, ``app.scheduler.policy_lifespan``) once the
batch that carried one is durable, i.e. after the group commit that acknowledges it. The
callback must not block: the scheduler's sets an event and its own thread runs the tick early.

Only transitions count (a phase changed into an exited one, a ``gpu_lost`` series rose to 1): a
lost GPU reports 1 in every batch, and re-running the tick on each would turn the event path
into a second, faster tick for as long as the fault lasts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

from app.ingest.phases import PhaseChange
from app.series.backend import Sample
from app.series.store import SeriesKey

log = logging.getLogger("rlguard.ingest")


class CertainFaultWatch:
    """Recognises certain faults in accepted batches; tells ``notify`` once they are durable.

    ``exited_phases``: participant phases that mean the process is gone (the policy's
    ``detection.heartbeat.exited_phases``). ``fault_gauges``: 0/1 gauges whose rise to 1 is a
    fault by itself (``gpu_lost``). ``seen_in`` runs on ingest's event loop only (no lock);
    ``durable`` also on the shared window's follower thread (another replica's fault).
    """

    __slots__ = ("_exited", "_gauges", "_notify", "_raised")

    def __init__(
        self,
        *,
        exited_phases: Iterable[str],
        fault_gauges: Iterable[str],
        notify: Callable[[], None],
    ) -> None:
        self._exited = frozenset(exited_phases)
        self._gauges = frozenset(fault_gauges)
        self._notify = notify
        self._raised: set[SeriesKey] = set()  # gauge series last seen at >= 1

    def seen_in(self, phases: Sequence[PhaseChange], samples: Sequence[Sample]) -> bool:
        """True when this batch carries a certain fault (a new exit, a gauge that rose)."""
        exited = any(c.phase in self._exited for c in phases)
        return self._rose(samples) or exited  # _rose first: it must see every batch's gauges

    def _rose(self, samples: Sequence[Sample]) -> bool:
        gauges, raised = self._gauges, self._raised
        rose = False
        for key, _, value in samples:
            if key.name not in gauges:
                continue
            if value >= 1:
                if key not in raised:
                    raised.add(key)
                    rose = True
            else:
                raised.discard(key)
        return rose

    def durable(self) -> None:
        """A batch that carried a certain fault is committed: tell the listener (never raises:
        a listener's failure must not fail ingest; the next tick still sees the fault)."""
        try:
            self._notify()
        except Exception:
            log.exception("certain-fault listener failed; the next policy tick acts instead")
