"""The recovery procedure: bring trainer, rollout weights and experience buffer back to one point.

1. :func:`restore` picks the newest checkpoint that verifies (and, given the coordinator's
   committed global version, is not from a round that never committed), loads it, and compares
   every participant's version vector with the checkpoint's: participants ahead roll back,
   participants behind (or concurrent) restore, equal ones keep their state. It lists the
   transient state every participant must clear (KV cache, request queues, data-loader position).
2. :func:`wait_until_weights_live` holds the trainer until every rollout reports the restored
   weight version live, so no rollout generates with older weights while the trainer moves on
   (the "version cliff").
3. :class:`WeightSyncPlanner` makes the first weight sync after recovery a full one; later ones
   may be incremental.
4. :func:`buffer_freshness` applies the buffer rule: samples from a policy newer than the restored
   one were produced by a rolled-back future and are always dropped; if more than 30 % of the
   buffer comes from stale policy versions, those are dropped (or down-weighted by option).

The staleness bound during normal running (the trainer at most 5 steps ahead of the rollout
weights) is :func:`recovery.checkpoint.version.trainer_must_wait`, enforced by the coordinator.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from recovery.checkpoint.engine import (
    DEFAULT_TRANSIENT,
    PERSISTED_LAYERS,
    CheckpointEngine,
    CheckpointInfo,
    SkippedCheckpoint,
)
from recovery.checkpoint.errors import CheckpointInputError, RestoreError
from recovery.checkpoint.version import Ordering, VersionVector
from recovery.errors import RecoveryTimeout

log = logging.getLogger("rlguard.recovery.restore")

Action = Literal["rollback", "restore", "keep"]


@dataclass(frozen=True)
class ParticipantRestore:
    """What one participant must do to reach the checkpoint's version."""

    name: str
    current: VersionVector
    relation: Ordering
    action: Action


@dataclass(frozen=True)
class RestoreResult:
    """A loaded checkpoint and the plan to bring every participant back to it."""

    checkpoint: CheckpointInfo
    state: dict[str, Any]
    participants: tuple[ParticipantRestore, ...]
    transient_to_clear: tuple[str, ...]
    skipped: tuple[SkippedCheckpoint, ...]

    @property
    def target(self) -> VersionVector:
        """The version every participant returns to."""
        return self.checkpoint.version

    def action_for(self, name: str) -> Action:
        """The action planned for participant ``name``."""
        for p in self.participants:
            if p.name == name:
                return p.action
        raise CheckpointInputError(f"no participant named {name!r} in this restore")


def _action(relation: Ordering) -> Action:
    if relation is Ordering.EQUAL:
        return "keep"
    if relation is Ordering.AHEAD:
        return "rollback"
    # BEHIND needs the newer state; CONCURRENT is ahead in one component and behind in the
    # other, so neither its own state nor a partial rollback is consistent: load the checkpoint.
    return "restore"


def restore(
    engine: CheckpointEngine,
    *,
    participants: Mapping[str, VersionVector],
    committed_version: VersionVector | None = None,
    layers: Iterable[str] = PERSISTED_LAYERS,
    extra_transient: Iterable[str] = (),
) -> RestoreResult:
    """Pick and load the latest valid checkpoint and plan every participant's way back to it.

    ``participants`` maps each live participant to the version vector it holds now.
    ``committed_version`` is the coordinator's global version: newer checkpoints come from rounds
    that never committed and are skipped. Raises :class:`RestoreError` when nothing valid exists
    (the message lists every checkpoint skipped and why).
    """
    for name, version in participants.items():
        if not isinstance(version, VersionVector):
            raise CheckpointInputError(f"participant {name!r}: version must be a VersionVector")
    info = engine.latest(not_after=committed_version)
    if info is None:
        reasons = "; ".join(f"{s.name}: {s.reason}" for s in engine.last_skipped) or "none saved"
        raise RestoreError(f"no valid checkpoint under {engine.root} ({reasons})")
    state = engine.load(info, layers=layers)
    plan = []
    for name, current in sorted(participants.items()):
        relation = current.compare(info.version)
        plan.append(ParticipantRestore(name, current, relation, _action(relation)))
    transient = tuple(sorted(set(info.transient) | set(DEFAULT_TRANSIENT) | set(extra_transient)))
    log.warning(
        "restoring %s at %s (skipped %d); plan %s; clear %s",
        info.path.name,
        info.version,
        len(info.skipped),
        {p.name: p.action for p in plan},
        transient,
    )
    return RestoreResult(info, state, tuple(plan), transient, info.skipped)


