"""verl's own metrics, without touching verl: its file logger's JSON lines as job signals.

With ``trainer.logger`` including ``file``, verl's ``FileLogger`` (``verl/utils/tracking.py``)
appends one line per step to ``$VERL_FILE_LOGGER_PATH``: ``{"step": N, "data": {key: value}}``
(orjson, opened with ``wb``: a restarted trainer starts the file again). The keys read here are
verl's, from ``verl/trainer/ppo/metric_utils.py`` (``perf/*``, ``timing_s/*``,
``response_length/*``) and ``verl/experimental/fully_async_policy/detach_utils.py``
(``fully_async/partial/*``, ``fully_async/count/*``), at verl commit
b178a3cd56f58b2d502255daba591e92833930a7.

:class:`VerlLogTail` follows the file (a truncated or replaced file is read from its start), and
keeps the newest value of each signal; a line that is not verl's shape is skipped and logged
once.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from recovery.tail import AppendedLines

log = logging.getLogger("rlguard.agent.verl")

# verl key -> the signal name the agent sends (docs/metrics.md).
VERL_KEYS: dict[str, str] = {
    "perf/throughput": "train_throughput_tokens_per_second",
    "perf/time_per_step": "train_step_seconds",
    "timing_s/gen": "train_phase_generate_seconds",
    "timing_s/update_actor": "train_phase_update_seconds",
    "response_length/mean": "rollout_response_length_mean",
    # fully-async runs: the share of the batch's samples generated across a weight update
    # (partial rollouts) is the pending ratio; stale and dropped counts as counters
    "fully_async/partial/partial_ratio": "rollout_pending_ratio",
    "fully_async/count/stale_samples_processed": "rollout_stale_samples_total",
    "fully_async/count/dropped_stale_samples": "rollout_dropped_stale_samples_total",
}
GENERATE_FRACTION = "train_phase_generate_ratio"
_MAX_READ = 4 << 20  # per round, so a long backlog cannot stall the agent


class VerlLineInvalid(ValueError):
    """A line that is not one of verl's file logger records."""


def parse_line(line: bytes | str) -> tuple[int, dict[str, float]]:
    """``(step, signals)`` from one file logger line; :class:`VerlLineInvalid` says why not."""
    try:
        doc = json.loads(line)
    except ValueError as exc:
        raise VerlLineInvalid(f"not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), Mapping):
        raise VerlLineInvalid("not {'step': N, 'data': {...}}")
    step = doc.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise VerlLineInvalid(f"step must be a whole number >= 0, got {step!r}")
    data: Mapping[str, Any] = doc["data"]
    out: dict[str, float] = {"train_step": float(step)}
    for key, name in VERL_KEYS.items():
        value = data.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            out[name] = float(value)
    gen, update = out.get("train_phase_generate_seconds"), out.get("train_phase_update_seconds")
    if gen is not None and update is not None and gen + update > 0:
        out[GENERATE_FRACTION] = gen / (gen + update)
    return step, out


class VerlLogTail:
    """Follows verl's file logger and hands out the newest signals with the job's labels."""

    def __init__(
        self,
        path: Path,
        *,
        job: str,
        role: str = "trainer",
        rank: int = 0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        import time

        self.path = Path(path)
        self.labels = {"job": job, "role": role, "rank": str(rank)}
        self._clock = clock or time.time
        self._lines = AppendedLines(self.path, _MAX_READ)
        self._latest: dict[str, float] = {}
        self.step: int | None = None  # the newest step verl logged
        self.bad_lines = 0
        self._warned = False

    def poll(self) -> None:
        """Read what was appended since the last call."""
        for line in self._lines.read()[0]:
            self._consume(line)

    def _consume(self, line: bytes) -> None:
        try:
            step, signals = parse_line(line)
        except VerlLineInvalid as exc:
            self.bad_lines += 1
            if not self._warned:
                self._warned = True
                log.warning("verl log %s: skipping a line that is not verl's (%s)", self.path, exc)
            return
        self._latest.update(signals)
        self.step = step

    def collect(self) -> list[dict[str, Any]]:
        """The newest value of each signal as samples (after reading new lines)."""
        self.poll()
        now = self._clock()
        return [
            {"name": name, "value": value, "ts": now, "labels": dict(self.labels)}
            for name, value in sorted(self._latest.items())
        ]
