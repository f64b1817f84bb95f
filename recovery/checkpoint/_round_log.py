"""The coordinator's log of aborted rounds, bounded.

While a participant is out (a killed rank, a partition), a round aborts every round timeout for
as long as the outage lasts: a warning per round (every 5 s by default) buried the log an
operator reads during the incident. The first abort of a streak is a warning with its reason;
the next ones are debug lines, summed up in one warning per ``SUMMARY_EVERY_S`` while the
streak lasts; the round that commits after a streak says how many aborted before it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

SUMMARY_EVERY_S = 60.0


class AbortStreak:
    def __init__(
        self, log: logging.Logger, clock: Callable[[], float], *, every_s: float = SUMMARY_EVERY_S
    ) -> None:
        self.log = log
        self.clock = clock
        self.every_s = every_s
        self.count = 0  # aborted rounds since the last commit
        self._first: object = None
        self._since = 0.0
        self._summed_at = 0.0

    def aborted(self, round_id: object, reason: object) -> None:
        now = self.clock()
        self.count += 1
        if self.count == 1:
            self._first, self._since, self._summed_at = round_id, now, now
            self.log.warning("round %s aborted: %s", round_id, reason)
            return
        self.log.debug("round %s aborted: %s", round_id, reason)
        if now - self._summed_at >= self.every_s:
            self._summed_at = now
            self.log.warning(
                "%d rounds aborted since round %s (%.0f s ago); the last, round %s: %s",
                self.count,
                self._first,
                now - self._since,
                round_id,
                reason,
            )

    def committed(self, round_id: object, version: object) -> None:
        if self.count:
            self.log.warning(
                "round %s committed: global version %s, after %d aborted rounds since round %s "
                "(%.0f s)",
                round_id,
                version,
                self.count,
                self._first,
                self.clock() - self._since,
            )
        else:
            self.log.info("round %s committed: global version %s", round_id, version)
        self.count = 0
