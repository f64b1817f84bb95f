"""The shared sync state of the write-ahead log, and the boot id that tells when it is stale.

Two locks (:class:`recovery._process_lock.ProcessLock`) coordinate writers. The *append* lock serializes writing records (it is held for a
few microseconds per record). The *sync* lock elects the one writer that runs ``fdatasync``
for everybody: it is held for the length of one fsync, while the others keep appending. Which
bytes are known durable is kept in a small file mapped into every process (``wal.state``), so a
writer that waited for the sync lock can see that the previous leader's fsync already covered
its record and return without an fsync of its own (group commit).
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

from recovery.pids import process_exists
from recovery.wal._futex import SharedCounter


def read_boot_id() -> bytes:
    """16 bytes naming the current boot of this machine (zeros where Linux's id is missing).

    The shared state describes page-cache contents; after a reboot it is meaningless, and the
    boot id lets the first opener notice that and rebuild it from a scan.
    """
    try:
        text = Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
        return bytes.fromhex(text.replace("-", ""))[:16].ljust(16, b"\0")
    except (OSError, ValueError):
        return bytes(16)


_STATE_MAGIC = b"RLGWAL02"
# magic, boot id, generation, write segment, write end, zeroed end (little-endian, offset 0)
_STATE = struct.Struct("<8s16sQQQQ")
_POSITION = struct.Struct("<QQ")
_POSITION_OFFSET = 32
_ZEROED = struct.Struct("<Q")
_ZEROED_OFFSET = 48
# The durable mark is one native, 8-byte-aligned word (segment << 32 | offset): CPython copies
# a native "Q" with one memcpy, which is a single load/store on x86-64 and AArch64, so a
# waiter may read it without the sync lock and never sees half of an update.
_DURABLE = struct.Struct("Q")
_DURABLE_OFFSET = 64
_SYNC_COUNTER_OFFSET = 72
_APPEND_COUNTER_OFFSET = 76
# Group-commit bookkeeping. It only steers how long a sync leader waits for more records,
# never what counts as durable: records written (changed under the append lock), records the
# durable mark covers and the mean fdatasync time in microseconds (under the sync lock), a flag
# "a leader is gathering" and one slot per open handle (pid, calls in flight) that only the
# handle's own process writes.
_WRITTEN = struct.Struct("<Q")
_WRITTEN_OFFSET = 80
_SYNCED = struct.Struct("<QI")
_SYNCED_OFFSET = 88
_GATHERING = struct.Struct("<I")
_GATHERING_OFFSET = 100
_GATHER_COUNTER_OFFSET = 104
_SLOT = struct.Struct("<II")
_SLOTS_OFFSET = 512
SLOT_COUNT = 64
_SLOTS = struct.Struct(f"<{2 * SLOT_COUNT}I")
_OFFSET_BITS = 32
MAX_SEGMENT_OFFSET = (1 << _OFFSET_BITS) - 1
STATE_FILE_BYTES = 4096


class SharedState:
    """The log's shared positions, in a file mapped by every process that has the log open.

    * ``write_seg``/``write_end``: where the next record goes; changed only under the append
      lock, after a record was completely written, so every byte before it is whole records.
    * the zeroed end: the write segment holds zeros from ``write_end`` up to here, on stable
      storage with the file size that covers them (preallocated space); changed only under the
      append lock.
    * the durable mark (segment, offset): everything up to it is known to be on stable
      storage; raised only under the sync lock, and only after an fsync returned.
    * ``generation``: bumped when segments are replaced (compaction, repair), telling other
      processes to re-read the log from scratch.
    * group-commit bookkeeping (:meth:`count_records`, :meth:`note_sync`, the slots): how
      many records wait for a sync, how many write calls are in flight, how long a sync takes.
    """

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        if os.fstat(self._fd).st_size < STATE_FILE_BYTES:
            os.ftruncate(self._fd, STATE_FILE_BYTES)
        self._map = mmap.mmap(self._fd, STATE_FILE_BYTES, mmap.MAP_SHARED)
        #: Bumped after the sync lock is released (the durable mark may have moved).
        self.sync_released = SharedCounter(self._map, _SYNC_COUNTER_OFFSET)
        #: Bumped after the append lock is released.
        self.append_released = SharedCounter(self._map, _APPEND_COUNTER_OFFSET)
        #: Bumped when a gathering sync leader has everything it waits for (see
        #: :meth:`nudge_gatherer`).
        self.gather_done = SharedCounter(self._map, _GATHER_COUNTER_OFFSET)

    def _unpack(self) -> tuple[bytes, bytes, int, int, int, int]:
        values: tuple[bytes, bytes, int, int, int, int] = _STATE.unpack_from(self._map, 0)
        return values

    def is_valid_for(self, boot_id: bytes) -> bool:
        """True if the state was written during this boot (else it must be rebuilt)."""
        magic, boot, *_ = self._unpack()
        return magic == _STATE_MAGIC and boot == boot_id

    def reset(self, boot_id: bytes, generation: int, seg: int, end: int, zeroed: int) -> None:
        """Rewrite the whole state: next write and durable mark both at ``(seg, end)``."""
        _STATE.pack_into(self._map, 0, _STATE_MAGIC, boot_id, generation, seg, end, zeroed)
        _DURABLE.pack_into(self._map, _DURABLE_OFFSET, _pack(seg, end))
        _WRITTEN.pack_into(self._map, _WRITTEN_OFFSET, 0)
        _SYNCED.pack_into(self._map, _SYNCED_OFFSET, 0, 0)
        _GATHERING.pack_into(self._map, _GATHERING_OFFSET, 0)

    def count_records(self, written: int) -> None:
        """Count ``written`` more records written (caller holds the append lock)."""
        (count,) = _WRITTEN.unpack_from(self._map, _WRITTEN_OFFSET)
        _WRITTEN.pack_into(self._map, _WRITTEN_OFFSET, count + written)

    def records_written(self) -> int:
        """How many records were written since the log was opened by the first process."""
        (count,) = _WRITTEN.unpack_from(self._map, _WRITTEN_OFFSET)
        return int(count)

    def sync_record(self) -> tuple[int, float]:
        """(records the durable mark covers, mean seconds of an fdatasync so far)."""
        synced, micros = _SYNCED.unpack_from(self._map, _SYNCED_OFFSET)
        return int(synced), micros / 1e6

    def note_sync(self, records: int, seconds: float) -> None:
        """After an fdatasync that covered the first ``records`` records and took ``seconds``
        (caller holds the sync lock)."""
        synced, micros = _SYNCED.unpack_from(self._map, _SYNCED_OFFSET)
        sample = seconds * 1e6
        micros = sample if micros == 0 else 0.8 * micros + 0.2 * sample
        _SYNCED.pack_into(
            self._map, _SYNCED_OFFSET, max(synced, records), min(int(micros), 0xFFFFFFFF)
        )

    @property
    def gathering(self) -> bool:
        """True while a sync leader waits for the calls in flight to write their records."""
        (flag,) = _GATHERING.unpack_from(self._map, _GATHERING_OFFSET)
        return bool(flag)

    @gathering.setter
    def gathering(self, value: bool) -> None:
        _GATHERING.pack_into(self._map, _GATHERING_OFFSET, int(value))

    def batch_complete(self) -> bool:
        """True when every write call in flight has written its record (none is still on
        its way), so a sync now covers all of them."""
        (written,) = _WRITTEN.unpack_from(self._map, _WRITTEN_OFFSET)
        (synced, _) = _SYNCED.unpack_from(self._map, _SYNCED_OFFSET)
        return bool(written - synced >= self.calls_in_flight())

    def nudge_gatherer(self) -> None:
        """Wake a gathering sync leader if what it waits for is complete (called after a
        record was written or a write call finished). Costs one read when nobody gathers."""
        if self.gathering and self.batch_complete():
            self.gather_done.bump_and_wake()

    def claim_slot(self, pid: int) -> int | None:
        """A free slot for one handle of process ``pid`` (append lock held), or None if all
        are taken. A slot of a process that no longer exists is free."""
        values = _SLOTS.unpack_from(self._map, _SLOTS_OFFSET)
        for slot in range(SLOT_COUNT):
            owner = values[2 * slot]
            if owner == 0 or not process_exists(owner):
                _SLOT.pack_into(self._map, _SLOTS_OFFSET + slot * _SLOT.size, pid, 0)
                return slot
        return None

    def set_slot(self, slot: int, pid: int, in_flight: int) -> None:
        """Publish how many write calls the handle owning ``slot`` has in flight."""
        _SLOT.pack_into(self._map, _SLOTS_OFFSET + slot * _SLOT.size, pid, in_flight)

    def calls_in_flight(self) -> int:
        """Write calls in flight in every handle with a slot."""
        values = _SLOTS.unpack_from(self._map, _SLOTS_OFFSET)
        return sum(values[1::2])

    def clear_slots(self) -> None:
        """Forget every slot (the state is from an earlier boot: its pids mean nothing)."""
        self._map[_SLOTS_OFFSET : _SLOTS_OFFSET + _SLOTS.size] = bytes(_SLOTS.size)

    def free_dead_slots(self) -> None:
        """Clear the slots of processes that were killed (their calls will never finish)."""
        values = _SLOTS.unpack_from(self._map, _SLOTS_OFFSET)
        for slot in range(SLOT_COUNT):
            owner = values[2 * slot]
            if owner and values[2 * slot + 1] and not process_exists(owner):
                _SLOT.pack_into(self._map, _SLOTS_OFFSET + slot * _SLOT.size, 0, 0)

    @property
    def generation(self) -> int:
        """Counter bumped whenever segment files are replaced."""
        return self._unpack()[2]

    def write_position(self) -> tuple[int, int]:
        """(segment, offset) where the next record will be written."""
        position: tuple[int, int] = _POSITION.unpack_from(self._map, _POSITION_OFFSET)
        return position

    def set_write_position(self, seg: int, end: int) -> None:
        """Record the next write position; caller holds the append lock."""
        _POSITION.pack_into(self._map, _POSITION_OFFSET, seg, end)

    def zeroed_end(self) -> int:
        """End of the zero-filled, durable space after the write position in its segment."""
        (zeroed,) = _ZEROED.unpack_from(self._map, _ZEROED_OFFSET)
        return int(zeroed)

    def set_zeroed_end(self, zeroed: int) -> None:
        """Record how far the write segment is preallocated; caller holds the append lock."""
        _ZEROED.pack_into(self._map, _ZEROED_OFFSET, zeroed)

    def durable_position(self) -> tuple[int, int]:
        """(segment, offset) up to which records are known durable; safe without a lock."""
        (word,) = _DURABLE.unpack_from(self._map, _DURABLE_OFFSET)
        return word >> _OFFSET_BITS, word & MAX_SEGMENT_OFFSET

    def advance_durable(self, seg: int, end: int) -> None:
        """Move the durable mark forward (never back); caller holds the sync lock."""
        if (seg, end) > self.durable_position():
            _DURABLE.pack_into(self._map, _DURABLE_OFFSET, _pack(seg, end))

    def bump_generation(self) -> int:
        """Increment and return the generation; caller holds both locks."""
        generation = self.generation + 1
        struct.pack_into("<Q", self._map, 24, generation)
        return generation

    def close(self) -> None:
        """Unmap and close the state file."""
        self.sync_released.detach()
        self.append_released.detach()
        self.gather_done.detach()
        self._map.close()
        os.close(self._fd)


def _pack(seg: int, end: int) -> int:
    if end > MAX_SEGMENT_OFFSET or seg >= 1 << (64 - _OFFSET_BITS):
        raise ValueError(f"WAL position ({seg}, {end}) does not fit the durable mark")
    return seg << _OFFSET_BITS | end