def rollout_versions(status: Mapping[str, Any]) -> dict[str, VersionVector]:
    """The version vector of every live rollout in a coordinator status (``GET /v1/status``),
    for :func:`wait_until_weights_live`."""
    participants = status.get("participants")
    if not isinstance(participants, Mapping):
        raise CheckpointInputError(f"not a coordinator status: {status!r:.120}")
    return {
        name: VersionVector.from_json(p["version"])
        for name, p in participants.items()
        if p.get("role") == "rollout" and p.get("health") != "failed"
    }


def wait_until_weights_live(
    read_rollout_versions: Callable[[], Mapping[str, VersionVector]],
    weight_version: int,
    *,
    expected: Collection[str],
    timeout: float,
    poll: float = 0.1,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, VersionVector]:
    """Block until every rollout in ``expected`` reports ``weight_version`` live.

    ``read_rollout_versions`` returns what each rollout reports now (for example from the
    coordinator's status). A rollout on a *newer* weight version than the restored one is not
    accepted either: it still serves weights from the rolled-back future. Raises
    :class:`RecoveryTimeout` naming the rollouts still not live.
    """
    if not expected:
        raise CheckpointInputError("expected must name at least one rollout")
    deadline = clock() + timeout
    while True:
        versions = dict(read_rollout_versions())
        pending = sorted(
            n
            for n in expected
            if n not in versions or versions[n].inference_version != weight_version
        )
        if not pending:
            return versions
        if clock() >= deadline:
            seen = {n: versions[n].inference_version if n in versions else None for n in pending}
            raise RecoveryTimeout(
                f"rollouts not serving weight version {weight_version} after {timeout} s: {seen}"
            )
        sleep(poll)


class WeightSyncPlanner:
    """Chooses full or incremental weight syncs: the first after a recovery is always full, so
    the rollouts cannot inherit drift that incremental updates would carry over."""

    def __init__(self) -> None:
        self._force_full = True

    def after_recovery(self) -> None:
        """Make the next sync full."""
        self._force_full = True

    def next_sync(self) -> Literal["full", "incremental"]:
        """The mode of the next sync (consumes the forced full)."""
        if self._force_full:
            self._force_full = False
            return "full"
        return "incremental"


@dataclass(frozen=True)
class FreshnessDecision:
    """What to do with each buffered sample after a restore."""

    weights: tuple[float, ...]
    stale_fraction: float
    stale: int
    from_future: int
    action: Literal["keep", "drop", "downweight"]

    @property
    def kept(self) -> list[int]:
        """Indices of samples that stay in the buffer (weight > 0)."""
        return [i for i, w in enumerate(self.weights) if w > 0]


def buffer_freshness(
    sample_versions: Sequence[int],
    *,
    current_version: int,
    max_lag: int = 0,
    threshold: float = 0.3,
    mode: Literal["drop", "downweight"] = "drop",
    stale_weight: float = 0.1,
) -> FreshnessDecision:
    """Apply the buffer freshness rule to samples tagged with their policy (weight) version.

    A sample is *stale* when its version is older than ``current_version - max_lag``, and *from
    the future* when newer than ``current_version`` (produced by weights the restore rolled
    back): those always get weight 0. If the stale share exceeds ``threshold``, stale samples get
    weight 0 (``drop``) or ``stale_weight`` (``downweight``); otherwise they are kept as they are.
    """
    if not 0 <= threshold <= 1:
        raise CheckpointInputError(f"threshold must be within [0, 1], got {threshold!r}")
    if mode not in ("drop", "downweight"):
        raise CheckpointInputError(f"mode must be 'drop' or 'downweight', got {mode!r}")
    if not 0 < stale_weight < 1:
        raise CheckpointInputError(f"stale_weight must be within (0, 1), got {stale_weight!r}")
    if max_lag < 0:
        raise CheckpointInputError(f"max_lag must be >= 0, got {max_lag!r}")
    for v in sample_versions:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise CheckpointInputError(f"sample versions must be non-negative ints, got {v!r}")
    n = len(sample_versions)
    future = [v > current_version for v in sample_versions]
    stale = [v < current_version - max_lag for v in sample_versions]
    stale_fraction = sum(stale) / n if n else 0.0
    action: Literal["keep", "drop", "downweight"] = "keep"
    if stale_fraction > threshold:
        action = mode
    stale_value = {"keep": 1.0, "drop": 0.0, "downweight": stale_weight}[action]
    weights = tuple(
        0.0 if f else (stale_value if s else 1.0) for f, s in zip(future, stale, strict=True)
    )
    return FreshnessDecision(weights, stale_fraction, sum(stale), sum(future), action)
