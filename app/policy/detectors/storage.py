"""Storage: writes that fail.

The job's own state-log appends or checkpoint saves that fail mean its storage is not writable
(``storage_unwritable``, heavy: the job cannot go on safely). Every-step snapshots that could
not be persisted (``snapshot_persist_errors_total``: the persist directory full or unwritable,
a memory segment that refused them) are ``checkpoint_write_errors``: training goes on with the
snapshots it still has, so the incident says how many failed, where and why, and acts on
nothing.
"""

from __future__ import annotations

from app.policy.detectors.base import Detector, subject_of
from app.policy.detectors.counters import CounterWatch, NodeMemory, counter_signal
from app.policy.policy_file import Policy
from app.policy.signals import Evidence, FaultKind, FaultSignal
from app.policy.world import CHANGED, World
from app.series.store import SeriesKey
from recovery.protocol import metric_names as m


class StorageDetector(Detector):
    """A rise of the state-log or checkpoint write-error counters: ``storage_unwritable``."""

    metrics = (m.STATE_LOG_WRITE_ERRORS_TOTAL, m.CHECKPOINT_WRITE_ERRORS_TOTAL)
    filters = {m.STATE_LOG_WRITE_ERRORS_TOTAL: CHANGED, m.CHECKPOINT_WRITE_ERRORS_TOTAL: CHANGED}

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self._counters = CounterWatch()
        self._nodes = NodeMemory()

    def detect(self, world: World) -> list[FaultSignal]:
        window = self.policy.detection.storage.error_window_seconds
        out = [
            counter_signal(self, world, FaultKind.STORAGE_UNWRITABLE, key, ep, window)
            for name in self.metrics
            for key, ep in self._counters.episodes_of(world, name, self._nodes, window)
        ]
        self._nodes.commit(world)
        return out


class SnapshotPersistDetector(Detector):
    """A rise of ``snapshot_persist_errors_total``: ``checkpoint_write_errors`` about the
    participant, with the last error's directory and text (``snapshot_persist_last_error``).

    A counter a restarted process carried over is a baseline, not a new error (CounterWatch).
    """

    metrics = (m.SNAPSHOT_PERSIST_ERRORS_TOTAL,)
    filters = {m.SNAPSHOT_PERSIST_ERRORS_TOTAL: CHANGED}
    lookups = (m.SNAPSHOT_PERSIST_LAST_ERROR,)

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self._counters = CounterWatch()
        self._nodes = NodeMemory()
        self._totals: dict[tuple[str | None, ...], float] = {}

    def detect(self, world: World) -> list[FaultSignal]:
        window = self.policy.detection.storage.error_window_seconds
        name = m.SNAPSHOT_PERSIST_ERRORS_TOTAL
        for key, point in world.series(name):
            self._totals[_who(key)] = point.value
        out = []
        for key, ep in self._counters.episodes_of(world, name, self._nodes, window):
            ident = _who(key)
            directory, error = self._last_error(world, ident)
            total = self._totals.get(ident, ep.increase)
            evidence = Evidence(
                metric=name,
                values=((ep.first_ts, ep.increase),),
                window_seconds=window,
                threshold=0.0,
                detail=(
                    f"{ep.increase:g} snapshot persist(s) failed ({total:g} in all) in "
                    f"{directory or 'an unreported directory'}; last error: "
                    f"{error or 'not reported'}; training goes on with the snapshots it has"
                ),
            )
            out.append(
                self.signal(
                    world,
                    FaultKind.CHECKPOINT_WRITE_ERRORS,
                    subject_of(key),
                    evidence,
                    since=ep.first_ts,
                    failed_persists=total,
                    directory=directory,
                    last_error=error,
                )
            )
        self._nodes.commit(world)
        return out

    @staticmethod
    def _last_error(world: World, ident: tuple[str | None, ...]) -> tuple[str | None, str | None]:
        """The (dir, error) labels of the participant's newest last-error sample."""
        best: tuple[float, str | None, str | None] | None = None
        for key, point in world.all_series(m.SNAPSHOT_PERSIST_LAST_ERROR):
            if _who(key) == ident and (best is None or point.ts > best[0]):
                best = (point.ts, key.label("dir"), key.label("error"))
        return (None, None) if best is None else best[1:]


def _who(key: SeriesKey) -> tuple[str | None, ...]:
    return (key.node, key.label(m.LABEL_JOB), key.label(m.LABEL_ROLE), key.label(m.LABEL_RANK))
