"""Where logged generations live: one :class:`recovery.wal.WriteAheadLog` per rank.

A generation batch is one WAL entry (:attr:`~recovery.wal.StepType.GENERATE`) whose data file
holds the batch (``torch.save`` of a dict, checksummed by the WAL). Its id is its key,
``gen-<global step, 8 digits>-<generation index, 3 digits>``, with ``-r<n>`` added when an
earlier entry of that key could not be reused and the batch was generated again. Entries go
PENDING (logged, durable) -> COMPLETED (the last step that consumes the batch is committed) or
FAILED (found unusable, with the reason); COMPLETED ones are compacted away with their files.

What this module guarantees about a damaged log: a record torn by a kill is dropped by the WAL
when it is opened (its CRC), and a data file whose SHA-256 does not match its record raises
:class:`recovery.wal.WALDataError` in :meth:`GenerationStore.read`: neither is ever returned as
a batch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from integrations import IntegrationError
from recovery.wal import StepType, WALEntry, WALError, WALStatus, WriteAheadLog

ENTRY_PREFIX = "gen-"
_ID_RE = re.compile(r"^gen-(\d{8})-(\d{3})(?:-r(\d+))?$")
# COMPLETED entries (and their data files) are dropped once this many have piled up: a few
# hundred kilobytes of completions at the example's full size, one compaction per ~32 steps.
COMPACT_EVERY = 32


@dataclass(frozen=True)
class Cadence:
    """How TRL's micro-steps (``GRPOTrainer._step``, one per ``training_step``) map to optimizer
    steps and generations: a generation at every ``steps_per_generation x num_iterations``
    micro-steps, an optimizer step at every ``gradient_accumulation_steps``."""

    grad_accum: int
    steps_per_generation: int
    num_iterations: int

    @property
    def generate_every(self) -> int:
        return self.steps_per_generation * self.num_iterations

    def generation_start(self, micro_step: int) -> int:
        """The micro-step at which the generation serving ``micro_step`` was made."""
        return micro_step - micro_step % self.generate_every

    def key(self, micro_step: int) -> tuple[int, int]:
        """``(global step, generation index)`` of a generation made at ``micro_step``: the
        optimizer step it is made in (1-based, as ``state.global_step`` after that step) and
        its micro-step within that step."""
        return micro_step // self.grad_accum + 1, micro_step % self.grad_accum

    def micro_step(self, step: int, index: int) -> int:
        """The inverse of :meth:`key`."""
        return (step - 1) * self.grad_accum + index

    def last_step(self, step: int, index: int) -> int:
        """The last optimizer step that consumes the generation ``(step, index)``: once it is
        committed, no resume needs that generation again."""
        last_micro = self.micro_step(step, index) + self.generate_every - 1
        return last_micro // self.grad_accum + 1


def entry_id(step: int, index: int, attempt: int = 0) -> str:
    """The WAL entry id of attempt ``attempt`` at the generation ``(step, index)``."""
    base = f"{ENTRY_PREFIX}{step:08d}-{index:03d}"
    return base if attempt == 0 else f"{base}-r{attempt}"


def parse_entry_id(text: str) -> tuple[int, int, int] | None:
    """``(step, index, attempt)`` of an entry id made by :func:`entry_id`, else None."""
    match = _ID_RE.match(text)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


class GenerationStore:
    """The generation batches of one rank in the WAL at ``directory`` (see the module
    docstring). Raises :class:`IntegrationError` naming ``directory`` when it cannot be used
    (a file, unwritable, a log that does not open)."""

    def __init__(self, directory: Path, *, sync: bool = True, lock_timeout: float = 30.0) -> None:
        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise IntegrationError(
                f"the generation log directory {self.directory} is not a directory"
            )
        try:
            self.wal = WriteAheadLog(self.directory, sync=sync, lock_timeout=lock_timeout)
        except WALError as exc:
            raise IntegrationError(
                f"the generation log directory {self.directory} cannot be used: {exc}"
            ) from exc
        self._completed_since_compact = 0

    def _attempts(self, step: int, index: int) -> list[WALEntry]:
        base = entry_id(step, index)
        return [
            e
            for e in self.wal.entries()
            if e.entry_id == base or e.entry_id.startswith(base + "-r")
        ]

    def latest(self, step: int, index: int) -> WALEntry | None:
        """The newest entry logged for ``(step, index)``, whatever its status."""
        attempts = self._attempts(step, index)
        return attempts[-1] if attempts else None

    def log(self, step: int, index: int, data: bytes) -> WALEntry:
        """Log the batch ``data`` of ``(step, index)`` (PENDING); returns once it is durable."""
        attempts = self._attempts(step, index)
        attempt = 0
        if attempts:
            parsed = parse_entry_id(attempts[-1].entry_id)
            attempt = (parsed[2] if parsed else len(attempts)) + 1
        return self.wal.append(entry_id(step, index, attempt), StepType.GENERATE, data=data)

    def read(self, entry: WALEntry) -> bytes:
        """The batch of ``entry``, checked against its checksum (:class:`WALDataError` if not)."""
        return self.wal.read_data(entry.entry_id)

    def fail(self, entry: WALEntry, reason: str) -> None:
        """Mark ``entry`` FAILED: it is never offered again."""
        if entry.status is not WALStatus.COMPLETED:
            self.wal.update_status(entry.entry_id, WALStatus.FAILED, error=reason)

    def pending(self) -> list[WALEntry]:
        """Every PENDING or EXECUTING generation entry, in the order they were logged."""
        return [e for e in self.wal.recover() if e.status is not WALStatus.FAILED]

    def complete(self, entries: list[str]) -> None:
        """Mark ``entries`` COMPLETED with one record; compact now and then."""
        if not entries:
            return
        self.wal.update_many([(eid, WALStatus.COMPLETED) for eid in entries])
        self._completed_since_compact += len(entries)
        if self._completed_since_compact >= COMPACT_EVERY:
            self.wal.compact()
            self._completed_since_compact = 0

    def close(self) -> None:
        """Release the log's files."""
        self.wal.close()
