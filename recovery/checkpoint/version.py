"""Version vectors and the step ↔ weight-version table.

A single counter cannot say which training step the rollout weights came from when weights are
pushed every few steps, so the global version is a vector ``(training_step, inference_version)``.
The experience buffer has no counter of its own: its version is the training step whose policy
produced it. The :class:`WeightVersionTable` records every push explicitly, so recovery looks the
mapping up instead of computing it (computing it is what breaks when the push interval changes).
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from recovery.checkpoint.errors import CheckpointInputError


class Ordering(enum.Enum):
    """How one version vector relates to another."""

    EQUAL = "equal"
    AHEAD = "ahead"
    BEHIND = "behind"
    CONCURRENT = "concurrent"


def _check_counter(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CheckpointInputError(f"{name} must be a non-negative int, got {value!r}")
    return value


@dataclass(frozen=True, order=False)
class VersionVector:
    """``(training_step, inference_version)``: the state one participant (or checkpoint) holds."""

    training_step: int
    inference_version: int

    def __post_init__(self) -> None:
        _check_counter("training_step", self.training_step)
        _check_counter("inference_version", self.inference_version)

    @property
    def buffer_version(self) -> int:
        """The experience buffer's version: the training step whose policy produced it."""
        return self.training_step

    def compare(self, other: VersionVector) -> Ordering:
        """Componentwise order: AHEAD if no component is smaller and one is larger, etc."""
        le = (
            self.training_step <= other.training_step
            and self.inference_version <= other.inference_version
        )
        ge = (
            self.training_step >= other.training_step
            and self.inference_version >= other.inference_version
        )
        if le and ge:
            return Ordering.EQUAL
        if ge:
            return Ordering.AHEAD
        if le:
            return Ordering.BEHIND
        return Ordering.CONCURRENT

    def is_ahead_of(self, other: VersionVector) -> bool:
        """True when this vector strictly dominates ``other``."""
        return self.compare(other) is Ordering.AHEAD

    def is_behind(self, other: VersionVector) -> bool:
        """True when ``other`` strictly dominates this vector."""
        return self.compare(other) is Ordering.BEHIND

    def as_json(self) -> dict[str, int]:
        """JSON form, as stored in markers and sent on the wire."""
        return {"training_step": self.training_step, "inference_version": self.inference_version}

    @classmethod
    def from_json(cls, data: object) -> VersionVector:
        """Parse :meth:`as_json` output; raises :class:`CheckpointInputError` on bad input."""
        if not isinstance(data, Mapping) or set(data) != {"training_step", "inference_version"}:
            raise CheckpointInputError(f"not a version vector: {data!r}")
        return cls(data["training_step"], data["inference_version"])


@dataclass(frozen=True)
class WeightPush:
    """One weight push: the trainer's step and the weight version it became."""

    training_step: int
    weight_version: int


class WeightVersionTable:
    """The persisted table of weight pushes (training step → weight version pushed).

    Both columns strictly increase, so lookups are binary searches either way.
    """

    def __init__(self, pushes: Iterable[WeightPush] = ()) -> None:
        self._steps: list[int] = []
        self._versions: list[int] = []
        for push in pushes:
            self.record(push.training_step, push.weight_version)

    def record(self, training_step: int, weight_version: int) -> None:
        """Append a push; both numbers must be larger than the previous push's."""
        _check_counter("training_step", training_step)
        _check_counter("weight_version", weight_version)
        if self._steps and (
            training_step <= self._steps[-1] or weight_version <= self._versions[-1]
        ):
            raise CheckpointInputError(
                f"push (step {training_step}, version {weight_version}) does not follow the last "
                f"push (step {self._steps[-1]}, version {self._versions[-1]})"
            )
        self._steps.append(training_step)
        self._versions.append(weight_version)

    def step_for_version(self, weight_version: int) -> int | None:
        """The training step whose weights became ``weight_version``, or None if never pushed."""
        i = bisect.bisect_left(self._versions, weight_version)
        if i < len(self._versions) and self._versions[i] == weight_version:
            return self._steps[i]
        return None

    def version_at_step(self, training_step: int) -> int | None:
        """The newest weight version pushed at or before ``training_step`` (None: none yet)."""
        i = bisect.bisect_right(self._steps, training_step)
        return self._versions[i - 1] if i else None

    def truncate_after(self, training_step: int) -> WeightVersionTable:
        """A copy without pushes made after ``training_step`` (what a rollback must forget)."""
        keep = bisect.bisect_right(self._steps, training_step)
        return WeightVersionTable(
            WeightPush(s, v) for s, v in zip(self._steps[:keep], self._versions[:keep], strict=True)
        )

    @property
    def pushes(self) -> list[WeightPush]:
        """Every push, oldest first."""
        return [WeightPush(s, v) for s, v in zip(self._steps, self._versions, strict=True)]

    def __len__(self) -> int:
        return len(self._steps)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WeightVersionTable):
            return NotImplemented
        return self._steps == other._steps and self._versions == other._versions

    __hash__ = None  # type: ignore[assignment]  # mutable

    def as_json(self) -> list[list[int]]:
        """``[[step, version], ...]``, as stored in the checkpoint marker."""
        return [[s, v] for s, v in zip(self._steps, self._versions, strict=True)]

    @classmethod
    def from_json(cls, data: Any) -> WeightVersionTable:
        """Parse :meth:`as_json` output; raises :class:`CheckpointInputError` on bad input."""
        if not isinstance(data, list):
            raise CheckpointInputError(f"weight version table must be a list, got {data!r}")
        table = cls()
        for row in data:
            if not isinstance(row, list) or len(row) != 2:
                raise CheckpointInputError(
                    f"weight version table row must be [step, version]: {row!r}"
                )
            table.record(row[0], row[1])
        return table


def staleness(trainer_step: int, rollout_steps: Iterable[int]) -> int:
    """How many steps the trainer is ahead of the oldest weights a rollout is using."""
    steps = list(rollout_steps)
    if not steps:
        return 0
    return max(0, trainer_step - min(steps))


def trainer_must_wait(trainer_step: int, rollout_steps: Iterable[int], *, bound: int = 5) -> bool:
    """The staleness rule: the trainer may be at most ``bound`` steps ahead of rollout weights."""
    _check_counter("bound", bound)
    return staleness(trainer_step, rollout_steps) > bound
