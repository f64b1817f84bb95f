"""Which (node, agent, seq) batches were applied: a sliding anti-replay window per agent.

Agents number their batches 0, 1, 2, … and normally deliver them in order (the spool replays in
order), but a retry can overtake a newer batch. A plain high-water mark would then drop the older
batch as a "duplicate" and lose it, so, as in IPsec's anti-replay window, each agent keeps its
highest seq plus a bitmap of the ``WINDOW`` seqs just below it:

* ``seq > high``: new; the window slides up.
* ``high - WINDOW < seq <= high``: new unless its bit is set.
* ``seq <= high - WINDOW``: treated as already applied (too old to tell). An agent whose
  sequence restarts from zero must therefore use a new ``agent_id``.

The state is two integers, stored per agent in ``ingest_cursor`` in the same transaction as the
batch's durable effects (see ``app.ingest.pipeline``).
"""

from __future__ import annotations

from dataclasses import dataclass

WINDOW = 63  # bits 0..62 of a signed 64-bit column
_MASK = (1 << WINDOW) - 1


@dataclass(slots=True)
class DedupeWindow:
    high_seq: int = -1
    window_mask: int = 0

    def seen(self, seq: int) -> bool:
        if seq > self.high_seq:
            return False
        offset = self.high_seq - seq
        if offset >= WINDOW:
            return True
        return bool(self.window_mask >> offset & 1)

    def mark(self, seq: int) -> bool:
        """Record ``seq``; returns False (and changes nothing) when it was already applied."""
        if seq < 0:
            raise ValueError(f"seq must be >= 0, got {seq}")
        if self.seen(seq):
            return False
        if seq > self.high_seq:
            shift = seq - self.high_seq
            self.window_mask = ((self.window_mask << shift) | 1) & _MASK if shift < WINDOW else 1
            self.high_seq = seq
        else:
            self.window_mask |= 1 << (self.high_seq - seq)
        return True

    def unmark(self, seq: int) -> None:
        """Forget ``seq`` (its batch was refused at commit) so a retry is applied again; a seq
        below the window stays seen, as every seq there does."""
        offset = self.high_seq - seq
        if 0 <= offset < WINDOW:
            self.window_mask &= ~(1 << offset)
